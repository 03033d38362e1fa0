"""kernels/gemma_layers.cu through its launchers vs the numpy twins: the embedding scale, GeGLU
(ggml's f16-table GELU: equal to the twin but where tanhf's last bits cross an f16 rounding
boundary), the post norms' x += rmsnorm(t) * w and the final logit soft-cap."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err

from minfer.reference import ops

pytestmark = pytest.mark.gpu


def test_scale_and_softcap(rt):
    from minfer.cuda.ops import gemma_layers as G
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((37, 1000)) * 40).astype(np.float32)
    y = da.to_device(rt, x)
    G.scale(rt, y, 16.0)
    assert np.array_equal(y.get(), x * np.float32(16.0))
    G.softcap(rt, y, 30.0)
    cap = np.float32(30.0)
    ref = np.tanh((x * np.float32(16.0) * (np.float32(1.0) / cap)).astype(np.float64))
    ref = ref.astype(np.float32) * cap
    got = y.get()
    assert np.abs(got - ref).max() <= 4 * np.spacing(cap), np.abs(got - ref).max()
    assert np.abs(got).max() <= 30.0


@pytest.mark.parametrize("fused", [False, True, "interleaved"])
@pytest.mark.parametrize("T,F", [(1, 64), (33, 1000), (130, 2048)])
def test_geglu(rt, T, F, fused):
    from minfer.cuda.ops import gemma_layers as G
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + F)
    g = (rng.standard_normal((T, F)) * 4).astype(np.float32)
    g[0, :8] = [-11, -10, -9.99, 0, 9.99, 10, 11, np.float32(1e-8)]  # the table's clamps
    u = (rng.standard_normal((T, F)) * 2).astype(np.float32)
    y = da.to_device(rt, np.full((T, F), np.nan, np.float16))
    if fused == "interleaved":  # the glu GEMM's row order (the M == 1 GEMV's output)
        from minfer.quants.glu import glu_rows

        G.geglu_interleaved(rt, y, da.to_device(rt, np.concatenate([g, u], 1)[:, glu_rows(F)]))
    elif fused:
        G.geglu(rt, y, da.to_device(rt, np.concatenate([g, u], axis=1)))
    else:
        G.geglu(rt, y, da.to_device(rt, g), da.to_device(rt, u))
    ref = ops.geglu(g, u).astype(np.float16)
    got = y.get()
    assert np.all(np.isfinite(got))
    # equal, or one f16 ulp of gelu (tanhf) times u: under 1e-3 relative on the whole
    assert (got == ref).mean() > 0.99
    assert rel_err(got, ref.astype(np.float32)) < 1e-3


@pytest.mark.parametrize("T,D", [(1, 256), (7, 640), (33, 1000), (130, 3840)])
def test_rmsnorm_add(rt, T, D):
    from minfer.cuda.ops import gemma_layers as G
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T * D)
    x = rng.standard_normal((T, D)).astype(np.float32)
    t = (rng.standard_normal((T, D)) * 30).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    xd = da.to_device(rt, x)
    G.rmsnorm_add(rt, xd, da.to_device(rt, t), da.to_device(rt, w), 1e-6)
    ref = x + ops.rmsnorm(t, w, 1e-6)
    assert rel_err(xd.get(), ref) < 1e-6
