"""One prompt record's checks, shared by the prompt-file reader (a JSON line, minfer.batch.prompts)
and the Python API (Engine.prefill's prompts): what a record may hold, and one message for what
is wrong. The caller says where (`FILE line N: `, `prompts[i]: `).

A record is a dict of exactly one of
  "prompt":   text, or a list of token ids;
  "messages": a non-empty list of {"role": non-empty text, "content": text} (the chat template);
  "context" and "continuation": both text, or both lists of token ids (a scored continuation);
and optionally "id" (text or an integer). The API also takes a bare text or a bare list of ids.
Text: no NUL, no lone surrogate (results are UTF-8). Token ids: Python or numpy integers (not
bool, float, str or bytes) in [0, vocab).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

KEYS = ("prompt", "messages", "context", "continuation", "id")
FORMS = '"prompt", "messages", or "context" with "continuation"; and optionally "id"'


class RecordError(Exception):
    """What is wrong with one record; the caller adds where it is."""


@dataclass(frozen=True, eq=False)
class Record:
    """A checked record: exactly one of text, messages, ids, context (with continuation)."""

    id: object = None  # the "id" (str or int), None when not given
    text: str | None = None
    messages: list | None = None
    ids: np.ndarray | None = None  # int32 [n] token ids given as such
    context: str | np.ndarray | None = None  # text, or int32 ids (then continuation too)
    continuation: str | np.ndarray | None = None


def kind(v) -> str:
    """A value's kind in JSON's words (the API's Python values too)."""
    if isinstance(v, (bool, np.bool_)):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, (np.integer, np.floating)):
        return f"a numpy {v.dtype}"
    for t, name in (
        (str, "a string"),
        (bytes, "bytes"),
        (bytearray, "a bytearray"),
        (list, "an array"),
        (tuple, "a tuple"),
        (dict, "an object"),
        (np.ndarray, "an array"),
    ):
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__


def check_text(s, what: str) -> str:
    """`s` if it can be a prompt's text (a str, no NUL, no lone surrogate), else RecordError."""
    if not isinstance(s, str):
        raise RecordError(f"{what} must be a string, not {kind(s)}")
    if "\x00" in s:
        raise RecordError(f"{what} holds a NUL character (\\u0000)")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(
            f"{what} is not valid Unicode (a lone surrogate \\u{ord(s[e.start]):04x})"
        ) from None
    return s


def is_ids(v) -> bool:
    """A value that is meant as token ids (then check_ids says whether they are)."""
    return isinstance(v, (list, tuple, np.ndarray))


def plain_ids(v, hi: int) -> np.ndarray | None:
    """int64 [n] of v when it is the usual case, plain ints in [0, hi) (checked at numpy's
    speed), else None (the caller's loop names what is wrong)."""
    if not all(type(x) is int for x in v):  # (bool is not int here)
        return None
    try:
        a = np.array(v, np.int64)
    except OverflowError:  # an int past 64 bits
        return None
    return a if a.size == 0 or (a.min() >= 0 and a.max() < hi) else None


def check_ids(v, what: str, vocab: int | None) -> np.ndarray:
    """int32 [n] token ids of a list, tuple or 1-D array of integers in [0, vocab), n >= 1
    (vocab None: below 2**31), else RecordError naming the first bad one."""
    hi = (1 << 31) if vocab is None else int(vocab)
    if isinstance(v, np.ndarray) and v.dtype != object:
        if v.ndim != 1:
            raise RecordError(f"{what} must be a 1-D array of token ids, not {v.ndim}-D")
        if v.dtype.kind not in "iu":  # bool, float, str, complex: not token ids
            raise RecordError(f"{what}: token ids must be integers, not {v.dtype}")
        bad = np.flatnonzero((v < 0) | (v >= hi)) if v.size else []
        if len(bad):
            i = int(bad[0])
            raise RecordError(f"{what}[{i}]: token id {int(v[i])} out of range [0, {hi})")
        out = v.astype(np.int32)
    else:
        if not is_ids(v):
            raise RecordError(f"{what} must be a list of token ids, not {kind(v)}")
        fast = plain_ids(v, hi)
        for i, x in enumerate(v if fast is None else ()):  # else: name the first bad one
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise RecordError(
                    f"{what}[{i}]: a token id must be an integer, not "
                    f"{repr(x)[:40]} ({type(x).__name__})"
                )
            if not 0 <= int(x) < hi:  # a Python int of any size compares exactly
                raise RecordError(f"{what}[{i}]: token id {int(x)} out of range [0, {hi})")
        out = fast.astype(np.int32) if fast is not None else np.fromiter(map(int, v), np.int32)
    if out.size == 0:
        raise RecordError(f"{what} is empty (0 tokens)")
    return out


def check_messages(v) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise RecordError(
            f'"messages" must be a non-empty array of {{"role", "content"}} '
            f"objects, not {'an empty array' if v == [] else kind(v)}"
        )
    for i, m in enumerate(v):
        where = f'"messages"[{i}]'
        if not isinstance(m, dict):
            raise RecordError(f'{where} must be an object {{"role", "content"}}, not {kind(m)}')
        extra = sorted(map(str, set(m) - {"role", "content"}))
        if extra:
            raise RecordError(
                f"{where}: unknown key {json.dumps(extra[0], ensure_ascii=False)}"
                ' (a message has "role" and "content")'
            )
        for k in ("role", "content"):
            if k not in m:
                raise RecordError(f'{where} has no "{k}"')
            check_text(m[k], f'{where} "{k}"')
        if not m["role"]:
            raise RecordError(f'{where}: "role" is empty')
    return v


