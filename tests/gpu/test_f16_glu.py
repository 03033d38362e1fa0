"""The f16 path's gate|up GEMM with the swiglu (gemma: the geglu) in its epilogue (on by default;
the tuning variant f16:no-glu turns it off) against the f32 gate|up GEMM + swiglu / geglu launch:
the same logits bit for bit, prefill and M = 1 decode (the GEMV + interleaved swiglu / geglu)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_f16_glu_logits_bitwise(model):
    _glu_on_off_bitwise(model)


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
def test_f16_geglu_logits_bitwise(tmp_path, preset):
    """gemma's GeGLU (the GEMM's mode 5) against the f32 GEMM + geglu launch."""
    from families_data import synth_family

    from minfer.gguf.loader import load_model

    _glu_on_off_bitwise(load_model(synth_family(preset, tmp_path)))


def _glu_on_off_bitwise(model):
    from gpu_helpers import prefill_and_step

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    runs = {}
    for glu in (True, False):
        b = CudaBackend(
            model,
            GemmChoice("f16", frozenset() if glu else frozenset({"glu"})),
            max_tokens=128,
            ubatch=16,
        )
        assert bool(b.glu) == (glu and model.config.d_ff % 8 == 0)
        runs[glu] = prefill_and_step(b, seed=5)
    for got, ref in zip(runs[True], runs[False]):
        assert np.array_equal(got, ref)
