"""GPU: q8_1 prepass bit-exactness and every MMQ variant vs the numpy twin (mmq_ref)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

Q4_K, Q6_K = 12, 14


def _weights(rng, qtype, N, K):
    """Random q4_K / q6_K blocks with valid f16 scales (d, dmin)."""
    kb = K // 256
    nbytes = 144 if qtype == Q4_K else 210
    w = rng.integers(0, 256, (N, kb, nbytes), dtype=np.uint8)
    for off in ((0, 2) if qtype == Q4_K else (208,)):
        w[..., off:off + 2] = rng.uniform(1e-4, 2e-2, (N, kb)).astype(np.float16).view(
            np.uint8).reshape(N, kb, 2)
    return w.reshape(N, -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_q8_1_bit_identical(rt, dtype):
    from minfer.cuda import devarray as da
    from minfer.cuda.mmq import quantize_q8_1
    from minfer.quants.q8_1 import quantize_q8_1_raw

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((33, 1024)) * rng.uniform(0.01, 50, (33, 1))).astype(dtype)
    x[2, :32] = 0
    got = quantize_q8_1(rt, da.to_device(rt, x)).get()
    np.testing.assert_array_equal(got, quantize_q8_1_raw(x.astype(np.float32)))


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("variant", ["r1", "narrow", "wide-kd4", "wide-kd8"])
@pytest.mark.parametrize("M,N,K", [(1, 9, 256), (37, 200, 512), (64, 128, 1024),
                                   (130, 333, 2048)])
def test_mmq_parity(rt, qtype, variant, M, N, K):
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import mmq_linear
    from minfer.quants.mmq_ref import mmq_linear_ref

    cfg = {"r1": GemmConfig(mmq=True, raw=False), "narrow": GemmConfig(mmq=True, wide=False),
           "wide-kd4": GemmConfig(mmq=True, kd=4, wgmma=False),
           "wide-kd8": GemmConfig(mmq=True, kd=8, wgmma=False)}[variant]   # wgmma: test_wgmma_device
    rng = np.random.default_rng(M + N + K + qtype)
    w = _weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, qtype, M, N, K)
    out = da.to_device(rt, np.full((M, N), np.nan, np.float32))   # poisoned: all must be written
    wd = da.to_device(rt, w.reshape(-1))
    ran = mmq_linear(rt, da.to_device(rt, x), wd, qtype, M, N, K, cfg, out)
    y = out.get()
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) <= 1e-3 * np.linalg.norm(ref)
    assert ran.label == variant or ran.fallback
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    mmq_linear(rt, da.to_device(rt, x), wd, qtype, M, N, K, cfg, acc, accumulate=True)
    assert np.linalg.norm(acc.get() - (base + ref)) <= 1e-3 * np.linalg.norm(base + ref)


def test_smem_guard_falls_back_loudly():
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import pick_variant, wide_smem

    v = pick_variant(GemmConfig(mmq=True, kd=8), wide_smem(8) - 1)
    assert v.kind == "narrow" and "narrow" in v.fallback and str(wide_smem(8)) in v.fallback
    assert pick_variant(GemmConfig(mmq=True, kd=4), wide_smem(4)).kind == "wide"


def test_mmq_rejects_bad_shapes(rt):
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import mmq_linear
    from minfer.errors import GPUError, Unsupported

    x = da.to_device(rt, np.zeros((4, 384), np.float32))
    w = da.to_device(rt, np.zeros(4 * 2 * 144, np.uint8))
    out = da.to_device(rt, np.zeros((4, 4), np.float32))
    with pytest.raises(GPUError):
        mmq_linear(rt, x, w, Q4_K, 4, 4, 384, GemmConfig(mmq=True), out)
    with pytest.raises(Unsupported):
        mmq_linear(rt, x, w, 8, 4, 4, 512, GemmConfig(mmq=True), out)
