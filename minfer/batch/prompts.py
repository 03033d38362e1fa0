"""A prompt file (`minfer prefill --prompts FILE`): parsed, validated and tokenized line by line,
in two passes over the same bytes, one line in memory at a time.

Formats (docs/batch.md, "Prompt files"):
- `jsonl`: one JSON value a line: a string (the prompt), or an object with exactly one of
  "prompt" (a string or a list of token ids), "messages" (a non-empty list of {"role": str,
  "content": str}, rendered through the model's chat template) and "context" with
  "continuation" (a continuation to score), and an optional "id" (a string or an integer;
  default: the prompt's 0-based index); minfer.batch.records checks them, as it checks the
  API's. Blank lines (JSON whitespace only) are skipped; they still count in line numbers.
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
from minfer.batch.records import (
    Record,
    RecordError,
    check_fits,
    check_record,
    check_text,
    record_ids,
)
from minfer.errors import BadInput
from minfer.host.fileio import prompt_cap

FORMATS = ("jsonl", "lines")
Encode = Callable[[str | None, list | None], list[int]]
_JSON_SPACE = b" \t\r"  # with "\n", JSON's whitespace: a jsonl line of only these is blank


@dataclass(frozen=True, eq=False)
class Prompt:
    """One prompt of the file (eq=False: ids is an array; compare fields)."""

    index: int  # 0-based position among the prompts
    line: int  # 1-based line number in the file
    id: object  # the line's "id" (str or int) if given, else `index`
    ids: np.ndarray  # int32 token ids (read-only), chat template applied for "messages"
    n_context: int | None = None  # a continuation record: the context's tokens, else None


def parse_line(raw: bytes, fmt: str, vocab: int | None = None) -> Record | None:
    """The checked record of one line (records.check_record; `lines`: its text); None for a
    blank jsonl line. RecordError names what is wrong."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise RecordError(f"a NUL byte at byte offset {nul} of the line")
    if fmt == "jsonl" and not raw.strip(_JSON_SPACE):
        return None
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(
            f"invalid UTF-8 at byte offset {e.start} of the line (byte 0x{raw[e.start]:02x})"
        ) from None
    if fmt == "lines":
        s = s[:-1] if s.endswith("\r") else s
        if not s:
            raise RecordError(
                "an empty line is an empty prompt (--prompts-format lines: every line is a prompt)"
            )
        return Record(text=check_text(s, "the prompt"))
    try:
        v = json.loads(s, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RecordError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise RecordError("invalid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise RecordError(f"invalid JSON ({e})") from None
    return check_record(v, vocab, bare_ids=False)


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise RecordError(
                f"invalid JSON (key {json.dumps(k, ensure_ascii=False)} appears twice in an object)"
            )
        out[k] = v
    return out


def _no_constant(name):
    raise RecordError(f"invalid JSON ({name} is not a JSON number)")


class PromptSource:
    """The prompts of one input; a context manager (close() frees the file and any spool).
    scan() once, then iterate (any number of times) to get the prompts in order."""

    def __init__(self, reader: LineReader, fmt: str, encode: Encode, vocab: int | None = None):
        self._reader, self._fmt, self._encode, self._vocab = reader, fmt, encode, vocab
        self.name = reader.name
        self._scanned = None  # (cap, n_ctx, n_predict, fingerprint, lines, crcs, counts)

    # -- one line --------------------------------------------------------------------------
    def _fail(self, line: int, msg: str, cls: type[BadInput] = BadInput) -> BadInput:
        return cls(f"{self.name} line {line}: {msg}")

    def _parse(self, line: int, raw: bytes) -> Record | None:
        try:
            return parse_line(raw, self._fmt, self._vocab)
        except RecordError as e:
            raise self._fail(line, str(e)) from None

    def _tokens(
        self, line: int, rec: Record, n_ctx: int, n_predict: int
    ) -> tuple[np.ndarray, int | None]:
        """(read-only int32 ids, n_context or None) of a record, or BadInput naming the line."""
        try:
            ids, first = record_ids(rec, self._encode)
            check_fits(ids.size, n_predict, n_ctx)
        except RecordError as e:
            raise self._fail(line, str(e)) from None
        except BadInput as e:  # BadModel too: a template that does not render
            raise self._fail(line, str(e), type(e)) from None
        ids.flags.writeable = False
        return ids, first

    def _changed(self) -> BadInput:
        return BadInput(
            f"{self.name}: the prompt file changed while it was read (between "
            "the check of every line and the run); run again on a file that "
            "stays put"
        )

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
            counts.append(self._tokens(n, rec, n_ctx, n_predict)[0].size)
            lines.append(n)
            crcs.append(zlib.crc32(raw))
        if not counts:
            raise BadInput(
                f"{self.name}: no prompts in the file ("
                + ("only blank lines)" if n else "it is empty)")
            )
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
                rec = self._parse(n, raw)
                ids, first = self._tokens(n, rec, n_ctx, n_predict)
                if ids.size != counts[k]:
                    raise self._changed()
                yield Prompt(k, n, k if rec.id is None else rec.id, ids, first)
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


def open_prompts(path: str, fmt: str, encode: Encode, vocab: int | None = None) -> PromptSource:
    """The prompts of `path` ("-": standard input; it and a FIFO are first copied to a private
    temporary file) in format `fmt` ("jsonl" or "lines"); encode(text, messages) -> token ids
    is the caller's tokenizer (make_encoder), given exactly one of the two; vocab: the model's,
    the bound of token ids given in a record (None: 2**31)."""
    if fmt not in FORMATS:
        raise BadInput(
            f"--prompts-format {fmt!r}: not a prompt file format (choose from {', '.join(FORMATS)})"
        )
    return PromptSource(open_input(path), fmt, encode, vocab)


class Encoder:
    """encode(text, messages) -> token ids (exactly one of the two given), and pair(context,
    continuation) -> (ids, n_context) for a scored continuation (make_encoder)."""

    def __init__(self, meta, tok, use_chat: bool, system: str | None, special: bool):
        self.meta, self.tok, self.chat, self.system, self.special = (
            meta,
            tok,
            use_chat,
            system,
            special,
        )

    def __call__(self, text: str | None, messages: list | None) -> list[int]:
        from minfer.text import chat as chat_mod

        meta, tok, system, special = self.meta, self.tok, self.system, self.special
        if (text is None) == (messages is None):
            raise TypeError("encode(text, messages): give exactly one of the two")
        if messages is None:
            if self.chat:
                return chat_mod.encode(meta, tok, text, system, parse_special=special)
            return tok.encode(text, parse_special=special)
        if not chat_mod.has_template(meta):
            raise BadInput(
                'a "messages" prompt needs the model\'s chat template '
                "(tokenizer.chat_template in the GGUF), and this model has none: "
                'give the prompt as "prompt" text'
            )
        msgs = list(messages)
        if system is not None and not any(m["role"] == "system" for m in msgs):
            msgs = chat_mod.messages("", system)[:1] + msgs
        return chat_mod.encode_messages(
            meta,
            tok,
            msgs,
            special,
            '"messages"',
            add_generation_prompt=msgs[-1]["role"] != "assistant",
        )

    def pair(self, context: str, continuation: str) -> tuple[list[int], int]:
        """(ids of context + continuation, n_context) as lm-eval's _encode_pair: the context's
        trailing whitespace moves to the continuation; the whole text and the context alone are
        encoded (BOS as the metadata says, never EOS), n_context = the context's token count,
        so the continuation's tokens are ids[n_context:] of the whole text's tokenization (a
        token across the boundary is the continuation's: docs/batch.md)."""
        if self.chat:
            raise BadInput(
                'a "context"/"continuation" pair is scored as plain text: not with '
                "--chat or --system (give a chat-rendered context as token ids)"
            )
        k = len(context) - len(context.rstrip())
        if k:
            context, continuation = context[:-k], context[-k:] + continuation
        enc = lambda t: self.tok.encode(t, parse_special=self.special, add_eos=False)  # noqa: E731
        return enc(context + continuation), len(enc(context))


def make_encoder(meta, tok, chat: bool | None, system: str | None, special: bool) -> Encoder:
    """The Encoder for open_prompts. Text: plain completion through
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
        raise BadInput(
            "--chat: this model has no tokenizer.chat_template in its GGUF "
            "metadata; give the prompts as plain text (--no-chat) or name a "
            "template (--chat-template chatml|llama3|gemma|phi3|mistral|FILE)"
        )
    return Encoder(meta, tok, use_chat, system, special)