def check_id(pid):
    """A record's "id": a string (writable as UTF-8) or an integer (numpy's as int)."""
    if isinstance(pid, (bool, np.bool_)) or not isinstance(pid, (str, int, np.integer)):
        raise RecordError(f'"id" must be a string or an integer, not {kind(pid)}')
    return check_text(pid, '"id"') if isinstance(pid, str) else int(pid)


def _pair(ctx, cont, vocab):
    if isinstance(ctx, str) and isinstance(cont, str):
        check_text(ctx, '"context"')
        if not check_text(cont, '"continuation"'):
            raise RecordError('"continuation" is empty')
        return ctx, cont
    if is_ids(ctx) and is_ids(cont):
        return check_ids(ctx, '"context"', vocab), check_ids(cont, '"continuation"', vocab)
    raise RecordError(
        '"context" and "continuation" must both be strings or both lists of '
        f"token ids, not {kind(ctx)} and {kind(cont)}"
    )


def check_record(v, vocab: int | None, *, bare_ids: bool) -> Record:
    """The Record of a value: a string (the prompt), a dict (the forms above), or with
    bare_ids (the API) a list / tuple / 1-D array of token ids; else RecordError."""
    if isinstance(v, str):
        v = {"prompt": v}
    elif bare_ids and is_ids(v):  # the API's bare list of ids
        return Record(ids=check_ids(v, "token ids", vocab))
    elif not isinstance(v, dict):
        raise RecordError(
            (
                f"a prompt is a string, a list of token ids or a dict with {FORMS}"
                if bare_ids
                else 'expected a JSON string or an object with "prompt", "messages" or '
                '"context" and "continuation"'
            )
            + f", got {kind(v)}"
        )
    extra = sorted(map(str, set(v) - set(KEYS)))
    if extra:
        raise RecordError(
            f"unknown key {json.dumps(extra[0], ensure_ascii=False)} (a record has {FORMS})"
        )
    pair = ("context" in v) + ("continuation" in v)
    if pair == 1:
        raise RecordError(
            '"context" and "continuation" go together: '
            f'"{"continuation" if "context" in v else "context"}" is missing'
        )
    forms = ("prompt" in v) + ("messages" in v) + (pair == 2)
    if forms != 1:
        raise RecordError(
            f"a record needs exactly one of {FORMS.split(';')[0]}" + (", not two" if forms else "")
        )
    pid = check_id(v["id"]) if "id" in v else None
    if "messages" in v:
        return Record(pid, messages=check_messages(v["messages"]))
    if pair:
        ctx, cont = _pair(v["context"], v["continuation"], vocab)
        return Record(pid, context=ctx, continuation=cont)
    p = v["prompt"]
    if is_ids(p):
        return Record(pid, ids=check_ids(p, '"prompt"', vocab))
    if not isinstance(p, str):
        raise RecordError(f'"prompt" must be a string or a list of token ids, not {kind(p)}')
    if not p:
        raise RecordError("the prompt is empty")
    return Record(pid, text=check_text(p, "the prompt"))


def record_ids(rec: Record, encode) -> tuple[np.ndarray, int | None]:
    """(int32 [n] prompt ids, n_context: the context's tokens for a continuation, else None).
    encode(text, messages) -> ids; encode.pair(context, continuation) -> (whole ids, n_context)
    for text pairs (prompts.Encoder). RecordError for 0 tokens; BadInput from encode as is."""
    first = None
    if rec.ids is not None:
        ids = rec.ids
    elif rec.text is not None or rec.messages is not None:
        ids = encode(rec.text, rec.messages)
    elif isinstance(rec.context, str):
        pair = getattr(encode, "pair", None)
        if pair is None:
            raise RecordError('"context"/"continuation" text needs the model\'s tokenizer')
        ids, first = pair(rec.context, rec.continuation)
        if first < 1:
            raise RecordError(
                "the context is 0 tokens (this model adds no BOS): give a non-empty context"
            )
        if len(ids) <= first:
            raise RecordError(
                f"the continuation is 0 tokens: the whole text is {len(ids)} "
                f"tokens, the context alone {first} (a token across the boundary "
                "takes it: docs/batch.md)"
            )
    else:
        ids, first = np.concatenate([rec.context, rec.continuation]), len(rec.context)
    ids = np.asarray(ids, dtype=np.int32).reshape(-1)
    if ids.size == 0:
        raise RecordError("the prompt is 0 tokens")
    return ids, first


def check_fits(n: int, n_predict: int, n_ctx: int) -> None:
    """RecordError for a prompt of n tokens whose n_predict generated ones pass the context."""
    if n + n_predict > n_ctx:
        raise RecordError(
            f"prompt of {n} tokens + {n_predict} generated tokens = "
            f"{n + n_predict} exceeds the context of {n_ctx}"
        )
