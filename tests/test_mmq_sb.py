"""The super-block MMQ path on the CPU: its operand twins (the q8s split, the q4_K repack and
token tables), the kernels' arithmetic on them against the float64 oracle, the
integer bounds it relies on, the smem pins, the routing / memory plan."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from minfer.cuda.ops.mmq_sb import sb_smem, sb_token_bytes, sb_weight_bytes
from minfer.quants.mmq_ref import decode_q4k, mmq_linear_ref, q4k_scales
from minfer.quants.mmq_sb_ref import (SB_TH0, SB_WH0, block_b16_sb, emulate_sb_q4k,
                                      mmq_sb_linear_ref, quantize_q8s, repack_q4k_sb_ref,
                                      sb_image, sb_operand_parts, sb_pos, sb_q4k_tables_ref,
                                      sb_scales, sb_token_tables_ref, sb_tokens_ref, sb_unimage,
                                      split_q8s_ref, unblock_b16_sb, pad_rows)
from minfer.quants.q8_1 import quantize_q8_1_raw, unpack_q8_1_raw
from quant_data import rand_q4k

KDIR = Path(__file__).resolve().parents[1] / "kernels"


def test_q8s_is_q8_1_rounding_per_256():
    """A row whose 256-block has one scale quantizes like q8_1 would with that amax: the same
    d (f16-rounded), the same round-half-away q."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    d, q = quantize_q8s(x)
    assert d.shape == (3, 2) and q.shape == (3, 512)
    # q8_1 of a block holding the 256-block's amax at one position and the values scaled to
    # it: same rule, so the same integers where the block scale matches
    amax = np.abs(x.reshape(3, 2, 256)).max(-1)
    assert np.array_equal(d, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.abs(q).max() == 127 and np.all(np.abs(q.astype(np.float64) * np.repeat(d, 256, 1)
                                                    - x) <= np.repeat(d, 256, 1) * 0.5 + 1e-3)
    # one block of 32 equal to a whole 256-block's values: q8_1 gives the same q there
    x1 = np.tile(x[:, :32], (1, 8))
    _, q1 = quantize_q8s(x1)
    _, qq, _ = unpack_q8_1_raw(quantize_q8_1_raw(x1), 256)
    assert np.array_equal(q1, qq)


def test_split_q8s_layout():
    rng = np.random.default_rng(1)
    M, K = 37, 512
    x = rng.standard_normal((M, K)).astype(np.float32) * 3
    aq, ta = split_q8s_ref(x)
    d, q = quantize_q8s(x)
    assert aq.dtype == np.uint8 and ta.shape == (K // 32, pad_rows(M), 2)
    assert np.array_equal(aq.astype(np.int16) - 128, q)
    s = q.reshape(M, K // 32, 32).astype(np.int32).sum(-1)
    assert np.array_equal(ta[:, :M, 0], (np.repeat(d, 8, 1) * np.float32(2.0**75)).T)
    assert np.array_equal(ta[:8, :M, 0], np.broadcast_to(ta[:1, :M, 0], (8, M)))   # one da per 256
    assert np.array_equal(ta[:, :M, 1], (np.repeat(d, 8, 1) * s.astype(np.float32)).T)
    assert not ta[:, M:].any()


def test_repack_sb_fields():
    """q4_K: v holds the nibbles; the table block's mc / b / fmin / Am sit at the documented
    positions (row pairs (r, r+8), 512 B a table) with d sc 2^74, the u8 bias, -dmin 2^-75 and
    the 6-bit mins m, 64 m as f16."""
    rng = np.random.default_rng(2)
    N, K = 150, 512
    w = rand_q4k(rng, N, K)
    wq, tw = sb_q4k_tables_ref(w, N, K)
    dsv, dmv, v = decode_q4k(w, N, K)
    sc = sb_scales(w, N, K)
    assert np.array_equal(wq, v) and wq.max() <= 15
    # the operand blocks: the images and the tables, split at the first stage's part
    wb = repack_q4k_sb_ref(w, N, K)
    assert wb.nbytes == sb_weight_bytes(N, K)
    img, tab = sb_operand_parts(wb, SB_WH0)
    assert np.array_equal(tab, tw) and np.array_equal(sb_unimage(img, N), v)
    blk = tw.view(np.float32).reshape(K // 256, pad_rows(N) // 128, 2304)
    dmin, mins = (q4k_scales(w, N, K)[i] for i in (1, 3))
    d = dsv[:, ::8] / sc[:, ::8].clip(1)   # (sc may be 0: compare where it is not)

    def at(row):   # the float index of a row in a [64 pairs][2] table
        r = row % 128
        return ((r // 16) * 8 + r % 8) * 2 + (r // 8) % 2

    for row, sbk, c in ((0, 0, 0), (9, 1, 3), (137, 1, 6), (149, 0, 7)):
        off = (c % 4) * 128 + (640 if c >= 4 else 0)
        mc = blk[sbk, row // 128, off + at(row)]
        assert mc == np.float32(dsv[row, 8 * sbk + c]) * np.float32(2.0**74)
        vv = v[row, 256 * sbk:256 * sbk + 256].reshape(8, 32).astype(np.int64).sum(-1)
        bias = blk[sbk, row // 128, 512 + at(row)]
        want = np.float64(-128 * (sc[row, 8 * sbk:8 * sbk + 8] * vv).sum())
        assert np.isclose(bias, want * q4k_d(w, N, K)[row, sbk] * 2.0**-75, rtol=1e-6)
        assert blk[sbk, row // 128, 1152 + at(row)] == -dmin[row, sbk] * np.float32(2.0**-75)
        # Am: pair, t = c // 2, (k < 8 | k >= 8), (row r | r+8), c % 2; A = [m | 64 m]
        am = blk[sbk, row // 128, 1280:].view(np.float16).reshape(64, 4, 2, 2, 2)
        r = row % 128
        m = int(mins[row, sbk, c])
        assert m * -dmin[row, sbk] == dmv[row, 8 * sbk + c]
        assert am[(r // 16) * 8 + r % 8, c // 2, 0, (r // 8) % 2, c % 2] == m
        assert am[(r // 16) * 8 + r % 8, c // 2, 1, (r // 8) % 2, c % 2] == 64 * m
    assert d.shape == (N, K // 256)
    # rows past N are zero
    pad = [at(row) for row in range(N, pad_rows(N))]
    assert not blk[:, 1, pad].any()


def q4k_d(w, N, K):
    return q4k_scales(w, N, K)[0]


def test_sb_token_tables():
    """r = dc of the previous super-block / dc, dc = da 2^75 (1 for an all-zero block), at the
    fold's positions; B = the chunk sums of q as f16 (lo, hi), s = 64 hi + lo."""
    rng = np.random.default_rng(3)
    M, K = 150, 768
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[7, 256:512] = 0
    aq, ta = split_q8s_ref(x)
    tt = sb_token_tables_ref(aq, ta, M, K)
    op = sb_tokens_ref(aq, ta, M, K)
    assert op.nbytes == sb_token_bytes(M, K)
    img, tab = sb_operand_parts(op, SB_TH0)
    assert np.array_equal(tab, tt) and np.array_equal(sb_unimage(img, M), aq)
    t = tt.view(np.float32).reshape(K // 256, pad_rows(M) // 128, 1280)
    sq = (aq.astype(np.int32) - 128).reshape(M, K // 32, 32).sum(-1)
    lo, hi = unblock_b16_sb(tt.reshape(K // 256, -1, 5120)[:, :, 512:4608].copy(), K,
                            pad_rows(M))
    pos = sb_pos()
    assert sorted(pos) == list(range(128))
    for m, sbk in ((0, 0), (7, 1), (7, 2), (130, 2)):
        dc = lambda s: ta[8 * s, m, 0] if ta[8 * s, m, 0] != 0 else np.float32(1)   # noqa: E731
        assert t[sbk, m // 128, 1152 + pos[m % 128]] == dc(sbk)
        want_r = np.float32((np.float32(1) if sbk == 0 else dc(sbk - 1)) / dc(sbk))
        assert t[sbk, m // 128, pos[m % 128]] == want_r
        for c in range(8):
            j = 8 * sbk + c
            assert 0 <= lo[j, m] < 64 and 64 * np.float64(hi[j, m]) + lo[j, m] == sq[m, j]
    assert ta[8, 7, 0] == 0 and t[1, 0, 1152 + pos[7]] == 1   # the zero block's unit
    assert not lo[:, M:].any() and not hi[:, M:].any()


@pytest.mark.parametrize("M,N,K", [(37, 200, 512), (1, 8, 256), (130, 19, 768)])
def test_sb_algebra_matches_oracle(M, N, K):
    """The kernel's arithmetic (z = z r + b per super-block, z += S mc per chunk, the 3xTF32
    min term, y = z dc) on the twins' operands gives the oracle; without the per-super-block
    rescale it is far off."""
    rng = np.random.default_rng(M + N + K)
    w = rand_q4k(rng, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if M > 1:
        x[M // 2, :256] = 0   # an all-zero super-block: its unit stays finite
    ref = mmq_sb_linear_ref(x, w, M, N, K)
    aq, ta = split_q8s_ref(x)
    args = (sb_tokens_ref(aq, ta, M, K), repack_q4k_sb_ref(w, N, K), M, N, K)
    assert np.linalg.norm(emulate_sb_q4k(*args) - ref) / np.linalg.norm(ref) < 1e-5
    if K > 256:
        bad = emulate_sb_q4k(*args, rescale=False)
        assert np.linalg.norm(bad - ref) / np.linalg.norm(ref) > 1e-1
    # and the q8s oracle stays close to q8_1's MMQ math (a coarser activation grid, not a
    # different product)
    q81 = mmq_linear_ref(x, w, 12, M, N, K)
    assert np.linalg.norm(ref - q81) / np.linalg.norm(q81) < 0.05


def test_integer_sums_fit_a_denormal():
    """The worst chunk: every qa + 128 = 255 and every v = 15 over 32 k."""
    assert 32 * 255 * 15 < 2**23


def test_sb_image_swizzle():
    """An image holds row r's 16-byte chunk c at r * 128 + (c ^ r % 8) * 16, per (super-block,
    tile, stage); rows past the matrix are zero; sb_unimage inverts it."""
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, (150, 768), dtype=np.uint8)
    img = sb_image(a, 256)
    assert img.shape == (3, 2, 2, 16384)
    for row, k in ((0, 0), (130, 256 + 128 + 5 * 16), (149, 767), (7, 300)):
        sbk, s, c, r = k // 256, k % 256 // 128, k % 128 // 16, row % 128
        at = r * 128 + ((c ^ (r % 8)) << 4) + k % 16
        assert img[sbk, row // 128, s, at] == a[row, k]
    assert not img[:, 1, :, (150 - 128) * 128:].any()
    assert np.array_equal(sb_unimage(img, 150), a)


def test_sb_operand_blocks_match_kernel():
    """The operand layout of kernels/mmq_sb_layout.cuh (table sizes, first-stage parts, block
    sizes) is the twins', and the twins' blocks have those sizes: the kernel's bulk copies take
    [image | tables' first part] and [image | the rest]."""
    from minfer.quants.mmq_sb_ref import SB_TBLK, SB_TOP, SB_WBLK, SB_WOP

    src = (KDIR / "mmq_sb_layout.cuh").read_text()
    w = re.search(r"constexpr int WBLK = (\d+), WH0 = (\d+);", src)
    t = re.search(r"constexpr int TBLK = (\d+), TH0 = (\d+);", src)
    o = re.search(r"static_assert\(WOP == (\d+) && TOP == (\d+)", src)
    assert w and t and o
    assert (int(w[1]), int(t[1]), int(w[2]), int(t[2])) == (SB_WBLK, SB_TBLK, SB_WH0, SB_TH0)
    assert (int(o[1]), int(o[2])) == (SB_WOP, SB_TOP) == (32768 + SB_WBLK, 32768 + SB_TBLK)
    # first stage: mc of chunks 0..3 and b (weights), r (tokens)
    assert (SB_WH0, SB_TH0) == (4 * 512 + 512, 512)
    rng = np.random.default_rng(4)
    aq, ta = split_q8s_ref(rng.standard_normal((3, 512)).astype(np.float32))
    assert repack_q4k_sb_ref(rand_q4k(rng, 8, 512), 8, 512).shape == (2, 1, SB_WOP)
    assert sb_tokens_ref(aq, ta, 3, 512).shape == (2, 1, SB_TOP)
    assert sb_token_tables_ref(aq, ta, 3, 512).shape == (2, 1, SB_TBLK)


def test_sb_smem_matches_kernel():
    src = (KDIR / "mmq_sb_q4k.cu").read_text()
    stage = re.search(r"static constexpr int STAGE = (\d+) \* 1024;", src)
    stages = re.search(r"#define SB_STAGES (\d+)", src)
    assert stage and stages and int(stages[1]) == 5
    pinned = re.search(r"SbSmem::BYTES == (\d+) \* 1024 \* STAGES \+ 1024 \+ 16 \* STAGES", src)
    assert pinned and int(pinned[1]) == int(stage[1])
    for n in (4, 5):   # the launcher's size for a build of n slots
        assert sb_smem(n) == n * int(stage[1]) * 1024 + 1024 + 16 * n
    assert sb_smem(5) <= 227 * 1024   # sm_90's opt-in limit per block


def test_block_b16_sb_roundtrip():
    rng = np.random.default_rng(5)
    lo, hi = (rng.integers(-2048, 2048, (16, 256)).astype(np.float16) for _ in range(2))
    l2, h2 = unblock_b16_sb(block_b16_sb(lo, hi), 512, 256)
    assert np.array_equal(l2, lo) and np.array_equal(h2, hi)
    # element (token n, k) at byte (n / 8) 256 + (k / 8) 128 + (n % 8) 16 + (k % 8) 2: the
    # kernel's plain_desc(LBO 128, SBO 256)
    b = block_b16_sb(lo, hi).view(np.uint8).reshape(2, 2, 4096)
    n, c = 133, 5
    at = (n % 128 // 8) * 256 + 128 + (n % 8) * 16 + c * 2
    assert b[0, 1, at:at + 2].view(np.float16)[0] == hi[c, n]


def test_plan_memory_sb(tmp_path):
    """SB routes (q4_K only; q6_K stays f16) are planned at their repacked size (bytes +
    tables), one operand scratch for the largest K; the glu epilogue groups."""
    from synth_data import tiny_model

    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.ops.mmq_sb import split_scratch_bytes, sb_split_bytes, sb_weight_bytes
    from minfer.cuda.plan.fusion import plan_fusion, plan_glu
    from minfer.cuda.plan.routes import plan_routes
    from minfer.cuda.plan.weights import plan_memory
    from minfer.loader import load_model

    class _Rt:
        arch, smem_optin = "sm_90", 232448

    m = load_model(tiny_model(tmp_path, seed=2, workers=None))
    routes = plan_routes(m, GemmChoice("sb"), _Rt(), 64)
    sb = [n for n, (p, _) in routes.items() if p == "sb"]
    assert {m.tensor(n).qtype for n in sb} == {12}
    assert {p for p, _ in routes.values()} == {"f16", "sb"}
    plan = plan_memory(m, routes, 128, 64, sms=132)
    assert plan["MMQ weights"] == sum(sb_weight_bytes(*m.tensor(n).shape) for n in sb)
    k4 = max(m.tensor(n).shape[1] for n in sb)
    assert plan["SB operand scratch"] == sb_split_bytes(64, k4) > split_scratch_bytes(64, k4)
    assert plan["q8_1 scratch"] == 0 and plan["MMQ stream-K workspace"] > 0
    fused = plan_fusion(m, routes)
    assert any(n in fused for n in sb)   # q|k and gate|up fuse on SB
    # the swiglu epilogue: every fused q4_K gate|up group on SB, none with sb:no-glu
    glu = plan_glu(m, GemmChoice("sb"), routes, fused)
    want = {fused[n][0] for n in sb if n.endswith("ffn_gate.weight") and n in fused}
    assert glu == want and glu and all(g.endswith("ffn_gate_up.weight") for g in glu)
    assert not plan_glu(m, GemmChoice.parse_ab("sb:no-glu", env={}), routes, fused)
    # the f16 path: every fused gate|up group, none with f16:no-glu
    r16 = plan_routes(m, GemmChoice("f16"), _Rt(), 64)
    f16_fused = plan_fusion(m, r16)
    want16 = {g for g, _, _ in f16_fused.values() if g.endswith("ffn_gate_up.weight")}
    assert want16 and plan_glu(m, GemmChoice(), r16, f16_fused) == want16
    assert not plan_glu(m, GemmChoice.parse_ab("f16:no-glu", env={}), r16, f16_fused)
    # with every layer's swiglu in its GEMM, the f32 gate|up buffer [T, 2 d_ff] is not planned
    lean = plan_memory(m, routes, 128, 64, sms=132, glu_all=True)
    assert plan["activations"] - lean["activations"] == 64 * 2 * m.config.d_ff * 4
    assert {k: v for k, v in lean.items() if k != "activations"} == \
        {k: v for k, v in plan.items() if k != "activations"}


@pytest.mark.parametrize("dtype,entry", [
    (np.float32, "quantize_q8s_split"), (np.float16, "quantize_q8s_split_f16")])
def test_split_q8s_launch(monkeypatch, dtype, entry):
    """split_q8s's host side (no GPU): the entry of the dtype, one warp per 256
    values (8 per 256-thread CTA), the pointers, M, K and Ta's padded row count; misaligned
    input refused."""
    from fake_gpuarray import FakeGPUArray, install
    from test_gemm_launcher_cpu import FakeRT

    from minfer.cuda.ops.mmq_sb import split_q8s
    from minfer.errors import GPUError

    install(monkeypatch)
    rt = FakeRT()
    M, K = 77, 1280
    x = FakeGPUArray((M, K), dtype, gpudata=0x10000)
    aq = FakeGPUArray((M, K), np.uint8, gpudata=0x40000)
    ta = FakeGPUArray((K // 32, 128, 2), np.float32, gpudata=0x80000)
    assert split_q8s(rt, x, aq, ta) == (aq, ta)
    (fn, grid, block, args, _), = rt.launches
    assert fn[:2] == ("quantize_q8_1", entry)
    assert grid == ((M * K // 256 + 7) // 8,) and block == (256,)
    assert args == [0x10000, 0x40000, 0x80000, M, K, 128]
    with pytest.raises(GPUError, match="unaligned"):
        split_q8s(rt, FakeGPUArray((M, K), dtype, gpudata=0x10004), aq, ta)


def test_sb_linear_refuses_oversized_problems():
    """Operands or tables at 2^31 bytes and over are refused before any launch (the kernels'
    offsets are 32-bit)."""
    from minfer.cuda.ops.mmq_sb import SbQ4K, mmq_sb_linear
    from minfer.errors import GPUError

    for M, N, K in ((1 << 19, 4096, 4096), (512, 1 << 19, 4096)):
        w = SbQ4K(None, N, K)
        with pytest.raises(GPUError, match="too large"):
            mmq_sb_linear(None, None, w, M, N, K, None)


class _Arr:
    """A stand-in device array (shape, dtype, address) for the launchers' checks, which run
    before any launch."""

    def __init__(self, shape, dtype, addr=1 << 20):
        self.shape, self.dtype, self.gpudata = tuple(shape), np.dtype(dtype), addr
        self.size = int(np.prod(shape))
        self.strides = tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                             for i in range(len(shape)))


def test_sb_operand_refuses_bad_input():
    """The one-launch token operand refuses, before any launch, K not a multiple of 256, an
    unaligned activation, a wrong output shape, and gate|up with an odd column count."""
    from minfer.cuda.ops.mmq_sb import sb_operand, sb_operand_swiglu
    from minfer.errors import GPUError

    with pytest.raises(GPUError, match="multiple of 256"):
        sb_operand(None, _Arr((4, 320), np.float32))
    with pytest.raises(GPUError, match="16-byte unaligned"):
        sb_operand(None, _Arr((4, 512), np.float16, addr=(1 << 20) + 8))
    with pytest.raises(GPUError, match="shape"):
        sb_operand(None, _Arr((4, 512), np.float32), tt=_Arr((2, 1, 100), np.uint8))
    with pytest.raises(GPUError, match="expected 2F"):
        sb_operand_swiglu(None, _Arr((4, 1025), np.float32))
    with pytest.raises(GPUError, match="expected a device array"):
        sb_operand(None, np.zeros((4, 512), np.float32))


def test_sb_operand_rmsnorm_refuses_bad_input():
    """The rmsnorm + token operand launch refuses, before any launch, f16 activations, K past
    the kernel's 8 warps x 4 super-blocks, K not a multiple of 256, a weight of another length,
    unaligned activations and an h16 of another shape."""
    from minfer.cuda.ops.mmq_sb import SB_NORM_MAX_K, sb_operand_rmsnorm
    from minfer.errors import GPUError

    w = _Arr((512,), np.float32)
    with pytest.raises(GPUError, match="dtype"):
        sb_operand_rmsnorm(None, _Arr((4, 512), np.float16), w, 1e-5)
    with pytest.raises(GPUError, match="over the kernel"):
        sb_operand_rmsnorm(None, _Arr((4, SB_NORM_MAX_K + 256), np.float32),
                           _Arr((SB_NORM_MAX_K + 256,), np.float32), 1e-5)
    with pytest.raises(GPUError, match="multiple of 256"):
        sb_operand_rmsnorm(None, _Arr((4, 320), np.float32), _Arr((320,), np.float32), 1e-5)
    with pytest.raises(GPUError, match="w: shape"):
        sb_operand_rmsnorm(None, _Arr((4, 512), np.float32), _Arr((256,), np.float32), 1e-5)
    with pytest.raises(GPUError, match="aligned"):
        sb_operand_rmsnorm(None, _Arr((4, 512), np.float32, addr=(1 << 20) + 4), w, 1e-5)
    with pytest.raises(GPUError, match="h16: shape"):
        sb_operand_rmsnorm(None, _Arr((4, 512), np.float32), w, 1e-5,
                           h16=_Arr((4, 256), np.float16))


def test_glu_rows_pair_each_feature():
    """glu_rows: a permutation of [gate; up] in which row r (r % 16 < 8) is the gate row and
    r + 8 the up row of feature (r / 16) 8 + r % 16, the kernel's store_swiglu map."""
    from minfer.quants.glu import glu_rows

    F = 40
    perm = glu_rows(F)
    assert sorted(perm) == list(range(2 * F))
    for r in range(2 * F):
        if r % 16 < 8:
            f = r // 16 * 8 + r % 16
            assert perm[r] == f and perm[r + 8] == F + f
    with pytest.raises(ValueError, match="multiple of 8"):
        glu_rows(12)


def test_swiglu_epilogue_refuses_bad_input():
    """mmq_sb_linear's swiglu epilogue refuses, before any launch, C +=, N not a multiple of 16
    and an f32 output."""
    from minfer.cuda.ops.mmq_sb import SbQ4K, mmq_sb_linear
    from minfer.errors import GPUError

    x = _Arr((8, 256), np.float32)
    with pytest.raises(GPUError, match="swiglu epilogue"):
        mmq_sb_linear(None, x, SbQ4K(None, 64, 256), 8, 64, 256, None, accumulate=True,
                      swiglu=True)
    with pytest.raises(GPUError, match="swiglu epilogue"):
        mmq_sb_linear(None, x, SbQ4K(None, 40, 256), 8, 40, 256, None, swiglu=True)
    with pytest.raises(GPUError, match="out: dtype"):
        mmq_sb_linear(None, x, SbQ4K(None, 64, 256), 8, 64, 256, _Arr((8, 32), np.float32),
                      swiglu=True)


def test_copy_interleaved_places_rows_as_glu_rows():
    """weights._copy_interleaved (gate|up upload for the SB and f16 glu epilogues), its 2D copy
    emulated on host memory: raw uint8 rows from the host and f16 rows from a device chunk at a
    row offset both land where glu_rows says."""
    from types import SimpleNamespace

    from minfer.quants.glu import glu_rows
    from minfer.cuda.plan.weights import _copy_interleaved

    mem = {}   # base address -> host buffer standing in for device memory

    class Arr(SimpleNamespace):
        pass

    def dev(a, base):
        mem[base] = a.view(np.uint8).reshape(-1)
        return Arr(gpudata=base, shape=a.shape, dtype=a.dtype)

    class Memcpy2D:
        def set_src_host(self, a):
            self.src = (np.ascontiguousarray(a).view(np.uint8).reshape(-1), 0)

        def set_src_device(self, p):
            self.src = (mem[p], 0)

        def set_dst_device(self, p):
            base = max(b for b in mem if b <= p)
            self.dst = (mem[base], p - base)

        def __call__(self, aligned=True):
            (s, so), (d, do) = self.src, self.dst
            for h in range(self.height):
                w = self.width_in_bytes
                d[do + h * self.dst_pitch:do + h * self.dst_pitch + w] = \
                    s[so + h * self.src_pitch:so + h * self.src_pitch + w]

    rt = SimpleNamespace(drv=SimpleNamespace(Memcpy2D=Memcpy2D))
    F = 24
    rng = np.random.default_rng(0)
    for dtype, K in ((np.uint8, 40), (np.float16, 16)):
        gate, up = (rng.integers(0, 200, (F, K)).astype(dtype) for _ in range(2))
        out = np.zeros((2 * F, K), dtype)
        dst = dev(out, 1 << 20)
        if dtype == np.uint8:   # raw rows from the host, whole member
            _copy_interleaved(rt, dst, gate, F, False)
            _copy_interleaved(rt, dst, up, F, True)
        else:                   # device chunks of 8 rows at row r (dst row 2 r)
            for r in range(0, F, 8):
                for member, is_up, base in ((gate, False, 1 << 24), (up, True, 1 << 25)):
                    chunk = dev(np.ascontiguousarray(member[r:r + 8]), base)
                    _copy_interleaved(rt, dst, chunk, 8, is_up, dst_row0=2 * r)
        assert np.array_equal(out, np.concatenate([gate, up])[glu_rows(F)]), dtype
