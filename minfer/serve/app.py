"""The ASGI app: OpenAI's and vLLM's endpoints over the scheduler (docs/serve.md).

The event loop only parses, tokenizes, enqueues and serializes. The engine runs the forwards in
a process of its own (engine_proc.py: its events read and delivered on this loop), or as a
thread (--engine thread: scheduler.py, its events handed back through a _Mailbox, one
loop.call_soon_threadsafe a batch of events). Every error is OpenAI's error object with a
4xx/5xx status, never a traceback: ApiError for what the request got wrong, BadInput from the tokenizer or template as
a 400, anything else a 500 that names no internals.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minfer.batch.scheduler import Job

try:  # a scoring answer's log-probs (2,112 tokens: 185 KB) in ~0.5 ms instead of ~8 with json
    import orjson
except ImportError:  # (the serve extra installs it; json gives the same document)
    orjson = None
from minfer.errors import BadInput, MinferError
from minfer.serve import protocol as P
from minfer.serve.protocol import Answer, ApiError

log = logging.getLogger("minfer.serve")
OPEN_PATHS = ("/health",)  # answered without the API key


@dataclass
class State:
    """What the routes share: the model's tokenizer and metadata, the scheduler, the limits."""

    engine: object  # minfer.engine.api.Engine (its backend built)
    sched: object  # scheduler.Scheduler
    name: str  # the served model name
    n_ctx: int
    metrics: object
    api_key: str | None = None
    max_queue: int = 4096
    max_body: int = 8 << 20
    timeout: float = 600.0
    read_timeout: float = 30.0  # a request's head and body must arrive within it
    draining: bool = False
    pieces: object = None
    char_bound: int | None = None  # app._max_chars
    created: int = field(default_factory=P.now)
    mailbox: object = None  # _Mailbox: the engine thread's events to the event loop

    @property
    def tok(self):
        return self.engine.tok

    @property
    def vocab(self) -> int:
        return self.engine.model.config.vocab_size


