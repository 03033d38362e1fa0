"""The one place a backend is built (make_backend: prefill, perplexity, bench, check, Engine); a
prompt runs on it through minfer.batch.single (one) or minfer.batch.run (many)."""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput


def make_backend(
    kind: str,
    model,
    choice=None,
    max_tokens: int = 4096,
    ubatch: int | None = None,
    dtype: str | None = None,
    progress: bool = True,
    warmup: bool = False,
    kv_slots: int | None = None,
):
    """The one place a backend is built (prefill, perplexity, bench, check): 'cpu' (the numpy
    reference; dtype 'f64' for the float64 oracle, weights dequantized now) or 'cuda'
    (CudaBackend on `choice`, a resolved minfer.cuda.plan.config.GemmChoice; None: auto).
    warmup=False: no one-token warm-up (batch.single.run and bench warm up the lengths they run).
    kv_slots: the CUDA KV cache's rows for many sequences (minfer.batch; default max_tokens)."""
    if kind == "cpu":
        from minfer.reference.forward import ReferenceBackend

        be = ReferenceBackend(
            model, dtype=np.float64 if dtype == "f64" else np.float32, max_tokens=max_tokens
        )
        be.preload(progress=progress)
        return be
    if kind != "cuda":
        raise BadInput(f"backend {kind!r}: expected cuda or cpu")
    from minfer.cuda.backend import CudaBackend

    return CudaBackend(
        model,
        choice,
        max_tokens=max_tokens,
        ubatch=max_tokens if ubatch is None else ubatch,
        progress=progress,
        warmup=warmup,
        kv_slots=kv_slots,
    )
