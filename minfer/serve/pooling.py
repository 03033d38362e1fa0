"""The prefill-only endpoints (issue 52; docs/serve.md): /v1/embeddings (OpenAI's shape),
/v1/score (SGLang's), /v1/rerank (Jina's / Cohere's; also /rerank, /v1/reranking, /reranking
as llama.cpp). Each prompt is a pooled Job (scheduler.py): it joins the running batch, its
rows' hidden states come back without the LM head; the numbers are minfer.batch.pooling's, the
same code Engine.embed / score / rerank run. Registered by create_app (one line)."""

from __future__ import annotations

import numpy as np
from fastapi import Request

from minfer.batch import pooling as PL
from minfer.batch.scheduler import Job
from minfer.errors import BadInput
from minfer.serve import protocol as P
from minfer.serve.protocol import Answer, ApiError

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
MAX_ITEMS = 4096  # documents / items in one request


def register(app, st, check_model, to_json, run_cls) -> None:
    """Add the routes; st.pooling / st.reranker come from build_state (the CLI's --pooling and
    --rerank-template), else from the model. app.py's helpers come as arguments (no import
    cycle): check_model(st, body), to_json(st, obj, host_s), run_cls (its _Run)."""
    _check_model, _json = check_model, to_json

    model = st.engine.model
    pooling = getattr(st, "pooling", None) or PL.model_pooling(model)[0]
    reranker = getattr(st, "reranker", None)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        import time

        raw = await request.body()  # (the wait for the client is not host work)
        t0 = time.perf_counter()
        body = P.parse_json(raw)
        _check_model(st, body)
        fmt = P.get_str(body, "encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise P.bad(f"encoding_format must be float or base64, not {fmt!r}", "encoding_format")
        dims = P.get_int(body, "dimensions", None, 1)
        if dims is not None and dims > model.config.d_model:
            raise P.bad(
                f"dimensions {dims} exceeds the model's embedding size {model.config.d_model}",
                "dimensions",
            )
        ids = _inputs(st, body.get("input"), "input")
        t_sub = time.perf_counter()
        res = await _run(st, request, run_cls, ids, pooling, keep=False)
        t1 = time.perf_counter()
        data = []
        for i, r in enumerate(res):
            v = PL.finish(r.vec, dims)
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": PL.b64(v) if fmt == "base64" else v.tolist(),
                }
            )
        n = sum(len(x) for x in ids)
        return _json(
            st,
            {
                "object": "list",
                "data": data,
                "model": st.name,
                "usage": {"prompt_tokens": n, "total_tokens": n},
            },
            (t_sub - t0) - t1,
        )

    @app.post("/v1/score")
    async def score(request: Request):
        from minfer.reference.heads import LabelHead

        body = P.parse_json(await request.body())
        _check_model(st, body)
        labels = body.get("label_token_ids")
        if not isinstance(labels, list) or not labels:
            raise P.bad("label_token_ids must be a non-empty list of token ids", "label_token_ids")
        labels = P.token_ids(labels, st.vocab, "label_token_ids")
        soft = P.get_bool(body, "apply_softmax", False)
        first = P.get_bool(body, "item_first", False)
        q, items = body.get("query"), body.get("items")
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list) or not items:
            raise P.bad(
                "items must be a string or a non-empty list of strings or of token id lists",
                "items",
            )
        if len(items) > MAX_ITEMS:
            raise P.bad(f"items: at most {MAX_ITEMS} in one request, got {len(items)}", "items")
        if isinstance(q, str):
            if not all(isinstance(x, str) for x in items):
                raise P.bad("a text query takes text items", "items")
        elif isinstance(q, list):
            q = P.token_ids(q, st.vocab, "query")
            if not all(isinstance(x, list) for x in items):
                raise P.bad("a token id query takes token id list items", "items")
            items = [P.token_ids(x, st.vocab, f"items[{i}]") for i, x in enumerate(items)]
        else:
            raise P.bad("query must be a string or a list of token ids", "query")
        try:
            ids = PL.score_ids(st.tok, q, items, first)
        except BadInput as e:
            raise P.bad(str(e), "items") from None
        _check_lengths(st, ids, "items")
        res = await _run(st, request, run_cls, ids, "last", lse=not soft)
        logits = LabelHead(model, labels)(np.stack([r.vec for r in res]))
        n = sum(len(x) for x in ids)
        return {
            "scores": [PL.label_probs(lg, r.lse, soft) for lg, r in zip(logits, res)],
            "model": st.name,
            "object": "scoring",
            "usage": P.usage(n, 0),
        }

    async def rerank(request: Request):
        from minfer.reference.heads import LabelHead

        body = P.parse_json(await request.body())
        _check_model(st, body)
        rr = reranker or _reranker(st)
        q = body.get("query")
        if not isinstance(q, str):
            raise P.bad("query must be a string", "query")
        docs = body.get("documents")
        if not isinstance(docs, list):
            raise P.bad("documents must be a list of strings", "documents")
        if not docs:
            raise P.bad("documents is empty (0 documents)", "documents")
        if len(docs) > MAX_ITEMS:
            raise P.bad(
                f"documents: at most {MAX_ITEMS} in one request, got {len(docs)}", "documents"
            )
        texts = []
        for i, d in enumerate(docs):  # Jina's {"text": ...} objects too
            t = d.get("text") if isinstance(d, dict) else d
            if not isinstance(t, str):
                raise P.bad(f'documents[{i}] must be a string or {{"text": string}}', "documents")
            texts.append(t)
        top_n = P.get_int(body, "top_n", len(texts), 1)
        want_docs = P.get_bool(body, "return_documents", True)
        ids = [rr.ids(q, t) for t in texts]
        _check_lengths(st, ids, "documents")
        res = await _run(st, request, run_cls, ids, "last")
        logits = LabelHead(model, rr.labels)(np.stack([r.vec for r in res]))
        scores = [rr.relevance(lg) for lg in logits]
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[:top_n]
        n = sum(len(x) for x in ids)
        return {
            "model": st.name,
            "object": "list",
            "usage": {"prompt_tokens": n, "total_tokens": n},
            "results": [
                {
                    "index": i,
                    "relevance_score": scores[i],
                    **({"document": {"text": texts[i]}} if want_docs else {}),
                }
                for i in order
            ],
        }

    for path in RERANK_PATHS:
        app.add_api_route(path, rerank, methods=["POST"])