def create_app(st: State, version: str) -> FastAPI:
    """version: minfer's (the OpenAPI document's info.version), given by the command: serve/
    sits below the package's face (minfer/__init__.py)."""
    st.pieces = P.Pieces(st.tok)
    app = FastAPI(title="minfer", version=version, docs_url=None, redoc_url=None)
    app.state.minfer = st

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = {
            404: f"no route {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(e.status_code, str(e.detail))
        return _error(ApiError(e.status_code, msg))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return _error(ApiError(500, f"internal error ({type(e).__name__})"))

    app.add_middleware(_Guard, state=st)
    app.openapi = lambda: app.openapi_schema or _openapi(app, st)  # bodies: schema.py

    # -- endpoints ----------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        dead = getattr(st.sched, "dead", None)  # the engine process died (engine_proc)
        if dead:
            return _error(ApiError(500, dead, code="engine_error"))
        if st.draining:
            return _error(ApiError(503, "the server is draining", code="draining"))
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": st.name,
                    "object": "model",
                    "created": st.created,
                    "owned_by": "minfer",
                    "max_model_len": st.n_ctx,
                }
            ],
        }

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        m = st.metrics
        m.prefix_entries.set(len(st.sched.cache))
        m.prefix_slots.set(st.sched.cache.blocks * 128)
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok, meta = st.tok, st.engine.model.metadata
        text = lambda i: tok.token_text(i) if i is not None else None  # noqa: E731
        tmpl = meta.get("tokenizer.chat_template")
        return {
            "tokenizer_class": "minfer-gguf-" + tok.kind,
            "eos_token": text(tok.eos_id),
            "bos_token": text(tok.bos_id),
            "pad_token": None,
            "add_bos_token": bool(tok.add_bos),
            "chat_template": tmpl if isinstance(tmpl, str) else None,
            "model_max_length": st.n_ctx,
            "vocab_size": tok.n_vocab,
        }

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = P.parse_json(await request.body())
        _check_model(st, body)
        special = P.get_bool(body, "add_special_tokens", True)
        P.get_bool(body, "add_generation_prompt", True)  # checked for a prompt too
        text = P.get_str(body, "prompt")  # checked beside messages too (schema fuzzing)
        if body.get("messages") is not None:
            ids = _chat_ids(st, body, P.get_messages(body), TOKENIZE_CHARS)
        else:
            if text is None:
                raise P.bad("prompt (a string) or messages is required", "prompt")
            ids = _encode(st, text, special, TOKENIZE_CHARS)
        out = {"count": len(ids), "max_model_len": st.n_ctx, "tokens": ids}
        if P.get_bool(body, "return_token_strs", False):
            out["token_strs"] = [st.pieces.text(i) for i in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = P.parse_json(await request.body())
        _check_model(st, body)
        v = body.get("tokens")
        if not isinstance(v, list):
            raise P.bad("tokens must be a list of token ids", "tokens")
        return {"prompt": st.tok.decode(P.token_ids(v, st.vocab, "tokens"))}

    @app.post("/v1/completions")
    async def completions(request: Request):
        raw = await request.body()  # (the wait for the client is not host work)
        t0 = time.perf_counter()
        body = P.parse_json(raw)
        _check_model(st, body)
        P.check_greedy(body)
        prompts = P.get_prompts(body, st.vocab)
        max_tokens = P.get_int(body, "max_tokens", 16, 0)
        echo = P.get_bool(body, "echo", False)
        top = P.get_int(body, "logprobs", None, 0, P.TOP_MAX)
        stream = P.get_bool(body, "stream", False)
        stops = P.get_stops(body)
        ignore_eos = P.get_bool(body, "ignore_eos", False)
        special = P.get_bool(body, "add_special_tokens", True)
        include_usage = _include_usage(body, stream)
        answers = []  # a request's texts together are bounded too: 1024 long ones add up
        _check_chars(st, sum(len(t) for t, _ in prompts if t is not None), "prompt", TOKENIZE_CHARS)
        for text, ids in prompts:
            ids = _encode(st, text, special) if ids is None else ids
            _check_length(st, len(ids), max_tokens)
            answers.append(Answer(ids, text))
        want = top is not None
        jobs = [
            _job(
                st,
                a,
                max_tokens,
                echo and want,
                top or 0,
                want,
                stops,
                () if ignore_eos else st.tok.eog_ids,
            )
            for a in answers
        ]
        run = _Run(st, request, jobs, answers, stops)
        rid, created = P.new_id("cmpl"), P.now()
        head = {"id": rid, "object": "text_completion", "created": created, "model": st.name}

        def choice(i: int, a: Answer) -> dict:
            text = (
                (a.prompt_text if a.prompt_text is not None else st.tok.decode(a.prompt_ids))
                if echo
                else ""
            ) + a.text
            return {
                "index": i,
                "text": text,
                "logprobs": P.completion_logprobs(a, st.pieces, echo, top) if want else None,
                "finish_reason": a.finish,
            }

        if not stream:
            t_sub = time.perf_counter()
            await run.wait()
            t1 = time.perf_counter()
            n_gen = sum(len(a.tokens) for a in answers)
            return _json(
                st,
                {
                    **head,
                    "choices": [choice(i, a) for i, a in enumerate(answers)],
                    "usage": P.usage(sum(len(a.prompt_ids) for a in answers), n_gen),
                },
                (t_sub - t0) - t1,
            )

        async def events():
            sent = [0] * len(answers)
            if echo:
                for i, a in enumerate(answers):
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": i,
                                    "text": a.prompt_text
                                    if a.prompt_text is not None
                                    else st.tok.decode(a.prompt_ids),
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
            async for i, kind in run.stream():
                a = answers[i]
                if kind == "token":
                    new = a.text[sent[i] :] if a.finish else _held(a.text, stops)[sent[i] :]
                    lp = None
                    if want:
                        t = a.tokens[-1]
                        lp = {
                            "tokens": [st.pieces.text(t.id)],
                            "token_logprobs": [t.logprob],
                            "top_logprobs": [
                                P.top_dict(
                                    st.pieces,
                                    t.top_ids if top else None,
                                    t.top_lp if top else None,
                                    t.id,
                                    t.logprob,
                                )
                            ],
                            "text_offset": [sent[i]],
                        }
                    sent[i] += len(new)
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {"index": i, "text": new, "logprobs": lp, "finish_reason": None}
                            ],
                        }
                    )
                elif kind == "done":
                    rest = a.text[sent[i] :]
                    sent[i] = len(a.text)
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": i,
                                    "text": rest,
                                    "logprobs": None,
                                    "finish_reason": a.finish,
                                }
                            ],
                        }
                    )
            if include_usage:
                yield _sse(
                    {
                        **head,
                        "choices": [],
                        "usage": P.usage(
                            sum(len(a.prompt_ids) for a in answers),
                            sum(len(a.tokens) for a in answers),
                        ),
                    }
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(run.guard(events()), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = P.parse_json(await request.body())
        _check_model(st, body)
        P.check_greedy(body)
        msgs = P.get_messages(body)
        want = P.get_bool(body, "logprobs", False)
        top = P.get_int(body, "top_logprobs", None, 0, P.TOP_MAX)
        if top is not None and not want:
            raise P.bad("top_logprobs needs logprobs: true", "top_logprobs")
        stream = P.get_bool(body, "stream", False)
        stops = P.get_stops(body)
        include_usage = _include_usage(body, stream)
        ids = _chat_ids(st, body, msgs)
        mt = P.get_int(body, "max_completion_tokens", None, 0)
        old = P.get_int(body, "max_tokens", None, 0)  # checked even when the other wins
        mt = old if mt is None else mt
        # no bound asked: what the context leaves (none left: the length check refuses it)
        max_tokens = max(st.n_ctx - len(ids), 0) if mt is None else mt
        _check_length(st, len(ids), max_tokens)
        a = Answer(ids)
        ignore_eos = P.get_bool(body, "ignore_eos", False)
        jobs = [
            _job(
                st,
                a,
                max_tokens,
                False,
                top or 0,
                want,
                stops,
                () if ignore_eos else st.tok.eog_ids,
            )
        ]
        run = _Run(st, request, jobs, [a], stops)
        rid, created = P.new_id("chatcmpl"), P.now()
        if not stream:
            await run.wait()
            return {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": st.name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": a.text},
                        "logprobs": P.chat_logprobs(a.tokens, st.pieces, top or 0)
                        if want
                        else None,
                        "finish_reason": a.finish,
                    }
                ],
                "usage": P.usage(len(ids), len(a.tokens)),
            }
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": st.name}

        async def events():
            yield _sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            sent = 0
            async for _, kind in run.stream():
                if kind == "token":
                    new = (a.text if a.finish else _held(a.text, stops))[sent:]
                    sent += len(new)
                    lp = P.chat_logprobs(a.tokens[-1:], st.pieces, top or 0) if want else None
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"content": new},
                                    "logprobs": lp,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                elif kind == "done":
                    rest = a.text[sent:]
                    sent = len(a.text)
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"content": rest} if rest else {},
                                    "logprobs": None,
                                    "finish_reason": a.finish,
                                }
                            ],
                        }
                    )
            if include_usage:
                yield _sse({**head, "choices": [], "usage": P.usage(len(ids), len(a.tokens))})
            yield "data: [DONE]\n\n"

        return StreamingResponse(run.guard(events()), media_type="text/event-stream")

    from minfer.serve import pooling  # /v1/embeddings, /v1/score, /v1/rerank

    pooling.register(app, st, _check_model, _json, _Run)
    return app


