"""MinferPredictor: one minfer.Engine per Ray actor, a batch of prompt rows in, one JSONL record a
row out (the exact line the single-process writer writes).

A batch (Ray Data's numpy format: column -> array) holds "ids" (a prompt's int32 token ids, as
bytes or an int sequence; "n_context": a scored continuation's context tokens, -1 none) or
"prompt" (text, or a prompt-file record's JSON: minfer.batch.records checks it), and optionally
"index" (the row's position; default the batch's own 0..k-1), "id" (the record's id as JSON
text; default the index) and "line" (the prompt file's line, named in a GPU fault). Out:
"index", "record" (str) and "prefill_s" / "decode_s" (the row's even share of its batch's
prefill and decode seconds in the engine: summed over a job, the actors' own time, without Ray's
start and the model loads).
"""

from __future__ import annotations

import json

import numpy as np

from minfer.errors import BadInput, ResourceError


def need_ray(what: str = "minfer.engine.ray"):
    """The ray module (with ray.data), else ResourceError: the extra is missing (exit 3)."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise ResourceError(
            f"{what} needs the ray extra ({e.name or 'ray'} is missing): "
            'pip install "minfer[ray]" (or -e ".[ray]" in a checkout)'
        ) from None
    return ray


def _column(batch, name: str, k: int, default):
    v = batch.get(name)
    return [default(i) for i in range(k)] if v is None else list(v)


class MinferPredictor:
    """The model loaded once per actor; __call__(batch) -> {"index", "record"}. model: a GGUF path
    (every node reads it at that path); the other arguments are minfer.Engine's and
    Engine.prefill's (n_ctx: the context, as `-c`; stop_ids: token ids ending decode, None: the
    tokenizer's end-of-generation ids when stop_at_eos; kv_for: the whole job's
    minfer.engine.api.kv_plan, so the KV cache is planned once, as a single process plans it,
    and a group runs in the same waves: `--ray` passes it; without it each batch plans its own
    and a later, larger batch may run in more waves, with other numbers on the GPU)."""

    def __init__(
        self,
        model: str,
        backend: str | None = None,
        gemm="auto",
        ubatch: int | None = None,
        dtype: str | None = None,
        threads: int | None = None,
        n_ctx: int | None = None,
        n_predict: int = 32,
        logprobs: bool = False,
        share_prefix: bool = True,
        stop_at_eos: bool = False,
        stop_ids=None,
        top: int = 0,
        prompt_ids: bool = False,
        chat: bool = False,
        system: str | None = None,
        source: str = "prompt",
        kv_for=None,
    ):
        from minfer.engine.api import Engine

        self.engine = Engine(model, backend, gemm, ubatch, dtype=dtype, threads=threads)
        cfg = self.engine.model.config
        if n_ctx:  # as `minfer prefill -c`: phi3's long or short RoPE factors
            self.engine.model.config = cfg.for_context(n_ctx)
        if kv_for is not None:  # the whole job's KV plan: the single process's cache, waves
            self.engine.prepare(*(int(x) for x in kv_for))
        tok = self.engine.tok
        self.stop_ids = (
            tuple(stop_ids) if stop_ids is not None else (tok.eog_ids if stop_at_eos else ())
        )
        self.n_predict, self.logprobs, self.share = n_predict, logprobs, share_prefix
        self.top = min(top, cfg.vocab_size)
        self.prompt_ids, self.chat, self.system, self.source = prompt_ids, chat, system, source

    def _prompts(self, batch, index: list[int]) -> list[tuple[np.ndarray, int | None]]:
        """(int32 ids, n_context or None) of each row."""
        if "ids" in batch:
            ctx = _column(batch, "n_context", len(index), lambda i: -1)
            out = []
            for v, c in zip(batch["ids"], ctx):
                ids = (
                    np.frombuffer(v, np.int32) if isinstance(v, bytes) else np.asarray(v, np.int32)
                )
                out.append((ids, None if int(c) < 0 else int(c)))
            return out
        if "prompt" not in batch:
            raise BadInput(
                f'a MinferPredictor batch needs an "ids" or a "prompt" column, has {sorted(batch)}'
            )
        enc = self.engine._encoder(self.chat, self.system)
        out = []
        for i, p in enumerate(batch["prompt"]):
            p = str(p)
            try:  # a record's JSON, else plain text
                rec = json.loads(p) if p[:1] and p[0] in '{["' else p
            except json.JSONDecodeError as e:
                raise BadInput(f"prompts[{index[i]}]: invalid JSON ({e.msg})") from None
            _, ids, first = self.engine._record(f"prompts[{index[i]}]", rec, enc)
            out.append((ids, first))
        return out

    def __call__(self, batch: dict) -> dict:
        k = len(next(iter(batch.values())))
        index = [int(x) for x in _column(batch, "index", k, lambda i: i)]
        pids = [json.loads(str(v)) for v in _column(batch, "id", k, lambda i: str(index[i]))]
        lines = _column(batch, "line", k, lambda i: 0)
        prompts = self._prompts(batch, index)
        from minfer.batch.output import dumps, record

        out: list[str | None] = [None] * k
        tok = self.engine.tok

        def emit(r) -> None:
            out[r.key] = dumps(
                record(pids[r.key], r, tok, self.logprobs, self.top, self.prompt_ids)
            )

        def describe(j: int) -> str:
            n = int(lines[j])
            return f"{self.source} line {n} (id {pids[j]!r})" if n else f"prompt {index[j]}"

        tot = self.engine.run(
            [(j, ids, first) for j, (ids, first) in enumerate(prompts)],
            [len(ids) for ids, _ in prompts],
            self.n_predict,
            emit,
            logprobs=self.logprobs,
            share=self.share,
            stop_ids=self.stop_ids,
            top=self.top,
            describe=describe,
        )
        return {
            "index": np.asarray(index, np.int64),
            "record": np.asarray(out, dtype=object),
            "prefill_s": np.full(k, tot.prefill_s / k),
            "decode_s": np.full(k, tot.decode_s / k),
        }
