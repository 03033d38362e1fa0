"""CPU: blk-split's column kernels (kernels/blk_split.cu) without a GPU: the launchers on the heap
runtime (tests/moe_heap.py runs each entry's numpy twin over fake device memory, walking the
launch's arguments as the kernel's C signature orders them) against independent numpy, their
one-line refusals, and the cols' own checks. The kernels against the twins on a GPU:
tests/gpu/test_blk_split_device.py."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.blk import outliers as O
from minfer.cuda.paths.blk import split as S
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


@pytest.fixture
def heap(monkeypatch):
    import moe_heap

    return moe_heap.install(monkeypatch)


def _cols(rng, K, n):
    return np.sort(rng.choice(K, n, replace=False)).astype(np.int32)


@pytest.mark.parametrize("M,K,n,pad", [(1, 64, 8, 0), (37, 200, 128, 0), (130, 136, 136, 24)])
def test_split_cols_gathers_then_zeroes(heap, M, K, n, pad):
    """out = A[:, cols] and A[:, cols] = 0, the other columns untouched; pad: A's rows a view
    of wider ones (the row stride the launcher passes)."""
    rng = np.random.default_rng(M + K)
    full = rng.standard_normal((M, K + pad)).astype(np.float16)
    cols = _cols(rng, K, n)
    buf = da.to_device(heap, full)
    A = type(buf)((M, K), np.float16, gpudata=buf.gpudata, strides=(2 * (K + pad), 2))
    out = da.empty(heap, (M, n), np.float16)
    S.blk_split_cols(heap, A, da.to_device(heap, cols), out)
    assert np.array_equal(out.get(), full[:, cols])
    want = full.copy()
    want[:, cols] = 0
    assert np.array_equal(heap.at(int(buf.gpudata), (M, K + pad), np.float16), want)


def test_col_sumsq_accumulates_in_f32(heap):
    """acc += column sums of squares, chunk after chunk: bit for bit the twin's f32 order, and
    within f32's rounding of the float64 sums (M additions of relative error 2^-24 each)."""
    rng = np.random.default_rng(3)
    M, K = 70, 300
    chunks = [rng.standard_normal((M, K)).astype(np.float16) * (1 + i) for i in range(3)]
    acc = da.to_device(heap, np.zeros(K, np.float32))
    twin = np.zeros(K, np.float32)
    for c in chunks:
        S.col_sumsq_f16(heap, da.to_device(heap, c), acc)
        O.col_sumsq_ref(c, twin)
    got = acc.get()
    assert np.array_equal(got, twin)
    exact = sum((c.astype(np.float64) ** 2).sum(axis=0) for c in chunks)
    assert np.all(np.abs(got - exact) <= (len(chunks) * (M + 1)) * 2.0**-24 * exact)


def test_launchers_refuse_in_one_line(heap):
    A = da.to_device(heap, np.zeros((4, 64), np.float16))
    cols = da.to_device(heap, np.arange(8, dtype=np.int32))
    bad = [
        lambda: S.blk_split_cols(heap, da.to_device(heap, np.zeros((4, 64))), cols, A),
        lambda: S.blk_split_cols(heap, A, da.to_device(heap, np.arange(8.0)), A),
        lambda: S.blk_split_cols(heap, A, cols, da.empty(heap, (4, 9), np.float16)),
        lambda: S.blk_split_cols(heap, A, da.to_device(heap, np.arange(65, dtype=np.int32)), A),
        lambda: S.col_sumsq_f16(heap, A, da.empty(heap, (63,), np.float32)),
    ]
    for f in bad:
        with pytest.raises(GPUError) as e:
            f()
        assert "\n" not in str(e.value)
    assert heap.launches == []


@pytest.mark.parametrize(
    "cols", [[], [3, 3], [5, 2], [-1, 4], [0, 64], np.array([1.0, 2.0]), [[1, 2]]]
)
def test_check_cols_refuses(cols):
    with pytest.raises(ValueError) as e:
        O.check_cols(np.asarray(cols), 64)
    assert "\n" not in str(e.value)