# -- helpers ------------------------------------------------------------------------------------
def _openapi(app: FastAPI, st: State) -> dict:
    from minfer.serve.schema import openapi

    app.openapi_schema = openapi(app, st.vocab, st.name, st.engine.model.config.d_model)
    return app.openapi_schema


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _json(st: State, obj: dict, host_s: float) -> Response:
    """obj serialized here (FastAPI's encoder would walk every value again), and the
    request's host time (host_s + now: parse, tokenize, submit, serialize) recorded."""
    data = _dumps(obj)
    st.metrics.host_time.observe(host_s + time.perf_counter())
    return Response(data, media_type="application/json")


def _dumps(obj) -> bytes:
    """Compact JSON: orjson where it can, json where it cannot (no orjson; a string holding a
    lone surrogate, which a request's echoed text may carry)."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _sse(obj: dict) -> str:
    return "data: " + _dumps(obj).decode() + "\n\n"


def _check_model(st: State, body: dict) -> None:
    m = P.get_str(body, "model")
    if m is not None and m != st.name:
        raise ApiError(
            404,
            f"the model {m!r} does not exist; this server serves {st.name!r}",
            "model",
            "model_not_found",
        )


def _include_usage(body: dict, stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise P.bad("stream_options must be an object", "stream_options")
    if not stream:
        raise P.bad("stream_options needs stream: true", "stream_options")
    return P.get_bool(so, "include_usage", False)


TOKENIZE_CHARS = 1 << 20  # /tokenize's text bound: tokenizing holds the event loop (~1 s/MB)


def _max_chars(st: State) -> int:
    """Characters past which a text surely holds more tokens than the context: no token
    covers more than the vocabulary's longest piece (plus slack for a space prefix)."""
    if st.char_bound is None:
        longest = max((len(p) for p in st.tok._piece_table(True)), default=1)
        st.char_bound = st.n_ctx * max(longest, 1) + 64
    return st.char_bound


