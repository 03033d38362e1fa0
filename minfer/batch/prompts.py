"""A prompt file (`minfer prefill --prompts FILE`): parsed, validated and tokenized line by line,
in two passes over the same bytes, one line in memory at a time.

Formats (docs/batch.md, "Prompt files"):
- `jsonl`: one JSON value a line: a string (the prompt), or an object with exactly one of
  "prompt" (a string) and "messages" (a non-empty list of {"role": str, "content": str},
  rendered through the model's chat template), and an optional "id" (a string or an integer;
  default: the prompt's 0-based index). Blank lines (JSON whitespace only) are skipped; they
  still count in line numbers.
- `lines`: every line is a prompt, as plain text (one "\\r" before the "\\n" is dropped); an
  empty line is an empty prompt, refused (a final "\\n" only ends the last line).

Pass 1 (PromptSource.scan) refuses, naming the line number, in one BadInput (exit 2): invalid
UTF-8, a NUL byte (or a \\u0000 escape in a prompt, a message or an "id"), a lone surrogate
escape there (the results are UTF-8), invalid JSON (duplicate keys and NaN included), a value of
the wrong type or shape, an unknown key, a bad "messages" list, a line over the byte cap
(fileio.prompt_cap of the context), an empty prompt, a prompt of 0 tokens, a prompt whose tokens
plus the generated ones exceed the context; and a file with no prompt at all. It returns the
token counts, so a runner can plan its batches before any GPU work. Pass 2 (iterating the source)
yields the prompts in order and refuses a file that changed in between.
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from minfer.batch.reader import LineReader, open_input
from minfer.errors import BadInput
from minfer.host.fileio import prompt_cap

FORMATS = ("jsonl", "lines")
Encode = Callable[[str | None, list | None], list[int]]
_JSON_SPACE = b" \t\r"  # with "\n", JSON's whitespace: a jsonl line of only these is blank


@dataclass(frozen=True, eq=False)
class Prompt:
    """One prompt of the file (eq=False: ids is an array; compare fields)."""

    index: int        # 0-based position among the prompts
    line: int         # 1-based line number in the file
    id: object        # the line's "id" (str or int) if given, else `index`
    ids: np.ndarray   # int32 token ids (read-only), chat template applied for "messages"


class _LineError(Exception):
    """What is wrong with one line; the source adds the file name and line number."""


def _kind(v) -> str:
    if isinstance(v, bool):
        return "a boolean"
    return {str: "a string", int: "a number", float: "a number", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _text(s: str, what: str) -> str:
    """`s` if it can be a prompt's text (no NUL, no lone surrogate), else _LineError."""
    if "\x00" in s:
        raise _LineError(f"{what} holds a NUL character (\\u0000)")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _LineError(f"{what} is not valid Unicode (a lone surrogate "
                         f"\\u{ord(s[e.start]):04x})") from None
    return s


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _LineError(f"invalid JSON (key {json.dumps(k, ensure_ascii=False)} appears "
                             "twice in an object)")
        out[k] = v
    return out


def _no_constant(name):
    raise _LineError(f"invalid JSON ({name} is not a JSON number)")


def _messages(v) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise _LineError(f'"messages" must be a non-empty array of {{"role", "content"}} '
                         f"objects, not {'an empty array' if v == [] else _kind(v)}")
    for i, m in enumerate(v):
        where = f'"messages"[{i}]'
        if not isinstance(m, dict):
            raise _LineError(f'{where} must be an object {{"role", "content"}}, not {_kind(m)}')
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise _LineError(f"{where}: unknown key {json.dumps(extra[0], ensure_ascii=False)} "
                             '(a message has "role" and "content")')
        for k in ("role", "content"):
            if k not in m:
                raise _LineError(f'{where} has no "{k}"')
            if not isinstance(m[k], str):
                raise _LineError(f'{where}: "{k}" must be a string, not {_kind(m[k])}')
            _text(m[k], f'{where} "{k}"')
        if not m["role"]:
            raise _LineError(f'{where}: "role" is empty')
    return v