def test_check_cols_takes_ascending_channels():
    got = O.check_cols(np.array([0, 5, 63], np.int64), 64)
    assert got.dtype == np.int32 and list(got) == [0, 5, 63]


# -- the path: upload, route, choice, memory ------------------------------------------------------
Q8_0 = 8
DOWN = "blk.0.ffn_down.weight"


def _upload(heap, rng, N, K, channels):
    from quant_data import rand_weights

    from minfer.cuda.paths import Part, upload_weight
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT
    from minfer.quants import dequantize

    raw = rand_weights(rng, Q8_0, N, K)
    w16 = dequantize(raw, Q8_0).reshape(N, K).astype(np.float16)
    w = upload_weight(heap, BLK_SPLIT, [Part(DOWN, raw, Q8_0, K)], DOWN, channels=channels)
    return w, w16, raw


def _acts(rng, M, K):
    """f16 activations with a few loud channels (SwiGLU's massive ones, which the split keeps)."""
    x = rng.standard_normal((M, K))
    x[:, rng.choice(K, 4, replace=False)] *= 40
    return x.astype(np.float16)


@pytest.mark.parametrize(
    "M,N,K,calibrated",
    [(1, 64, 224, True), (37, 200, 224, False), (130, 96, 256, True), (20, 64, 96, True)],
)
@pytest.mark.parametrize("mode", ["f32", "acc"])
def test_split_route_is_its_twins_composed(heap, M, N, K, calibrated, mode):
    """The route on the heap runtime (every launch of the upload and of run as the forward
    issues them) equals the twins composed in the kernels' order bit for bit, and
    split_linear_ref (float64) within f32's rounding of that composition. Ragged M and N, K
    not a multiple of 128, n = 128 < K and n = K (K = 96: every channel kept, the int8 part
    all zeros)."""
    from minfer.cuda.paths.blk.outliers import busiest, split_linear_ref
    from minfer.cuda.paths.blk.split_path import (
        BLK_SPLIT,
        SPLIT_OPERAND,
        SplitWeight,
        default_cols,
        split_n,
    )
    from minfer.cuda.paths.blk.twin import blk_gemm, blk_operand, quantize_blk
    from minfer.cuda.paths.parity import scratch as parity_scratch
    from minfer.cuda.plan.config import GemmChoice

    rng = np.random.default_rng(M * 7 + K)
    x16 = _acts(rng, M, K)
    calib = _acts(rng, 64, K).astype(np.float64)
    cols = busiest((calib**2).mean(axis=0), split_n(K)) if calibrated else default_cols(K)
    w, w16, _ = _upload(heap, rng, N, K, {DOWN: cols} if calibrated else None)
    assert isinstance(w, SplitWeight) and np.array_equal(w.cols.get(), cols)
    assert np.array_equal(w.wo.get(), w16[:, cols])
    wz = w16.copy()
    wz[:, cols] = 0
    assert np.array_equal(w.wb.get(), blk_operand(*quantize_blk(wz, weight=True)))

    route = BLK_SPLIT.route(Q8_0, GemmChoice("blk-split"), DOWN)
    assert route.operand is SPLIT_OPERAND and route.accumulates
    s = parity_scratch(heap, M, K)
    A = da.to_device(heap, x16)
    base = rng.standard_normal((M, N)).astype(np.float32) if mode == "acc" else None
    C = da.to_device(heap, base if base is not None else np.zeros((M, N), np.float32))
    route.run(heap, s, C, route.operand.prepass(heap, A, s.operands["blksplit"]), w, mode)
    got = C.get()
    assert not A.get()[:, cols].any()  # the input is consumed: its kept columns zeroed

    # the operands bit for bit: Xo in the split scratch, the zeroed input's token operand
    n = len(cols)
    assert np.array_equal(
        heap.at(int(s.operands["blksplit"].gpudata), (M, n), np.float16), x16[:, cols]
    )
    xz = x16.copy()
    xz[:, cols] = 0
    tt = blk_operand(*quantize_blk(xz))
    assert np.array_equal(heap.at(int(s.operands["blkop"].gpudata), tt.shape, np.uint8), tt)
    # C: f32(blk GEMM) (+ base), then the f16 GEMM's f32 sum of n products added: its order is
    # BLAS's, so within n + 1 roundings of 2^-24 of the products' magnitudes
    yb = blk_gemm(*quantize_blk(xz), *quantize_blk(wz, weight=True))
    first = (yb.astype(np.float32) + (base if base is not None else 0)).astype(np.float32)
    xo, wo = x16[:, cols].astype(np.float64), w16[:, cols].astype(np.float64)
    mag = np.abs(xo) @ np.abs(wo).T
    want = first + xo @ wo.T
    assert np.all(np.abs(got - want) <= 2.0**-24 * ((n + 1) * mag + np.abs(want)) + 1e-30)

    # split_linear_ref (float64) within f32's rounding of the blk part, the base and the sum
    ref = split_linear_ref(x16, w16, cols) + (base if base is not None else 0)
    b = 0 if base is None else np.abs(base)
    bound = 2.0**-23 * (b + np.abs(yb) + (n + 2) * mag) + 1e-30
    assert np.all(np.abs(got - ref) <= bound)


