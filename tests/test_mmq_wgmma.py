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
from minfer.cuda.mmq_wgmma import (split6_scratch_bytes, split_scratch_bytes, wgmma6_smem,
                                   wgmma_smem, wgmma_weight_bytes)
from minfer.cuda.stream_k import SK_SLOT_BYTES, schedule, sk_items
from minfer.quants.mmq_ref import Q4_K, Q6_K, decode_q4k, decode_q6k, mmq_linear_ref
from minfer.quants.mmq_wgmma_ref import (pad_rows, repack_q4k_ref, repack_q6k_ref,
                                         split6_q8_1_ref, split_q8_1_ref, unblock_q6k_tables)
from minfer.quants.q8_1 import quantize_q8_1_raw, unpack_q8_1_raw

KDIR = Path(__file__).parents[1] / "kernels"


def rand_q4k(rng, N, K):
    w = rng.integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
    for off in (0, 2):   # finite d / dmin
        w[..., off:off + 2] = rng.uniform(1e-3, 2e-2, (N, K // 256)).astype(np.float16).view(
            np.uint8).reshape(N, K // 256, 2)
    return w.reshape(N, -1)


def rand_q6k(rng, N, K):
    """Random q6_K rows: any ql / qh bytes, int8 scales over the full range, finite f16 d."""
    w = rng.integers(0, 256, (N, K // 256, 210), dtype=np.uint8)
    w[..., 208:210] = rng.uniform(1e-4, 2e-3, (N, K // 256)).astype(np.float16).view(
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


def test_split6_ref_layout():
    """q6_K activations: each 32-chunk as [q+128 of half 0 | 32 zeros | q+128 of half 1], and
    the blocked tables hold da * 2^75 and da * (half sums), padding tokens zero."""
    rng = np.random.default_rng(3)
    M, K = 70, 512
    x = rng.standard_normal((M, K)).astype(np.float32) * 2
    xq, tx = split6_q8_1_ref(x)
    d, q, _ = unpack_q8_1_raw(quantize_q8_1_raw(x), K)
    assert xq.shape == (M, 2 * K) and tx.shape == (2, K // 128, 5120)
    ch = xq.reshape(M, K // 32, 64).astype(np.int16)
    qq = q.reshape(M, K // 32, 2, 16).astype(np.int16)
    assert np.array_equal(ch[..., :16] - 128, qq[:, :, 0])
    assert np.array_equal(ch[..., 48:] - 128, qq[:, :, 1])
    assert not ch[..., 16:48].any()
    assert split6_scratch_bytes(M, K) == xq.nbytes + tx.nbytes
    td, xs, _, _ = unblock_q6k_tables(tx, np.zeros((1, K // 128, 16384), np.uint8), M, 1, K)
    assert np.array_equal(td, d * np.float32(2.0**75))
    A = qq.astype(np.float64).sum(-1).reshape(M, K // 16)
    assert np.allclose(xs, np.repeat(d, 2, axis=1) * A, rtol=2**-20, atol=0)
    pad = tx[1].reshape(K // 128, 5120)   # token tile 1 holds tokens 64..69, then padding
    tdp = pad[:, :1024].copy().view(np.float32).reshape(K // 128, 4, 64)
    assert tdp[:, :, : M - 64].all() and not tdp[:, :, M - 64:].any()


def test_repack6_ref_fields():
    rng = np.random.default_rng(4)
    N, K = 150, 512
    w = rand_q6k(rng, N, K)
    wq, tw = repack_q6k_ref(w, N, K)
    dsv16, qm = decode_q6k(w, N, K)
    assert wq.dtype == np.uint8 and tw.shape == (2, K // 128, 16384)
    assert np.array_equal(wq.astype(np.int16) - 32, qm) and wq.max() <= 63
    assert wgmma_weight_bytes(N, K, Q6_K) == wq.nbytes + tw.nbytes
    _, _, tb, wm = unblock_q6k_tables(np.zeros((1, K // 128, 5120), np.uint8), tw, 1, N, K)
    ds = dsv16.reshape(N, K // 32, 2)
    assert np.array_equal(tb[..., 0], ds[..., 0] * np.float32(2.0**74))
    assert np.array_equal(tb[..., 1], ds[..., 1] * np.float32(2.0**74))
    Q = wq.reshape(N, K // 16, 16).astype(np.int64).sum(-1)
    I = (dsv16.astype(np.float64) * Q).reshape(N, K // 32, 2).sum(-1)
    assert np.allclose(tb[..., 2], -128 * I * 2.0**-75, rtol=1e-6)
    assert np.allclose(wm, -32.0 * dsv16, rtol=2**-20, atol=0)
    assert not tb[..., 3].any()
    rows = tw[1].reshape(K // 128, 16384)[:, :8192].copy().view(np.float32).reshape(-1, 4, 128, 4)
    assert not rows[:, :, N - 128:].any()   # row tile 1: rows 128..149, then zero padding


def emulate_q6k(xq, tx, wq, tw, M, N, K, bias_sign=1.0):
    """mmq_wgmma_q6k.cu's epilogue in f32 (fma emulated in float64): per chunk and half
    D_h = Xq . Wq over the half's padded 32 bytes (u8 x u8), t = fma(D_0, c0, b),
    t = fma(D_1, c1, t), y = fma(t, da 2^75, y); then y += sum_h wm * xs (the -32 term)."""
    td, xs, tb, wm = unblock_q6k_tables(tx, tw, M, N, K)
    X = xq.reshape(M, K // 32, 64).astype(np.int64)
    W = wq.reshape(N, K // 32, 32).astype(np.int64)
    y = np.zeros((M, N), np.float32)
    for c in range(K // 32):
        t = np.broadcast_to(bias_sign * tb[None, :, c, 2].astype(np.float64), (M, N))
        for h in range(2):
            D = X[:, c, 32 * h:32 * h + 32] @ W[:, c].T
            assert D.min() >= 0 and D.max() < 2**23
            den = D.astype(np.int32).view(np.float32).astype(np.float64)
            t = (den * tb[None, :, c, h] + t).astype(np.float32).astype(np.float64)
        y = (t * td[:, c, None] + y).astype(np.float32)
    return (y + xs @ wm.T).astype(np.float32)


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("M,N,K", [(37, 70, 512), (1, 8, 256), (130, 19, 768)])
def test_kernel_algebra_matches_mmq_math(qtype, M, N, K):
    """The kernels' epilogues on their layouts give mmq_ref's math (their oracle) to f32
    rounding: the denormal reading, the 2^74 / 2^75 scalings, the u8 bias, the min term (q4_K)
    or the zero-padded halves and the -32 A_h term (q6_K); without the bias term it is far off."""
    rand, split, repack, emulate = ((rand_q6k, split6_q8_1_ref, repack_q6k_ref, emulate_q6k)
                                    if qtype == Q6_K else
                                    (rand_q4k, split_q8_1_ref, repack_q4k_ref, emulate_kernel))
    rng = np.random.default_rng(M * 7 + N + K + qtype)
    w = rand(rng, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, qtype, M, N, K)
    args = (*split(x), *repack(w, N, K), M, N, K)
    assert np.linalg.norm(emulate(*args) - ref) / np.linalg.norm(ref) < 1e-5
    bad = emulate(*args, bias_sign=0.0)
    assert np.linalg.norm(bad - ref) / np.linalg.norm(ref) > 1e-1


def test_wgmma_smem_matches_kernel():
    src = (KDIR / "mmq_wgmma_q4k.cu").read_text()
    pinned = re.findall(r"WgSmem<(\d+), (\d)>::BYTES == (\d+)", src)
    assert pinned
    for bn, st, b in pinned:
        assert wgmma_smem(int(bn), int(st)) == int(b)
    assert wgmma_smem() == 136192   # the launcher's default: BN = 128, 3 stages
    src6 = (KDIR / "mmq_wgmma_q6k.cu").read_text()
    pinned6 = re.findall(r"Q6Smem<(\d)>::BYTES == (\d+)", src6)
    assert pinned6
    for st, b in pinned6:
        assert wgmma6_smem(int(st)) == int(b)


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
    assert pick_variant(on, 232448, 14, "sm_90").kind == "wgmma"         # q6_K too
    q4only = GemmConfig(mmq=True, wgmma_q6k=False)
    assert q4only.label() == "mmq-wgmma-q4k-kd4"
    assert pick_variant(q4only, 232448, 14, "sm_90").label == "wide-kd4"
    assert pick_variant(q4only, 232448, 12, "sm_90").kind == "wgmma"
    assert pick_variant(on, 160000, 14, "sm_90").label == "wide-kd4"     # q6_K wgmma over the cap
    assert pick_variant(on, 232448, 12, "sm_80").label == "wide-kd4"     # not Hopper
    assert pick_variant(on, 232448, 12, None).label == "wide-kd4"        # arch unknown
    off = GemmConfig(mmq=True, wgmma=False)
    assert pick_variant(off, 232448, 12, "sm_90").label == "wide-kd4"
    assert pick_variant(GemmConfig(mmq=True, wide=False), 232448, 12, "sm_90").kind == "narrow"
    assert pick_variant(on, 101376, 12, "sm_90").kind == "wide"          # wgmma over the cap
    assert pick_gemm(12, 512, 4096, 4096, on, _Rt(232448, "sm_90")) == "mmq-wgmma"
    assert pick_gemm(14, 512, 4096, 4096, on, _Rt(232448, "sm_90")) == "mmq-wgmma"
    assert pick_gemm(14, 512, 4096, 4096, q4only, _Rt(232448, "sm_90")) == "mmq-wide-kd4"
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
    plan = plan_memory(m, routes, 128, 64, sms=132)
    assert plan["MMQ stream-K workspace"] == 132 * (SK_SLOT_BYTES + 4)
    f16 = plan_routes(m, GemmConfig(mmq=False), _Rt(232448, "sm_90"), 64)
    assert plan_memory(m, f16, 128, 64, sms=132)["MMQ stream-K workspace"] == 0
    raw = sum(int(m.tensor(n).data.nbytes) for n, (p, _) in routes.items()
              if p.startswith("mmq") and p != "mmq-wgmma" and n != "token_embd.weight")
    assert plan["MMQ weights"] == raw + sum(
        wgmma_weight_bytes(*m.tensor(n).shape, m.tensor(n).qtype) for n in wg)
    for qt, key, size in ((Q4_K, "q8_1 split scratch", split_scratch_bytes),
                          (Q6_K, "q8_1 split6 scratch", split6_scratch_bytes)):
        ks = [int(m.tensor(n).shape[1]) for n in wg if m.tensor(n).qtype == qt]
        assert ks, f"the tiny Q4_K_M model has {qt} wgmma weights"
        assert plan[key] == size(64, max(ks))
    assert 0 < plan["MMQ repack staging"] <= sum(int(m.tensor(n).data.nbytes) for n in wg)


@pytest.mark.parametrize("tiles,sms,want", [(100, 132, (100, 100)), (264, 132, (264 // 2, 264)),
                                            (160, 132, (132, 0)), (896, 132, (132, 660)),
                                            (256, 132, (132, 0)), (7, 3, (3, 3))])
def test_schedule(tiles, sms, want):
    """One wave or whole waves: all round-robin; a ragged last wave: the last 1-2 waves' tiles
    (between grid and 2 * grid) go stream-K. Off, or not persistent: whole tiles."""
    assert schedule(tiles, sms) == want
    assert schedule(tiles, sms, stream_k=False) == (min(tiles, sms), tiles)
    assert schedule(tiles, sms, persist=False) == (tiles, tiles)


@pytest.mark.parametrize("tiles,KT,sms", [(160, 32, 132), (192, 32, 132), (896, 32, 132),
                                          (7, 2, 3), (6, 5, 4), (9, 1, 4), (24, 4, 5),
                                          (401, 112, 132), (133, 3, 132)])
def test_sk_items_cover_every_stage_once(tiles, KT, sms):
    """The twin of the kernels' TileSched under `schedule`: every (tile, stage) exactly once;
    a split tile has two parts, its tail (k0 > 0) the first stream-K item of block b+1 and its
    head (k0 == 0, k1 < KT) the last item of block b, the pairing sk_put / sk_add rely on."""
    grid, dp = schedule(tiles, sms)
    items = sk_items(tiles, KT, grid, dp)
    cover = np.zeros((tiles, KT), np.int32)
    parts: dict[int, list] = {}
    for b, its in enumerate(items):
        for i, (t, k0, k1) in enumerate(its):
            assert 0 <= k0 < k1 <= KT
            cover[t, k0:k1] += 1
            parts.setdefault(t, []).append((b, i, k0, k1))
    assert (cover == 1).all()
    for t, ps in parts.items():
        assert len(ps) <= 2
        if len(ps) == 2:
            (bh, ih, h0, h1), (bt, it, t0, t1) = sorted(ps, key=lambda p: p[2])
            assert h0 == 0 and h1 == t0 and t1 == KT and bt == bh + 1
            assert ih == len(items[bh]) - 1          # the head: block b's last item
            assert it == sum(1 for x in items[bt] if x[0] < dp)   # the tail: b+1's first SK item
    loads = [sum(k1 - k0 for _, k0, k1 in its) for its in items]
    assert max(loads) - min(loads) <= KT + 1   # stream-K evens the work out to a tile


def test_stream_k_and_fused_prepass_config():
    env = {"MINFER_MMQ": "1", "MINFER_MMQ_STREAMK": "0"}
    cfg = GemmConfig.resolve(env)
    assert not cfg.stream_k and cfg.label() == "mmq-wgmma-kd4-nosk"
    assert GemmConfig.resolve(env, {"MINFER_MMQ_STREAMK": "1"}).label() == "mmq-wgmma-kd4"
    assert GemmConfig(mmq=True, wgmma=False, stream_k=False).label() == "mmq-wide-kd4"
    cfg = GemmConfig.resolve({"MINFER_MMQ": "1", "MINFER_MMQ_FUSED_PREPASS": "0"})
    assert not cfg.fused_prepass and cfg.label() == "mmq-wgmma-kd4-nofp"
    from minfer.commands.gemm_flags import gemm_config

    assert gemm_config(mmq=True, mmq_stream_k=False, mmq_fused_prepass=False, env={}) == \
        GemmConfig(mmq=True, stream_k=False, fused_prepass=False)


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
def test_split_swiglu_ref(qtype):
    """The swiglu prepass twin: the fused [gate | up] and separate inputs agree, and it is the
    split twin of the f16-rounded swiglu (what the unfused engine feeds the prepass)."""
    from minfer.quants.mmq_wgmma_ref import split_swiglu_ref
    from minfer.reference.ops import swiglu

    rng = np.random.default_rng(4)
    g, u = (3 * rng.standard_normal((2, 70, 256))).astype(np.float32)
    fused = split_swiglu_ref(qtype, np.concatenate([g, u], axis=1))
    apart = split_swiglu_ref(qtype, g, u)
    x = swiglu(g, u).astype(np.float16).astype(np.float32)
    split = split6_q8_1_ref if qtype == Q6_K else split_q8_1_ref
    for a, b, c in zip(fused, apart, split(x)):
        assert np.array_equal(a, b) and np.array_equal(a, c)