def parse_line(raw: bytes, fmt: str) -> tuple[object, str | None, list | None] | None:
    """(id or None, text, messages) of one line (exactly one of text and messages is set);
    None for a blank jsonl line. _LineError names what is wrong."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise _LineError(f"a NUL byte at byte offset {nul} of the line")
    if fmt == "jsonl" and not raw.strip(_JSON_SPACE):
        return None
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _LineError(f"invalid UTF-8 at byte offset {e.start} of the line "
                         f"(byte 0x{raw[e.start]:02x})") from None
    if fmt == "lines":
        s = s[:-1] if s.endswith("\r") else s
        if not s:
            raise _LineError("an empty line is an empty prompt (--prompts-format lines: every "
                             "line is a prompt)")
        return None, _text(s, "the prompt"), None
    try:
        v = json.loads(s, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise _LineError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise _LineError("invalid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise _LineError(f"invalid JSON ({e})") from None
    if isinstance(v, str):
        v = {"prompt": v}
    if not isinstance(v, dict):
        raise _LineError('expected a JSON string or an object with "prompt" or "messages", '
                         f"got {_kind(v)}")
    extra = sorted(set(v) - {"prompt", "messages", "id"})
    if extra:
        raise _LineError(f"unknown key {json.dumps(extra[0], ensure_ascii=False)} (a line has "
                         '"prompt" or "messages", and optionally "id")')
    if ("prompt" in v) == ("messages" in v):
        raise _LineError('an object needs exactly one of "prompt" and "messages"'
                         + (", not both" if "prompt" in v else ""))
    pid = v.get("id")
    if "id" in v and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
        raise _LineError(f'"id" must be a string or an integer, not {_kind(pid)}')
    if isinstance(pid, str):  # echoed in the UTF-8 results: a lone surrogate cannot be written
        _text(pid, '"id"')
    if "messages" in v:
        return pid, None, _messages(v["messages"])
    text = v["prompt"]
    if not isinstance(text, str):
        raise _LineError(f'"prompt" must be a string, not {_kind(text)}')
    if not text:
        raise _LineError("the prompt is empty")
    return pid, _text(text, "the prompt"), None


class PromptSource:
    """The prompts of one input; a context manager (close() frees the file and any spool).
    scan() once, then iterate (any number of times) to get the prompts in order."""

    def __init__(self, reader: LineReader, fmt: str, encode: Encode):
        self._reader, self._fmt, self._encode = reader, fmt, encode
        self.name = reader.name
        self._scanned = None  # (cap, n_ctx, n_predict, fingerprint, lines, crcs, counts)

    # -- one line --------------------------------------------------------------------------
    def _fail(self, line: int, msg: str, cls: type[BadInput] = BadInput) -> BadInput:
        return cls(f"{self.name} line {line}: {msg}")

    def _parse(self, line: int, raw: bytes):
        try:
            return parse_line(raw, self._fmt)
        except _LineError as e:
            raise self._fail(line, str(e)) from None

    def _tokens(self, line: int, text, messages, n_ctx: int, n_predict: int) -> np.ndarray:
        try:
            ids = self._encode(text, messages)
        except BadInput as e:  # BadModel too: a template that does not render
            raise self._fail(line, str(e), type(e)) from None
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        if ids.size == 0:
            raise self._fail(line, "the prompt is 0 tokens")
        if ids.size + n_predict > n_ctx:
            raise self._fail(line, f"prompt of {ids.size} tokens + {n_predict} generated tokens "
                                   f"= {ids.size + n_predict} exceeds the context of {n_ctx}")
        ids.flags.writeable = False
        return ids

    def _changed(self) -> BadInput:
        return BadInput(f"{self.name}: the prompt file changed while it was read (between "
                        "the check of every line and the run); run again on a file that "
                        "stays put")

    # -- the two passes ----------------------------------------------------------------------
    def scan(self, n_ctx: int, n_predict: int) -> np.ndarray:
        """Pass 1: parse, validate and tokenize every line; int32 [n_prompts] token counts."""
        cap = prompt_cap(n_ctx)
        fp = self._reader.fingerprint()
        lines, crcs, counts = array("I"), array("I"), array("i")
        n = 0
        for n, raw in self._reader.lines(cap):
            rec = self._parse(n, raw)
            if rec is None:
                continue
            _, text, messages = rec
            counts.append(self._tokens(n, text, messages, n_ctx, n_predict).size)
            lines.append(n)
            crcs.append(zlib.crc32(raw))
        if not counts:
            raise BadInput(f"{self.name}: no prompts in the file ("
                           + ("only blank lines)" if n else "it is empty)"))
        if self._reader.fingerprint() != fp:
            raise self._changed()
        self._scanned = (cap, n_ctx, n_predict, fp, lines, crcs, counts)
        return np.frombuffer(counts, dtype=np.int32).copy()

    def __iter__(self) -> Iterator[Prompt]:
        """Pass 2: the prompts in order, equal to pass 1's (else BadInput: changed)."""
        if self._scanned is None:
            raise RuntimeError("PromptSource: scan() before iterating")
        cap, n_ctx, n_predict, fp, lines, crcs, counts = self._scanned
        return self._iterate(cap, n_ctx, n_predict, fp, lines, crcs, counts)

    def _iterate(self, cap, n_ctx, n_predict, fp, lines, crcs, counts) -> Iterator[Prompt]:
        if self._reader.fingerprint() != fp:
            raise self._changed()
        k, total = 0, len(counts)
        for n, raw in self._reader.lines(cap):
            if k < total and n == lines[k]:
                if zlib.crc32(raw) != crcs[k]:
                    raise self._changed()
                pid, text, messages = self._parse(n, raw)
                ids = self._tokens(n, text, messages, n_ctx, n_predict)
                if ids.size != counts[k]:
                    raise self._changed()
                yield Prompt(k, n, k if pid is None else pid, ids)
                k += 1
            elif raw.strip(_JSON_SPACE):  # blank in pass 1, a prompt now
                raise self._changed()
        if k != total or self._reader.fingerprint() != fp:
            raise self._changed()

    # -- context manager ---------------------------------------------------------------------
    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "PromptSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_prompts(path: str, fmt: str, encode: Encode) -> PromptSource:
    """The prompts of `path` ("-": standard input; it and a FIFO are first copied to a private
    temporary file) in format `fmt` ("jsonl" or "lines"); encode(text, messages) -> token ids
    is the caller's tokenizer (make_encoder), given exactly one of the two."""
    if fmt not in FORMATS:
        raise BadInput(f"--prompts-format {fmt!r}: not a prompt file format "
                       f"(choose from {', '.join(FORMATS)})")
    return PromptSource(open_input(path), fmt, encode)