def test_split_upload_refuses_bad_channels(heap):
    rng = np.random.default_rng(0)
    for bad in (np.array([3, 3]), np.array([500]), np.array([], np.int32)):
        with pytest.raises(GPUError) as e:
            _upload(heap, rng, 32, 224, {DOWN: bad})
        assert "\n" not in str(e.value) and DOWN in str(e.value)


def test_blk_split_is_opt_in():
    """--gemm blk-split resolves; auto's tiers never name it on any arch or width; it puts
    ffn_down on its split route where blk leaves it on f16, every other weight as blk."""
    from minfer.cuda.paths import TABLE, TIERS, auto_tiers, choose_path
    from minfer.cuda.paths.blk.path import BlkRoute
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT, SplitRoute
    from minfer.cuda.plan.config import GemmChoice

    assert GemmChoice.resolve({}, "blk-split").path == "blk-split"
    assert GemmChoice.resolve({"MINFER_GEMM": "blk-split"}).path == "blk-split"
    assert TABLE["blk-split"] is BLK_SPLIT
    shape = (512, 4096, 14336)
    for arch in ("sm_90", "sm_80", None):
        for width in (0, 4096, 8192):
            for tier in auto_tiers(arch, width):
                assert TIERS[tier].path != "blk-split"
                for kind in ("ffn_down", "ffn_up", "attn_q"):
                    r = choose_path(12, arch, shape, "auto", tier=tier, cls="ffn", kind=kind)
                    assert r.path is not BLK_SPLIT
    assert choose_path(12, "sm_90", shape, "blk", kind="ffn_down").path.name == "f16"
    assert choose_path(12, "sm_90", shape, "blk-split", kind="ffn_down").path is BLK_SPLIT
    assert choose_path(12, "sm_80", shape, "blk-split", kind="ffn_down").path.name == "f16"
    c = GemmChoice("blk-split")
    assert type(BLK_SPLIT.route(12, c, DOWN)) is SplitRoute
    assert type(BLK_SPLIT.route(12, c, "blk.0.ffn_up.weight")) is BlkRoute
    assert GemmChoice("blk-split", channels={DOWN: [1]}) == c  # (the cols: not its identity)