def _reranker(st):
    try:
        st.reranker = PL.Reranker(st.engine.model, st.tok)
    except BadInput as e:
        raise ApiError(400, f"reranking is not available for this model: {e}") from None
    return st.reranker


def _inputs(st, v, param: str) -> list[list[int]]:
    """OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of such
    lists -> token ids per input (text: special tokens parsed, BOS / EOS as the GGUF says)."""
    if v is None:
        raise P.bad(f"{param} is required", param)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise P.bad(f"{param} must be a string, a list of strings or token ids (non-empty)", param)
    if len(v) > MAX_ITEMS:
        raise P.bad(f"{param}: at most {MAX_ITEMS} inputs in one request, got {len(v)}", param)
    if all(isinstance(x, str) for x in v):
        out = []
        for i, x in enumerate(v):
            if not x:
                raise P.bad(f"{param}[{i}] is an empty string", param)
            try:
                out.append(st.tok.encode(x, parse_special=True))
            except BadInput as e:
                raise P.bad(f"{param}[{i}]: {e}", param) from None
    elif all(isinstance(x, list) for x in v):
        out = [P.token_ids(x, st.vocab, f"{param}[{i}]") for i, x in enumerate(v)]
    elif not any(isinstance(x, (str, list, dict)) for x in v):
        out = [P.token_ids(v, st.vocab, param)]
    else:
        raise P.bad(
            f"{param}: a list must hold only strings, only token ids, or only lists of token ids",
            param,
        )
    _check_lengths(st, out, param)
    return out


def _check_lengths(st, ids: list[list[int]], param: str) -> None:
    cap = min(st.n_ctx, st.sched.capacity_blocks * 128)
    for i, x in enumerate(ids):
        if not x:
            raise P.bad(f"{param}[{i}] has 0 tokens", param)
        if len(x) > cap:
            raise P.bad(
                f"{param}[{i}] is {len(x)} tokens; this server takes at most {cap} "
                f"(the model's context {st.n_ctx})",
                param,
            )


async def _run(
    st, request, run_cls, ids: list[list[int]], pool: str, lse: bool = False, keep: bool = True
) -> list:
    """The prompts as pooled jobs (through app.py's _Run: deadline, disconnects, errors);
    their scheduler.Pooled results in order."""

    class Run(run_cls):
        def _apply(self, i, kind, value):
            if kind == "pooled":
                out[i] = value
            else:
                super()._apply(i, kind, value)

    out: list = [None] * len(ids)
    jobs = [Job(np.asarray(x, np.int32), 0, None, pool=pool, lse=lse, keep=keep) for x in ids]
    await Run(st, request, jobs, [Answer(list(x)) for x in ids], []).wait()
    return out
