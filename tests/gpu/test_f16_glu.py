"""The f16 path's gate|up GEMM with the swiglu (gemma: the geglu) in its epilogue (on by default;
the tuning variant f16:no-glu turns it off) against the f32 gate|up GEMM + swiglu / geglu launch:
the same logits bit for bit, prefill and M = 1 decode (the GEMV + interleaved swiglu / geglu)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["model", "tiny-gemma3", "tiny-gemma2"])
def glu_model(request, tmp_path):
    """The test model (SwiGLU) and the gemma families' tiny files (GeGLU)."""
    if request.param == "model":
        return request.getfixturevalue("model")
    from families_data import synth_family

    from minfer.gguf.loader import load_model

    return load_model(synth_family(request.param, tmp_path))


def test_f16_glu_logits_bitwise(glu_model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    from gpu_helpers import prefill_and_step

    runs = {}
    model = glu_model
    for glu in (True, False):
        b = CudaBackend(model, GemmChoice("f16", frozenset() if glu else frozenset({"glu"})), max_tokens=128, ubatch=16)
        assert bool(b.glu) == (glu and model.config.d_ff % 8 == 0)
        runs[glu] = prefill_and_step(b, seed=5)
    for got, ref in zip(runs[True], runs[False]):
        assert np.array_equal(got, ref)