def test_blk_split_memory_counts_wo_and_xo():
    from minfer.cuda.paths.blk.path import BLK
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT, split_n

    units = [(4096, 4096, 0, False), (4096, 14336, 0, False)]
    w, s = BLK_SPLIT.memory(units, 512, 132)
    wb, sb = BLK.memory(units, 512, 132)
    assert w == wb and {k: v for k, v in s.items() if k in sb} == sb
    assert s["blk split scratch"] == 512 * split_n(14336) * 2
    assert BLK_SPLIT.weight_extra(DOWN, 4096, 14336) == {"blk split f16 columns": 4096 * 128 * 2}
    assert BLK_SPLIT.weight_extra("blk.0.ffn_up.weight", 14336, 4096) == {}
    assert BLK.weight_extra(DOWN, 4096, 14336) == {}


def test_plan_of_blk_split_on_a_model(tmp_path):
    """make_plan with --gemm blk-split: every ffn_down on it (blk leaves them f16), its Wo and
    Xo parts in the plan; blk's plan has neither."""
    from synth_data import tiny_model

    from minfer.cuda.paths.blk.split_path import split_n
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.plan import make_plan
    from minfer.gguf.loader import load_model

    m = load_model(tiny_model(tmp_path, seed=3))

    class _Rt:
        arch, smem_optin, sm_count = "sm_90", 232448, 1

    split = make_plan(m, GemmChoice("blk-split"), _Rt(), 64, 64)
    blk = make_plan(m, GemmChoice("blk"), _Rt(), 64, 64)
    downs = [n for n in dict(split.routes) if ".ffn_down." in n]
    assert downs and all(dict(split.routes)[n][0] == "blk-split" for n in downs)
    assert all(dict(blk.routes)[n][0] == "f16" for n in downs)
    shapes = [tuple(int(s) for s in m.tensor(n).shape) for n in downs]
    assert split.parts["blk split f16 columns"] == sum(N * split_n(K) * 2 for N, K in shapes)
    assert split.parts["blk split scratch"] >= 64 * split_n(max(K for _, K in shapes)) * 2
    assert blk.parts["blk split f16 columns"] == blk.parts["blk split scratch"] == 0


def test_split_twin_is_split_linear_ref_on_the_uncalibrated_channels():
    from quant_data import rand_weights

    from minfer.cuda.ops.dequant import dequant_f16_ref
    from minfer.cuda.paths.blk.outliers import split_linear_ref
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT, default_cols

    rng = np.random.default_rng(5)
    M, N, K = 9, 40, 512
    raw = rand_weights(rng, 12, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    got = BLK_SPLIT.twin(x, raw, 12, M, N, K, DOWN)
    want = split_linear_ref(x, dequant_f16_ref(raw, 12, N, K), default_cols(K))
    assert np.array_equal(got, want)


def test_check_leaves_blk_split_to_gemm_and_grids_it_by_its_channels():
    """`minfer check` runs blk-split only when named; its CPU reference rounds ffn_down by
    OutlierGrid on the backend's channels (without: the upload's uncalibrated ones), the rest
    by blk's grid."""
    from minfer.cuda.paths.blk.outliers import OutlierGrid
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT, default_cols
    from minfer.cuda.plan.config import GemmChoice
    from minfer.tools.check import reference_grids, table_paths

    assert BLK_SPLIT not in table_paths() and table_paths("blk-split") == [BLK_SPLIT]
    cols = np.array([2, 7, 9], np.int32)
    routes = {DOWN: ("blk-split", ""), "blk.0.ffn_up.weight": ("blk-split", "")}
    g = reference_grids(routes, choice=GemmChoice("blk-split", channels={DOWN: cols}))
    assert isinstance(g[DOWN], OutlierGrid) and np.array_equal(g[DOWN].cols(DOWN), cols)
    assert g["blk.0.ffn_up.weight"] is BLK_SPLIT.grid
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    u = reference_grids(routes)[DOWN]  # uncalibrated: the first n channels exact
    want = OutlierGrid(BLK_SPLIT.grid, {DOWN: default_cols(256)}).act(x, DOWN)
    assert np.array_equal(u.act(x, DOWN), want)
