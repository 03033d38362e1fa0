"""CPU: the wgmma MMQ path's layouts and algebra (minfer.quants.mmq_wgmma_ref, kernels/
mmq_wgmma_q4k.cu), its smem budget, and where pick_variant sends it. The device side (bitwise
layouts, parity, the engine on it) is tests/gpu/test_mmq_wgmma.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from minfer.cuda.config import GemmConfig
from minfer.cuda.dispatch import pick_gemm
from minfer.cuda.mmq import pick_variant
from minfer.cuda.mmq_wgmma import split_scratch_bytes, wgmma_smem, wgmma_weight_bytes
from minfer.quants.mmq_ref import Q4_K, decode_q4k, mmq_linear_ref
from minfer.quants.mmq_wgmma_ref import pad_rows, repack_q4k_ref, split_q8_1_ref
from minfer.quants.q8_1 import quantize_q8_1_raw, unpack_q8_1_raw

KDIR = Path(__file__).parents[1] / "kernels"


def rand_q4k(rng, N, K):
    w = rng.integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
    for off in (0, 2):   # finite d / dmin
        w[..., off:off + 2] = rng.uniform(1e-3, 2e-2, (N, K // 256)).astype(np.float16).view(
            np.uint8).reshape(N, K // 256, 2)
    return w.reshape(N, -1)


def test_split_ref_is_the_q8_1_prepass():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 512)).astype(np.float32) * 3
    aq, ta = split_q8_1_ref(x)
    d, q, s = unpack_q8_1_raw(quantize_q8_1_raw(x), 512)
    assert aq.dtype == np.uint8 and ta.shape == (16, pad_rows(37), 2) == (16, 128, 2)
    assert np.array_equal(aq.astype(np.int16) - 128, q.astype(np.int16))
    assert np.array_equal(ta[:, :37, 0], (d * np.float32(2.0**75)).T)   # exact power-of-2 scale
    assert np.array_equal(ta[:, :37, 1], (d * s.astype(np.float32)).T)
    assert not ta[:, 37:].any()


def test_repack_ref_fields():
    rng = np.random.default_rng(1)
    N, K = 70, 512
    w = rand_q4k(rng, N, K)
    wq, tw = repack_q4k_ref(w, N, K)
    dsv, dmv, v = decode_q4k(w, N, K)
    assert tw.shape == (2, K // 32, pad_rows(N), 2) and tw.dtype == np.uint32
    assert np.array_equal(wq, v) and wq.max() <= 15
    tb = tw[0].view(np.float32)
    assert np.array_equal(tb[:, :N, 0], (dsv * np.float32(2.0**74)).T)
    V = v.reshape(N, K // 32, 32).astype(np.int64).sum(-1)
    assert np.allclose(tb[:, :N, 1].T, -128 * V * dsv * 2.0**-75, rtol=1e-6)
    hi, lo = tw[1, :, :N, 0].view(np.float32), tw[1, :, :N, 1].view(np.float32)
    assert np.allclose(hi.astype(np.float64) + lo, dmv.T, rtol=2**-20, atol=0)
    assert not tw[:, :, N:].any()


def emulate_kernel(aq, ta, wq, tw, M, N, K, bias_sign=1.0):
    """The kernel's epilogue in f32 (fma emulated in float64, exact for these operands):
    per chunk D = Aq . Wq (u8 x u8), t = fma(D as f32 bits, Tb.x, Tb.y), y = fma(t, Ta.x, y),
    then the min term y += Ta.y * (Tm.hi + Tm.lo)."""
    tb, tm = tw[0].view(np.float32), tw[1].view(np.float32)
    y = np.zeros((M, N), np.float32)
    for c in range(K // 32):
        ks = slice(32 * c, 32 * c + 32)
        D = aq[:, ks].astype(np.int64) @ wq[:, ks].astype(np.int64).T
        assert D.min() >= 0 and D.max() < 2**23   # a denormal's bits: the f32 D * 2^-149
        den = D.astype(np.int32).view(np.float32).astype(np.float64)
        t = (den * tb[c, :N, 0] + bias_sign * tb[c, :N, 1].astype(np.float64)).astype(np.float32)
        y = (t.astype(np.float64) * ta[c, :M, 0, None] + y).astype(np.float32)
        dmv = tm[c, :N, 0].astype(np.float64) + tm[c, :N, 1]
        y = (y + ta[c, :M, 1, None].astype(np.float64) * dmv).astype(np.float32)
    return y


@pytest.mark.parametrize("M,N,K", [(37, 70, 512), (1, 8, 256), (130, 19, 768)])
def test_kernel_algebra_matches_mmq_math(M, N, K):
    """The denormal reading, the 2^74 / 2^75 scalings, the u8 bias and the min term give
    mmq_ref's math (the kernels' oracle) to f32 rounding; the bias term is not optional."""
    rng = np.random.default_rng(M + N + K)
    w = rand_q4k(rng, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, Q4_K, M, N, K)
    aq, ta = split_q8_1_ref(x)
    wq, tw = repack_q4k_ref(w, N, K)
    y = emulate_kernel(aq, ta, wq, tw, M, N, K)
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel < 1e-5, rel
    bad = emulate_kernel(aq, ta, wq, tw, M, N, K, bias_sign=0.0)
    assert np.linalg.norm(bad - ref) / np.linalg.norm(ref) > 1e-1


def test_wgmma_smem_matches_kernel():
    src = (KDIR / "mmq_wgmma_q4k.cu").read_text()
    pinned = re.findall(r"WgSmem<(\d+), (\d)>::BYTES == (\d+)", src)
    assert pinned
    for bn, st, b in pinned:
        assert wgmma_smem(int(bn), int(st)) == int(b)
    assert wgmma_smem() == 136192   # the launcher's default: BN = 128, 3 stages


def test_sizes():
    assert wgmma_weight_bytes(4096, 4096) == 4096 * 4096 + 2 * 128 * 4096 * 8
    assert split_scratch_bytes(77, 512) == 77 * 512 + 16 * 128 * 8   # Ta right after Aq (K % 32 == 0)


class _Rt:
    def __init__(self, cap, arch):
        self.smem_optin, self.arch = cap, arch


def test_pick_variant_wgmma():
    on = GemmConfig(mmq=True)
    assert on.wgmma and on.label() == "mmq-wgmma-kd4"
    assert pick_variant(on, 232448, 12, "sm_90").kind == "wgmma"
    assert pick_variant(on, 232448, 14, "sm_90").label == "wide-kd4"     # q6_K: no wgmma kernel
    assert pick_variant(on, 232448, 12, "sm_80").label == "wide-kd4"     # not Hopper
    assert pick_variant(on, 232448, 12, None).label == "wide-kd4"        # arch unknown
    off = GemmConfig(mmq=True, wgmma=False)
    assert pick_variant(off, 232448, 12, "sm_90").label == "wide-kd4"
    assert pick_variant(GemmConfig(mmq=True, wide=False), 232448, 12, "sm_90").kind == "narrow"
    assert pick_variant(on, 101376, 12, "sm_90").kind == "wide"          # wgmma over the cap
    assert pick_gemm(12, 512, 4096, 4096, on, _Rt(232448, "sm_90")) == "mmq-wgmma"
    assert pick_gemm(14, 512, 4096, 4096, on, _Rt(232448, "sm_90")) == "mmq-wide-kd4"
    assert pick_gemm(12, 512, 4096, 4096, on) == "mmq-wide-kd4"          # CPU planning


def test_plan_memory_counts_repacked_weights(tmp_path):
    """A wgmma route's weight is planned at its repacked size, with the split scratch and the
    repack staging (a fused group's raw bytes) beside it."""
    from synth_data import tiny_model

    from minfer.cuda.routes import plan_routes
    from minfer.cuda.weights import plan_memory
    from minfer.loader import load_model

    m = load_model(tiny_model(tmp_path, seed=2, workers=None))
    routes = plan_routes(m, GemmConfig(mmq=True), _Rt(232448, "sm_90"), 64)
    wg = [n for n, (p, _) in routes.items() if p == "mmq-wgmma"]
    assert wg, "the tiny Q4_K_M model has q4_K GEMM weights"
    plan = plan_memory(m, routes, 128, 64)
    raw = sum(int(m.tensor(n).data.nbytes) for n, (p, _) in routes.items()
              if p.startswith("mmq") and p != "mmq-wgmma" and n != "token_embd.weight")
    assert plan["MMQ weights"] == raw + sum(wgmma_weight_bytes(*m.tensor(n).shape) for n in wg)
    K = max(int(m.tensor(n).shape[1]) for n in wg)
    assert plan["q8_1 split scratch"] == split_scratch_bytes(64, K)
    assert 0 < plan["MMQ repack staging"] <= sum(int(m.tensor(n).data.nbytes) for n in wg)
