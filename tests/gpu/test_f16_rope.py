"""The fused q|k|v GEMM with the rope in its epilogue (gemm mode 4, the tuning variant f16:no-rope off, default
on): q16 and the K/V cache rows bit for bit those of the same variant's f32 product followed by
the rope_qkv launch, on every tile variant with ragged M, N and K and pos0 > 0; against the
numpy twin; nothing written outside the rows it owns; engine logits the same bit for bit with
and without it (prefill, then an M = 1 decode step, which takes the rope launch)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import prefill_and_step
from gpu_helpers import rel_err as _rel

from minfer.cuda.paths.f16.gemm import (
    TILES,
    TMA,
    WGMMA,
    RopeRef,
    gemm_f16_nt,
    gemm_f16_nt_ref,
    rope_epilogue_pays,
)
from minfer.cuda.runtime import devarray as da
from minfer.errors import BadInput, GPUError

pytestmark = pytest.mark.gpu
BASE = 10000.0


def _setup(rt, M, Hq, Hkv, D, rope_dim, S, seed):
    from minfer.cuda.ops import layers as L

    rng = np.random.default_rng([seed, M, Hq, Hkv, D])
    K = 8 * int(rng.integers(3, 40))
    a = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal(((Hq + 2 * Hkv) * D, K)) * 0.1).astype(np.float16)
    table = L.RopeTable.build(rt, S, BASE, rope_dim)
    nan = lambda shape: da.to_device(rt, np.full(shape, np.nan, np.float16))  # noqa: E731
    bufs = [nan((M, Hq, D)), nan((S, Hkv, D)), nan((S, Hkv, D))]
    return a, w, table, bufs


@pytest.mark.parametrize("variant", sorted(TILES) + sorted(WGMMA) + sorted(TMA) + [None])
def test_rope_epilogue_is_rope_qkv_bit_for_bit(rt, variant, same_bytes):
    from minfer.cuda.ops import layers as L

    if (variant in WGMMA or variant in TMA) and rt.arch != "sm_90":
        pytest.skip("wgmma kernels need sm_90")
    # (M, Hq, Hkv, D, rope_dim, pos0): N = (Hq + 2 Hkv) D ragged against every tile; a partial
    # rope_dim (pass-through pairs); M = 1 (EPILOGUE_TILE by default)
    # (D = 96: 128 % D != 0, every batch of fragments loads its own angles)
    for M, Hq, Hkv, D, rd, pos0 in (
        (133, 6, 2, 64, 64, 5),
        (300, 4, 1, 128, 128, 0),
        (17, 3, 3, 32, 16, 40),
        (50, 2, 1, 96, 64, 3),
        (1, 2, 1, 64, 64, 9),
    ):
        if variant is not None and M == 1:
            continue
        S = pos0 + M + 3
        a, w, table, (q16, kc, vc) = _setup(rt, M, Hq, Hkv, D, rd, S, seed=1)
        pos = da.to_device(rt, L.tok_layout(pos0, M))
        dA, dW = da.to_device(rt, a), da.to_device(rt, w)
        target = L.QkvRope(rt, q16, kc, vc, table, pos, rd, neox=False)
        gemm_f16_nt(dA, dW, rt=rt, variant=variant, rope=target, hi=pos0 + M)
        # the reference: the same variant's f32 product, then the rope launch
        from minfer.cuda.paths.f16.gemm import EPILOGUE_TILE

        qkv = gemm_f16_nt(
            dA, dW, np.float32, rt=rt, variant=variant or (EPILOGUE_TILE if M == 1 else None)
        )
        rq, rk, rv = (da.to_device(rt, np.full(x.shape, np.nan, np.float16)) for x in (q16, kc, vc))
        qd, kd = Hq * D, Hkv * D
        L.rope_qkv(rt, rq, qkv, qkv, qkv, rk, rv, table, pos0 + M, pos, rd, False, (0, qd, qd + kd))
        rt.synchronize()
        tag = f"{variant} M={M} D={D} rope_dim={rd} pos0={pos0}"
        for got, ref in ((q16, rq), (kc, rk), (vc, rv)):
            assert same_bytes(got, ref.get()), f"{tag}: epilogue != f32 GEMM + rope_qkv"
        # rows outside [pos0, pos0 + M) of the caches stay untouched (NaN)
        k = kc.get().reshape(S, -1)
        assert np.isnan(k[:pos0]).all() and np.isnan(k[pos0 + M :]).all(), tag
        assert np.isfinite(k[pos0 : pos0 + M]).all(), tag
        tq, tk, tv = gemm_f16_nt_ref(a, w, rope=RopeRef(qd, kd, D, rd, BASE, pos0))
        assert _rel(q16.get().reshape(M, qd), tq) <= 1e-3, tag
        assert _rel(k[pos0 : pos0 + M], tk) <= 1e-3, tag
        assert _rel(vc.get().reshape(S, -1)[pos0 : pos0 + M], tv) <= 1e-3, tag


def test_rope_epilogue_refuses_misfits(rt):
    from minfer.cuda.ops import layers as L

    a, w, table, (q16, kc, vc) = _setup(rt, 8, 2, 1, 64, 64, 16, seed=2)
    pos = da.to_device(rt, L.tok_layout(0, 8))
    dA, dW = da.to_device(rt, a), da.to_device(rt, w)
    with pytest.raises(GPUError, match="neox"):
        L.QkvRope(rt, q16, kc, vc, table, pos, 64, neox=True)
    target = L.QkvRope(rt, q16, kc, vc, table, pos, 64, neox=False)
    with pytest.raises(GPUError, match="exceed the cache"):
        gemm_f16_nt(dA, dW, rt=rt, rope=target, hi=18)  # rows 10 .. 17 of a 16-row cache
    with pytest.raises(GPUError, match="columns"):
        gemm_f16_nt(dA, dW[:200], rt=rt, rope=target)
    with pytest.raises(BadInput, match="no out, accumulate or glu"):
        gemm_f16_nt(dA, dW, rt=rt, rope=target, out=da.empty(rt, (8, 256), np.float32))
    with pytest.raises(BadInput, match="no glu or rope epilogue"):
        gemm_f16_nt(dA[:1], dW, rt=rt, rope=target, variant="gemv_f16_r1")


def test_f16_rope_logits_bitwise(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    c = model.config
    n = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    runs = {}
    for rope in (True, False):
        b = CudaBackend(
            model,
            GemmChoice("f16", frozenset() if rope else frozenset({"rope"})),
            max_tokens=128,
            ubatch=16,
        )
        assert bool(b.rope_epi) == (rope and not c.rope_neox and not c.qkv_bias)
        # the prefill chunks (16, 16, 5 rows) take the epilogue, the decode step the rope launch
        assert rope_epilogue_pays(16, n, b.rt.sm_count, b.rt.arch)
        assert not rope_epilogue_pays(1, n, b.rt.sm_count, b.rt.arch)
        runs[rope] = prefill_and_step(b, seed=6)
    for got, ref in zip(runs[True], runs[False]):
        assert np.array_equal(got, ref)
