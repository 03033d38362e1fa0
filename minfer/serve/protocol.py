"""Request bodies in OpenAI's and vLLM's shapes, checked field by field, and the objects
answered (docs/serve.md lists every field).

Each check raises ApiError naming the field (`param`), so a bad request is a 400 with OpenAI's
error object, never a traceback. Unknown fields are ignored, as vLLM and OpenAI do; known ones
are checked strictly (no "5" for 5, no true for 1). Decoding is greedy: a request that asks for
sampling (temperature > 0, n > 1) is refused by name.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

try:  # (the serve extra's; without it every body takes the checked parse)
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

from minfer.batch.records import plain_ids
from minfer.reference.ops import TOP_MAX

MAX_PROMPTS = 1024  # prompts in one request (a list of strings or of token lists)
MAX_STOPS = 16


class ApiError(Exception):
    """An HTTP error answered as OpenAI's error object."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        405: "invalid_request_error",
        408: "timeout",
        413: "invalid_request_error",
        429: "rate_limit_error",
        431: "invalid_request_error",
        500: "server_error",
        503: "service_unavailable",
        504: "timeout",
    }

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param, "invalid_value" if param else None)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object; 400 for invalid JSON, duplicate keys, nesting too deep."""
    body = _parse_flat(raw)
    return body if body is not None else _parse_checked(raw)


def _parse_flat(raw: bytes) -> dict | None:
    """orjson's parse of the usual body (a flat object: one "{", no escapes), its keys each
    seen once in the text (else a duplicate may hide: None, as for anything unusual, and
    _parse_checked decides and words the error)."""
    if orjson is None or raw.count(b"{") != 1 or b"\\" in raw:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict:
        return None
    for k in body:
        if raw.count(b'"' + k.encode() + b'"') != 1:
            return None
    return body


def _parse_checked(raw: bytes) -> dict:

    def no_dupes(pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                raise bad(f"duplicate key {k!r} in the JSON body")
            d[k] = v
        return d

    try:
        body = json.loads(
            raw.decode("utf-8"), object_pairs_hook=no_dupes, parse_constant=_no_constant
        )
    except ApiError:
        raise
    except UnicodeDecodeError as e:
        raise bad(f"the body is not UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise bad("the JSON body is nested too deeply") from None
    except ValueError as e:
        raise bad(f"the body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise bad(f"the body must be a JSON object, not {_kind(body)}")
    return body


def _no_constant(name):
    raise bad(f"{name} is not a JSON number")


def _kind(v) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }.get(type(v), type(v).__name__)


# -- field checks -------------------------------------------------------------------------------
def get_int(body: dict, name: str, default, lo: int | None = None, hi: int | None = None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"{name} must be an integer, not {_kind(v)}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad(f"{name} must be {rng}, got {v}", name)
    return v


def get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{name} must be a boolean, not {_kind(v)}", name)
    return v


def get_number(body: dict, name: str):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"{name} must be a finite number, not {_kind(v)}", name)
    return float(v)


def get_str(body: dict, name: str, default=None):
    v = body.get(name, default)
    if v is not None and not isinstance(v, str):
        raise bad(f"{name} must be a string, not {_kind(v)}", name)
    return v


def check_greedy(body: dict) -> None:
    """Refuse what asks for sampling or what minfer does not do (by name, as a 400)."""
    t = get_number(body, "temperature")
    if t is not None and t != 0:
        raise bad(f"temperature {t:g}: minfer decodes greedily; use temperature 0", "temperature")
    if get_int(body, "n", 1, 1) != 1:
        raise bad("n must be 1 (greedy decoding gives one answer)", "n")
    if get_int(body, "best_of", 1, 1) != 1:
        raise bad("best_of must be 1 (greedy decoding gives one answer)", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_number(body, name)
        if v not in (None, 0.0):
            raise bad(f"{name} is not supported (greedy decoding); send 0 or omit it", name)
    for name in ("top_p",):
        v = get_number(body, name)
        if v is not None and not 0 < v <= 1:
            raise bad(f"{name} must be in (0, 1], got {v:g}", name)
    lb = body.get("logit_bias")
    if lb not in (None, {}):
        raise bad("logit_bias is not supported", "logit_bias")
    if body.get("suffix") not in (None, ""):
        raise bad("suffix is not supported", "suffix")
    get_int(body, "seed", None)  # accepted and ignored: greedy needs no seed


def get_stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop: at most {MAX_STOPS} sequences, got {len(stops)}", "stop")
    return [s for s in stops if s]


def token_ids(v, vocab: int, param: str) -> list[int]:
    """A list of token ids: integers (not booleans) in [0, vocab); the prompt records'
    check (minfer.batch.records.check_ids), answered as a 400 naming `param`."""
    from minfer.batch.records import RecordError, check_ids

    if not v:
        return []
    try:
        return check_ids(v, param, vocab).tolist()
    except RecordError as e:
        raise bad(str(e), param) from None


def get_prompts(body: dict, vocab: int) -> list[tuple[str | None, list[int] | None]]:
    """`prompt` as OpenAI takes it: a string, a list of strings, a list of token ids, or a
    list of such lists -> [(text, None) or (None, ids)]."""
    p = body.get("prompt")
    if p is None:
        raise bad("prompt is required", "prompt")
    if isinstance(p, str):
        return [(p, None)]
    if not isinstance(p, list):
        raise bad(
            f"prompt must be a string, a list of strings or token ids, not {_kind(p)}", "prompt"
        )
    if not p:
        raise bad("prompt is an empty list", "prompt")
    if type(p[0]) is int and plain_ids(p, vocab) is not None:  # the usual token-id prompt
        return [(None, p)]  # (lm-eval's, bench-serve's): plain ints in range, checked once
    if all(isinstance(x, str) for x in p):
        out = [(x, None) for x in p]
    elif all(isinstance(x, list) for x in p):
        out = [(None, token_ids(x, vocab, f"prompt[{i}]")) for i, x in enumerate(p)]
    elif not any(isinstance(x, (str, list, dict)) for x in p):
        out = [(None, token_ids(p, vocab, "prompt"))]
    else:
        raise bad(
            "prompt: a list must hold only strings, only token ids, or only lists of token ids",
            "prompt",
        )
    if len(out) > MAX_PROMPTS:
        raise bad(f"prompt: at most {MAX_PROMPTS} prompts in one request, got {len(out)}", "prompt")
    return out


def get_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object, not {_kind(m)}", "messages")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise bad(f"messages[{i}].role must be a non-empty string", "messages")
        if isinstance(content, list):  # OpenAI's content parts: text parts only
            parts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise bad(f"messages[{i}].content: only text parts are supported", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string, not {_kind(content)}", "messages")
        out.append({"role": role, "content": content})
    return out


# -- responses ----------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


@dataclass
class Answer:
    """One prompt's outcome, gathered from the engine's events."""

    prompt_ids: list[int]
    prompt_text: str | None = None
    rows: object = None  # slots.Rows of the prompt (prompt_stats)
    tokens: list = field(default_factory=list)  # scheduler.Token
    finish: str | None = None
    text: str = ""  # the generated text, cut at a stop string


class Pieces:
    """Token texts and their lengths in characters, per vocabulary id, filled on first use
    (both at once: a known text means a known length): a scoring request reads 128-2,048 of
    them, so they are plain list / array lookups."""

    def __init__(self, tok):
        self.tok = tok
        self.texts: list[str | None] = [None] * tok.n_vocab
        self.nchars = np.full(tok.n_vocab, -1, np.int64)

    def fill(self, ids) -> None:
        """Every id of ids known (ids: ints in range, checked by the caller)."""
        for i in {int(i) for i in ids}:
            if self.texts[i] is None:
                self.texts[i] = self.tok.decode([i], special=True)
                # its UTF-8 lead bytes: a piece holding half a character adds its share once
                # the character is whole
                b = self.tok.token_bytes([i]) if i != self.tok.bos_id else b""
                self.nchars[i] = sum(1 for x in b if x & 0xC0 != 0x80)

    def text(self, i: int) -> str:
        return self.texts_of((i,))[0]

    def chars(self, i: int) -> int:
        """Characters token i adds to decoded text."""
        if self.texts[i] is None:
            self.fill((i,))
        return int(self.nchars[i])

    def texts_of(self, ids) -> list[str]:
        """The texts of a run of ids, the unknown ones filled first."""
        tx = self.texts
        out = [tx[i] for i in ids]
        if None in out:
            self.fill(i for i, t in zip(ids, out) if t is None)
            out = [tx[i] for i in ids]
        return out

    def many(self, ids: list[int]) -> tuple[list[str], list[int]]:
        """(texts, character offsets from 0) of a run of ids."""
        out = self.texts_of(ids)
        offs = np.zeros(len(ids), np.int64)
        if ids:
            np.cumsum(self.nchars[ids[:-1]], out=offs[1:])
        return out, offs.tolist()


def top_dict(pieces: Pieces, ids, lps, actual: int | None, actual_lp: float | None) -> dict:
    """{token text: log-prob} of the top ids, and the actual token's (vLLM's rule)."""
    d = {}
    if ids is not None:
        for i, lp in zip(ids, lps):
            d.setdefault(pieces.text(int(i)), float(lp))
    if actual is not None and actual_lp is not None:
        d.setdefault(pieces.text(actual), float(actual_lp))
    return d


def completion_logprobs(a: Answer, pieces: Pieces, echo: bool, top: int) -> dict:
    """OpenAI's legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset
    (over the echoed prompt first when echo; its first token has no log-prob: null).
    Written for speed (the host's share of a scoring request): plain lists, no numpy scalars."""
    toks, lps, tops, offs = [], [], [], []
    text, chars = pieces.text, pieces.chars
    off = 0
    if echo:
        ids = a.prompt_ids if type(a.prompt_ids) is list else [int(t) for t in a.prompt_ids]
        r = a.rows
        toks, offs = pieces.many(ids)
        off = offs[-1] + pieces.chars(ids[-1]) if ids else 0
        lps = [None] + r.logprob.tolist()
        tops = [None] * len(ids)
        if top == 1 and len(ids) > 1:  # lm-eval's: {top token: lp} and the actual one's
            tt = pieces.texts_of(r.top_ids[:, 0].tolist())
            tops[1:] = [
                {s: lt} if s == t else {s: lt, t: la}
                for s, lt, t, la in zip(tt, r.top_lp[:, 0].tolist(), toks[1:], lps[1:])
            ]
        elif top:
            tid, tlp = r.top_ids[:, :top].tolist(), r.top_lp[:, :top].tolist()
            for p in range(1, len(ids)):
                d = {}
                for i, lp in zip(tid[p - 1], tlp[p - 1]):
                    d.setdefault(text(i), lp)
                d.setdefault(toks[p], lps[p])
                tops[p] = d
        else:
            for p in range(1, len(ids)):
                tops[p] = {toks[p]: lps[p]}
        if a.prompt_text is not None:  # offsets into the text as sent
            off = len(a.prompt_text)
    for t in a.tokens:
        toks.append(text(t.id))
        offs.append(off)
        off += chars(t.id)
        lps.append(t.logprob)
        tops.append(
            top_dict(pieces, t.top_ids if top else None, t.top_lp if top else None, t.id, t.logprob)
        )
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


def chat_logprobs(tokens, pieces: Pieces, top: int) -> dict:
    """The chat API's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def entry(i: int, lp: float) -> dict:
        s = pieces.text(int(i))
        return {"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8"))}

    content = []
    for t in tokens:
        e = entry(t.id, t.logprob)
        e["top_logprobs"] = (
            [entry(i, lp) for i, lp in zip(t.top_ids, t.top_lp)]
            if top and t.top_ids is not None
            else []
        )
        content.append(e)
    return {"content": content}


def usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """text up to the first stop string (excluded), and whether one was met."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def stop_checker(tok, stops) -> Callable[[list[int]], bool] | None:
    """A Job's stop_check for the stop strings (None: none). Here, not in app.py, because the
    engine process (serve/engine_proc.py) rebuilds it from the strings with its own tokenizer:
    a closure does not cross the pipe."""
    if not stops:
        return None
    stops = list(stops)
    longest = max(len(x) for x in stops)

    def stop_check(gen: list[int]) -> bool:
        # checked after every token, so a new stop string ends in the newest token's text:
        # a tail that long is enough (grown by doubling), never the whole answer each token
        need, k = longest + len(tok.decode(gen[-1:])), 16
        while True:
            text = tok.decode(gen[-k:])
            if cut_at_stop(text, stops)[1]:
                return True
            if k >= len(gen) or len(text) >= need + 4:
                return False
            k *= 2

    return stop_check


def as_float32_list(a) -> list[float]:
    return [float(x) for x in np.asarray(a, np.float32)]