def make_encoder(meta, tok, chat: bool | None, system: str | None,
                 special: bool) -> Encode:
    """encode(text, messages) for open_prompts. Text: plain completion through
    tok.encode(text, parse_special=special), or the chat template when `chat` is True or a
    `system` message is given (as `minfer prefill -p` does). Messages: always the chat
    template; `system` goes first when the list has no system message; a list ending with
    an assistant message is rendered as it stands (no new assistant turn: score that answer),
    any other gets the template's generation prompt. BadInput without a template."""
    from minfer.text import chat as chat_mod

    if chat is False and system is not None:
        raise BadInput("--system goes with --chat, not --no-chat")
    use_chat = chat is True or (chat is None and system is not None)
    if use_chat and not chat_mod.has_template(meta):
        raise BadInput("--chat: this model has no tokenizer.chat_template in its GGUF "
                       "metadata; give the prompts as plain text (--no-chat) or name a "
                       "template (--chat-template chatml|llama3|gemma|phi3|mistral|FILE)")

    def encode(text: str | None, messages: list | None) -> list[int]:
        if (text is None) == (messages is None):
            raise TypeError("encode(text, messages): give exactly one of the two")
        if messages is None:
            if use_chat:
                return chat_mod.encode(meta, tok, text, system, parse_special=special)
            return tok.encode(text, parse_special=special)
        if not chat_mod.has_template(meta):
            raise BadInput('a "messages" prompt needs the model\'s chat template '
                           "(tokenizer.chat_template in the GGUF), and this model has none: "
                           'give the prompt as "prompt" text')
        msgs = list(messages)
        if system is not None and not any(m["role"] == "system" for m in msgs):
            msgs = chat_mod.messages("", system)[:1] + msgs
        return chat_mod.encode_messages(meta, tok, msgs, special, '"messages"',
                                        add_generation_prompt=msgs[-1]["role"] != "assistant")

    return encode
