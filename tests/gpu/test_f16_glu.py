"""The f16 path's gate|up GEMM with the swiglu in its epilogue (MINFER_F16_GLU, default on)
against the f32 gate|up GEMM + swiglu launch: the same logits bit for bit, prefill and M = 1
decode (the GEMV + interleaved swiglu)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_f16_glu_logits_bitwise(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.config import GemmConfig

    rng = np.random.default_rng(5)
    prompt = rng.integers(0, model.config.vocab_size, 37).astype(np.int32)
    runs = {}
    for glu in (True, False):
        b = CudaBackend(model, GemmConfig(f16_glu=glu), max_tokens=128, ubatch=16)
        assert bool(b.glu) == (glu and model.config.d_ff % 8 == 0)
        first = b.forward(prompt, 0)
        nxt = b.forward(np.array([int(np.argmax(first))], np.int32), len(prompt))
        runs[glu] = (first, nxt)
    for got, ref in zip(runs[True], runs[False]):
        assert np.isfinite(got).all()
        assert np.array_equal(got, ref)