def _check_chars(st: State, n: int, param: str, bound: int | None = None) -> None:
    """Refuse a text too long to fit before tokenizing it (a 10 MB prompt would hold the
    event loop for seconds only to be refused)."""
    bound = _max_chars(st) if bound is None else bound
    if n > bound:
        raise P.bad(
            f"the text has {n} characters; at most {bound} can fit this model's context "
            f"of {st.n_ctx} tokens"
            if bound == st.char_bound
            else f"the text has {n} characters; /tokenize takes at most {bound}",
            param,
        )


def _encode(st: State, text: str, special: bool, bound: int | None = None) -> list[int]:
    _check_chars(st, len(text), "prompt", bound)
    try:
        return st.tok.encode(text, add_bos=None if special else False, parse_special=True)
    except BadInput as e:
        raise P.bad(str(e), "prompt") from None


def _chat_ids(st: State, body: dict, msgs: list[dict], bound: int | None = None) -> list[int]:
    from minfer.text import chat as chat_mod

    gen = P.get_bool(body, "add_generation_prompt", msgs[-1]["role"] != "assistant")
    _check_chars(st, sum(len(m["content"]) + len(m["role"]) for m in msgs), "messages", bound)
    try:
        return list(
            chat_mod.encode_messages(
                st.engine.model.metadata, st.tok, msgs, False, "messages", add_generation_prompt=gen
            )
        )
    except MinferError as e:
        raise P.bad(str(e), "messages") from None


def _check_length(st: State, n: int, max_tokens: int) -> None:
    if n == 0:
        raise P.bad("the prompt has 0 tokens", "prompt")
    if n + max_tokens > st.n_ctx:
        raise P.bad(
            f"this model's maximum context length is {st.n_ctx} tokens; the request "
            f"asks for {n + max_tokens} ({n} in the prompt, {max_tokens} to generate)",
            "max_tokens" if n < st.n_ctx else "prompt",
        )
    if st.sched.capacity_blocks * 128 < n + max_tokens - 1:
        raise P.bad(
            f"the request needs {n + max_tokens - 1} KV slots; the server's cache "
            f"holds {st.sched.capacity_blocks * 128}",
            "prompt",
        )


def _held(text: str, stops: list[str]) -> str:
    """What of a partial answer may be streamed now: not a trailing part of a character, nor
    what may become a stop string."""
    if text.endswith("\ufffd"):
        text = text.rstrip("\ufffd")
    hold = max((len(s) - 1 for s in stops), default=0)
    return text[: len(text) - hold] if hold else text


def _job(
    st: State,
    a: Answer,
    max_tokens: int,
    prompt_stats: bool,
    top: int,
    gen_lp: bool,
    stops: list[str],
    stop_ids,
) -> Job:
    return Job(
        np.asarray(a.prompt_ids, np.int32),
        max_tokens,
        None,
        prompt_stats=prompt_stats,
        top=top,
        gen_logprobs=gen_lp,
        stop_ids=frozenset(stop_ids),
        stop_check=P.stop_checker(st.tok, stops),
        stops=tuple(stops),
    )


