"""Helpers shared by the GPU tests."""

from __future__ import annotations

import numpy as np


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; a non-finite output (unwritten poison) fails."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output (unwritten poison?)"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def prefill_and_step(backend, seed: int, n: int = 37):
    """(logits of a random n-token prompt in the backend's chunks, logits of one greedy decode
    step after it): what an epilogue switch must leave bit for bit unchanged."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, backend.c.vocab_size, n).astype(np.int32)
    first = backend.forward(prompt, 0)
    nxt = backend.forward(np.array([int(np.argmax(first))], np.int32), n)
    assert np.isfinite(first).all() and np.isfinite(nxt).all()
    return first, nxt
