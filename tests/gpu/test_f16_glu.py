"""The f16 path's gate|up GEMM with the swiglu in its epilogue (on by default; the tuning variant f16:no-glu turns it off)
against the f32 gate|up GEMM + swiglu launch: the same logits bit for bit, prefill and M = 1
decode (the GEMV + interleaved swiglu)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_f16_glu_logits_bitwise(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    from gpu_helpers import prefill_and_step

    runs = {}
    for glu in (True, False):
        b = CudaBackend(model, GemmChoice("f16", frozenset() if glu else frozenset({"glu"})), max_tokens=128, ubatch=16)
        assert bool(b.glu) == (glu and model.config.d_ff % 8 == 0)
        runs[glu] = prefill_and_step(b, seed=5)
    for got, ref in zip(runs[True], runs[False]):
        assert np.array_equal(got, ref)