class _Mailbox:
    """The engine thread's events on their way to the requests' queues on the event loop:
    appended on the engine thread, moved by one callback per batch, so a step's events cost
    one wake-up of the loop (a self-pipe write) instead of one each (2 a scoring request)."""

    def __init__(self, loop):
        self.loop, self.items, self.pending = loop, deque(), False

    def post(self, q: asyncio.Queue, item) -> None:  # the engine thread
        self.items.append((q, item))
        if not self.pending:  # (a drain that already started clears it first, then empties)
            self.pending = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # the event loop
        self.pending = False
        items = self.items
        while items:
            q, item = items.popleft()
            q.put_nowait(item)


class _Run:
    """A request's jobs in the scheduler: their events gathered into Answers, the request's
    deadline and its client's disconnect watched (either cancels what is left)."""

    def __init__(
        self, st: State, request: Request, jobs: list[Job], answers: list[Answer], stops: list[str]
    ):
        self.st, self.request, self.jobs, self.answers = st, request, jobs, answers
        self.loop = asyncio.get_running_loop()
        self.q: asyncio.Queue = asyncio.Queue()
        self.mailbox = None  # (process mode: events are delivered on this loop already)
        if not getattr(st.sched, "on_loop", False):
            if st.mailbox is None or st.mailbox.loop is not self.loop:
                st.mailbox = _Mailbox(self.loop)
            self.mailbox = st.mailbox
        self.left = len(jobs)
        self.stops = stops
        self.streaming = False
        for i, j in enumerate(jobs):
            j.deliver = self._deliver(i)
        sched = st.sched
        if st.draining:
            raise ApiError(503, "the server is draining", code="draining")
        if sched.queued() + len(jobs) > st.max_queue:
            raise ApiError(
                429,
                f"the queue is full ({sched.queued()} prompts waiting, "
                f"--max-queue {st.max_queue}); retry later",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        st.metrics.prompt_tokens.inc(sum(len(a.prompt_ids) for a in answers))
        sched.submit(jobs)
        self.deadline = time.monotonic() + st.timeout
        self.check_at = time.monotonic() + 0.5  # the next look for a client gone away

    def _deliver(self, i: int):
        q, box = self.q, self.mailbox
        if box is None:
            return lambda kind, value: q.put_nowait((i, kind, value))
        return lambda kind, value: box.post(q, (i, kind, value))

    def _apply(self, i: int, kind: str, value) -> None:
        a = self.answers[i]
        if kind == "prompt":
            a.rows = value
        elif kind == "token":
            a.tokens.append(value)
            self.st.metrics.generation_tokens.inc()
            if self.streaming:  # a stream sends the text as it grows; a whole answer once
                a.text = self.st.tok.decode([t.id for t in a.tokens])
        elif kind == "done":
            a.finish = value
            a.text = self.st.tok.decode([t.id for t in a.tokens])
            if self.stops:
                a.text, _ = P.cut_at_stop(a.text, self.stops)
            self.left -= 1
        elif kind == "error":
            if not getattr(self.st.sched, "dead", None):  # (else start.run says it, once)
                log.warning("a request failed: %s", value)
            self.cancel()
            if isinstance(value, BadInput):
                raise P.bad(str(value))
            raise ApiError(500, f"the forward failed: {value}", code="engine_error")

    def cancel(self) -> None:
        self.st.sched.cancel(self.jobs)

    async def _next(self):
        while True:
            now = time.monotonic()
            left = self.deadline - now
            if left <= 0:
                self.cancel()
                raise ApiError(
                    504,
                    f"the request took longer than --timeout {self.st.timeout:g} s",
                    code="timeout",
                )
            if now >= self.check_at:  # every 0.5 s, busy or not: tokens may never pause
                self.check_at = now + 0.5
                if await self.request.is_disconnected():
                    self.cancel()
                    raise ClientDisconnect()  # counted as 499 by _Guard, nothing logged
            try:
                return await asyncio.wait_for(self.q.get(), timeout=min(left, 0.5))
            except asyncio.TimeoutError:
                continue

    async def wait(self) -> None:
        try:
            while self.left:
                i, kind, value = await self._next()
                self._apply(i, kind, value)
        except BaseException:
            self.cancel()
            raise

    async def stream(self):
        """(prompt index, event kind) as the events come, until every prompt is done."""
        self.streaming = True
        while self.left:
            i, kind, value = await self._next()
            self._apply(i, kind, value)
            yield i, kind

    async def guard(self, gen):
        """A stream's events; an error met mid-stream becomes an error event, and a client
        that goes away cancels the jobs."""
        try:
            async for x in gen:
                yield x
        except ApiError as e:
            yield _sse(e.body())
            yield "data: [DONE]\n\n"
        finally:
            self.cancel()


class _Guard:
    """Pure ASGI middleware: the API key (Bearer, constant-time), 503 while draining, the body
    limit (Content-Length checked first; a chunked body counted as it arrives, refused at the
    limit, never read whole), the body's deadline (--read-timeout: 408), a client gone before
    its body arrived (counted as 499, nothing logged), and the request counts by endpoint and
    status."""

    def __init__(self, app, state: State):
        self.app, self.st = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st, path = self.st, scope["path"]
        status = {"code": 500}

        async def send_counted(msg):
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)

        try:
            err = self._refuse(scope, path)
            if err is not None:
                await _send_error(send_counted, err)
                return
            limit, seen = st.max_body, {"n": 0}
            for k, v in scope.get("headers", ()):
                if k == b"content-length":
                    try:
                        n = int(v)
                    except ValueError:
                        n = -1
                    if n < 0 or n > limit:
                        await _send_error(
                            send_counted,
                            _too_large(limit)
                            if n > limit
                            else P.bad("Content-Length is not a byte count"),
                        )
                        return

            deadline = time.monotonic() + st.read_timeout
            body = {"done": False}

            async def receive_limited():
                if body["done"]:  # the body is read: only a disconnect can come
                    return await receive()
                try:  # a body sent slowly or never ended holds nothing past the deadline
                    msg = await asyncio.wait_for(receive(), deadline - time.monotonic())
                except asyncio.TimeoutError:
                    raise _BodyLate from None
                if msg["type"] == "http.request":
                    seen["n"] += len(msg.get("body", b""))
                    if seen["n"] > limit:
                        raise _BodyTooLarge
                    body["done"] = not msg.get("more_body", False)
                return msg

            try:
                await self.app(scope, receive_limited, send_counted)
            except _BodyTooLarge:
                await _send_error(send_counted, _too_large(limit))
            except _BodyLate:
                await _send_error(
                    send_counted,
                    ApiError(
                        408,
                        f"the body did not arrive within --read-timeout {st.read_timeout:g} s",
                        code="request_timeout",
                        headers={"Connection": "close"},
                    ),
                )
            except ClientDisconnect:  # gone before its body was read: nothing to answer
                status["code"] = 499
        finally:
            endpoint = path if path in _KNOWN else "other"
            st.metrics.requests.labels(endpoint, str(status["code"])).inc()

    def _refuse(self, scope, path: str) -> ApiError | None:
        st = self.st
        if st.api_key and path not in OPEN_PATHS:
            auth = dict(scope.get("headers", ())).get(b"authorization", b"")
            want = b"Bearer " + st.api_key.encode()
            if not hmac.compare_digest(auth, want):
                return ApiError(
                    401,
                    "a valid API key is required (Authorization: Bearer KEY)",
                    code="invalid_api_key",
                )
        if st.draining and path != "/health":
            return ApiError(503, "the server is draining", code="draining")
        return None


_KNOWN = {
    "/health",
    "/v1/models",
    "/metrics",
    "/tokenizer_info",
    "/tokenize",
    "/detokenize",
    "/v1/completions",
    "/v1/chat/completions",
    "/openapi.json",
}


class _BodyTooLarge(Exception):
    pass


class _BodyLate(Exception):
    pass


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the body exceeds the server's limit of {limit} bytes",
        code="request_too_large",
        headers={"Connection": "close"},
    )  # unread rest


async def _send_error(send, e: ApiError) -> None:
    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in e.headers.items()]
    try:
        await send({"type": "http.response.start", "status": e.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # a response already started (a stream): nothing more to say
        pass
