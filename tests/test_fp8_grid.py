"""CPU: the FP8 e4m3 twin (minfer.cuda.paths.blk.fp8) bit for bit against the format's 256 codes
decoded from its definition (and ml_dtypes' float8_e4m3fn where installed), the block-scaled
GEMM against float64 within a bound the grid implies (scales per 128 or per 32 of K), the
blk-fp8down emulations' labels and weight sets, and lab/down_grids.py's ffn_down grids (blk's
int8 with activation scales per 32, SmoothQuant's migration) and how its variants patch in."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.blk.fp8 import (
    E4M3_MAX,
    FB,
    Fp8Grid,
    e4m3,
    e4m3_encode,
    e4m3_table,
    fp8_gemm,
    fp8_grid,
    quantize_fp8,
)

FP8_LABELS = ("blk-fp8down", "blk-fp8down-tile", "blk-fp8down-p2", "blk-fp8down-ao")


@pytest.fixture(scope="module")
def dg():
    """lab/down_grids.py (an experiment: not in the package)."""
    from helpers import load_script

    return load_script("lab/down_grids.py")


def _table():
    t = e4m3_table()
    fin = ~np.isnan(t)
    return t, fin


def test_the_table_is_the_format():
    t, fin = _table()
    assert np.isnan(t[0x7F]) and np.isnan(t[0xFF]) and fin.sum() == 254
    pos = t[:0x7F]
    assert pos.max() == E4M3_MAX and pos[1] == 2.0**-9 and pos[8] == 2.0**-6
    assert (np.diff(pos) > 0).all()  # codes 0..126 increase
    assert np.array_equal(t[0x80:0xFF], -pos) and np.signbit(t[0x80])


def test_codes_round_trip():
    t, fin = _table()
    codes = np.arange(256)[fin]
    for dt in (np.float32, np.float64):
        v = t[fin].astype(dt)
        assert np.array_equal(e4m3(v), v)  # every code is a fixed point
        assert np.array_equal(e4m3_encode(v), codes.astype(np.uint8))
    assert e4m3_encode(np.array([np.nan]))[0] == 0x7F and np.isnan(e4m3(np.float32(np.nan)))


def _nearest_in_table(x: np.ndarray) -> np.ndarray:
    """The independent oracle: the nearest finite code by search in the table, ties to the
    even code (the mantissa's last bit), saturating."""
    t = e4m3_table()[:0x7F]  # +0 .. 448, increasing
    a = np.minimum(np.abs(x.astype(np.float64)), E4M3_MAX)
    hi = np.clip(np.searchsorted(t, a), 1, len(t) - 1)
    lo = hi - 1
    dl, dh = a - t[lo], t[hi] - a
    pick = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.copysign(t[pick], x)


def test_rounding_matches_the_table_everywhere():
    t, _ = _table()
    pos = t[:0x7F]
    mid = (pos[:-1] + pos[1:]) / 2  # every tie (exact in f32: one more bit)
    up = np.nextafter(mid.astype(np.float32), np.float32(np.inf))
    down = np.nextafter(mid.astype(np.float32), np.float32(0))
    over = np.array([448, 460, 464, 465, 480, 1e6, 3e38, np.inf], np.float32)
    rng = np.random.default_rng(0)
    rand = (rng.standard_normal(200_000) * np.exp2(rng.uniform(-14, 10, 200_000))).astype(
        np.float32
    )
    for x in (mid.astype(np.float32), up, down, over, rand):
        for s in (1, -1):
            v = (s * x).astype(np.float32)
            assert np.array_equal(e4m3(v), _nearest_in_table(v).astype(np.float32))
    # ties go to the even mantissa: 2^-10 -> 0, 3 * 2^-10 -> 2^-8; 17 -> 16, 19 -> 20
    got = e4m3(np.array([2.0**-10, 3 * 2.0**-10, 17, 19, 464], np.float32))
    assert got.tolist() == [0, 2.0**-8, 16, 20, 448]


def test_against_ml_dtypes_if_installed():
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100_000) * np.exp2(rng.uniform(-14, 8, 100_000))).astype(np.float32)
    x = x[np.abs(x) <= E4M3_MAX]  # ml_dtypes does not saturate: NaN past the range
    ref = x.astype(ml.float8_e4m3fn)
    assert np.array_equal(e4m3_encode(x), ref.view(np.uint8))


def _ops(seed: int, M: int, N: int, K: int):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, K)) * np.exp(1.5 * rng.standard_normal((M, K)))).astype(np.float16)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float16)
    return x.astype(np.float64), w.astype(np.float64)


@pytest.mark.parametrize(
    "wrows,pow2,ab,wb",
    [
        (1, False, FB, FB),
        (128, False, FB, FB),
        (1, True, FB, FB),
        (1, False, 32, FB),
        (1, False, 32, 32),
    ],
)
def test_block_scaled_gemm_within_the_grids_bound(wrows, pow2, ab, wb):
    """|fp8_gemm - x @ w.T| <= sum_k (ea_k |w^_k| + |x_k| ew_k) + gamma sum_k |x^_k| |w^_k|, the
    bound the grid implies: a value v scaled to y = v / s lands within half a step of e4m3's
    grid, 2^-4 |y| while normal (the step at [2^e, 2^(e+1)) is 2^(e-3)), 2^-10 in the
    subnormals (step 2^-9), so |v^ - v| <= 2^-4 |v| + 2^-10 s, plus the f32 roundings of
    inv, v * inv, s and q * s (4 of u = 2^-24, and u 2^-4 beyond: 5 u |v| covers them);
    then the f32 sums: 127 additions a block, the scale product, its multiply and KB
    promotions (gamma = (FB + KB + 2) u, first order). ab, wb: K per scale of the activations
    and the weights (128, or 32 as MX: then a promotion per 32)."""
    M, N, K = 13, 150, 3 * FB + 64  # ragged: rows past a tile, K past a block
    x, w = _ops(7, M, N, K)
    qa, sa = quantize_fp8(x, pow2=pow2, block=ab)
    qw, sw = quantize_fp8(w, rows=wrows, pow2=pow2, block=wb)
    ka, kw = -(-K // ab), -(-K // wb)  # blocks (the last zero-padded)
    assert qa.shape == (M, ka * ab) and sa.shape == (M, ka) and sw.shape == (N, kw)
    assert np.array_equal(e4m3(qa), qa) and np.abs(qa).max() <= E4M3_MAX
    y = fp8_gemm(qa, sa, qw, sw).astype(np.float64)
    ref = x @ w.T
    KB = -(-K // min(ab, wb))  # promotions

    def err(v, s, b):  # per value: the bound on |v^ - v|
        srep = np.repeat(s.astype(np.float64), b, axis=1)[:, : v.shape[1]]
        return 2.0**-4 * np.abs(v) + 2.0**-10 * srep + 5 * 2.0**-24 * np.abs(v)

    xh = fp8_grid(x, pow2=pow2, block=ab).astype(np.float64)
    wh = fp8_grid(w, wrows, pow2, block=wb).astype(np.float64)
    assert np.all(np.abs(xh - x) <= err(x, sa, ab)) and np.all(np.abs(wh - w) <= err(w, sw, wb))
    gamma = (FB + KB + 2) * 2.0**-24
    bound = (
        err(x, sa, ab) @ np.abs(wh).T
        + np.abs(x) @ err(w, sw, wb).T
        + gamma * (np.abs(xh) @ np.abs(wh).T)
    )
    e = np.abs(y - ref)
    assert np.all(e <= bound)
    assert 0.01 < (e / bound).max()  # a bound, not a blanket
    # the emulation's form (grids, then an f32 product) is the GEMM up to the f32 sums
    g = (xh.astype(np.float32) @ wh.astype(np.float32).T).astype(np.float64)
    assert np.all(np.abs(g - y) <= 2 * gamma * (np.abs(xh) @ np.abs(wh).T))


def test_scales_and_tiles():
    x, w = _ops(3, 5, 130, 2 * FB)
    _, s_row = quantize_fp8(w)
    _, s_tile = quantize_fp8(w, rows=128)
    assert np.array_equal(s_tile[:128], np.broadcast_to(s_row[:128].max(axis=0), (128, 2)))
    assert np.array_equal(s_tile[128:], np.broadcast_to(s_row[128:].max(axis=0), (2, 2)))
    q, s = quantize_fp8(x)
    amax = np.abs(x).reshape(5, 2, FB).max(axis=-1).astype(np.float32)
    assert np.array_equal(s, amax / np.float32(E4M3_MAX))
    assert np.allclose(np.abs(q).reshape(5, 2, FB).max(axis=-1), E4M3_MAX, rtol=2**-20)
    q2, s2 = quantize_fp8(x, pow2=True)
    m, _ = np.frexp(s2)
    assert (m == 0.5).all() and (s2 >= s).all() and (s2 < 2 * s).all()
    assert np.array_equal(q2 * np.repeat(s2, FB, axis=1), fp8_grid(x, pow2=True))  # exact
    assert np.array_equal(quantize_fp8(np.zeros((2, 64)))[1], np.zeros((2, 1)))  # no 0 / 0
    grid = Fp8Grid(128, pow2=True)
    assert grid.name == "fp8-tile-p2" and grid.act(x[None], "blk.0.ffn_down.weight").shape == (
        1,
        5,
        2 * FB,
    )


def test_fp8down_labels_take_ffn_down(tmp_path):
    """blk's weights keep blk's grid; ffn_down (f16 on blk's GPU plan) takes the FP8 grid, and
    attn_output too for -ao; the LM head stays exact; the GPU plan is unchanged."""
    from synth_data import small_parts, write_small

    from minfer.cuda.paths import EMULATIONS, TABLE
    from minfer.cuda.paths.blk.twin import BlkGrid
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.routes import plan_routes
    from minfer.gguf.loader import load_model
    from minfer.tools.perplexity.emulate import _H200, emulated_grids, emulated_weights

    model = load_model(write_small(tmp_path / "small.gguf", *small_parts(seed=2, tied=False)))
    linear = {n for n, t in model.tensors.items() if len(t.shape) == 2 and "blk." in n}
    down = {n for n in linear if ".ffn_down." in n}
    ao = {n for n in linear if ".attn_output." in n}
    for label in FP8_LABELS:
        assert label in EMULATIONS and EMULATIONS[label][0] is TABLE["blk"]
        g = emulated_grids(model, label)
        assert set(g) == linear == emulated_weights(model, label)
        fp8 = down | ao if label.endswith("-ao") else down
        assert all(isinstance(g[n], Fp8Grid) for n in fp8)
        assert all(isinstance(g[n], BlkGrid) for n in linear - fp8)
        assert model.output_name not in g
    routes = plan_routes(model, GemmChoice("blk"), _H200, ubatch=512)
    assert all(routes[n][0] == "f16" for n in down)


def test_fp8down_labels_in_the_help():
    from cli_inproc import run_cli

    code, out, _ = run_cli(["perplexity", "--help"])
    assert code == 0
    flat = " ".join(out.split())
    for label in FP8_LABELS:
        assert label in flat.replace("- ", "-")


def test_finer_scales():
    """Per 32 of K: one scale per 32 (amax / 448), each 32's largest value at 448; the GEMM's
    promotion per 32 when either side is per 32 (sa per 32, sw per 128 repeated 4 times)."""
    x, w = _ops(5, 6, 40, 2 * FB)
    q, s = quantize_fp8(x, block=32)
    amax = np.abs(x).reshape(6, 8, 32).max(axis=-1).astype(np.float32)
    assert np.array_equal(s, amax / np.float32(E4M3_MAX))
    assert np.allclose(np.abs(q).reshape(6, 8, 32).max(axis=-1), E4M3_MAX, rtol=2**-20)
    qw, sw = quantize_fp8(w)
    y = fp8_gemm(q, s, qw, sw).astype(np.float64)
    xh, wh = fp8_grid(x, block=32).astype(np.float64), fp8_grid(w).astype(np.float64)
    assert np.allclose(y, xh @ wh.T, rtol=1e-5, atol=1e-6 * (np.abs(xh) @ np.abs(wh).T).max())
    # finer scales are never coarser: the per-32 grid's error is at most the per-128 one's
    # bound per value, and smaller in total on heavy-tailed values
    e32, e128 = np.abs(fp8_grid(x, block=32) - x), np.abs(fp8_grid(x) - x)
    assert e32.sum() < e128.sum()
    g = Fp8Grid(ablock=32, wblock=32)
    assert g.name == "fp8-a32-w32" and np.array_equal(g.weight(w, "n"), fp8_grid(w, block=32))


def test_blk_sub_grid(dg):
    """blk's rotated int8 with one scale per `sub` of the rotated 128: sub = 128 is blk's own
    activation grid bit for bit; sub = 32 puts each 32's largest rotated value at 127 and is
    within half a step of its 32's scale (rotated domain: the grid is an orthogonal map
    after / 128)."""
    from minfer.cuda.paths.blk.twin import _rotated, blk_grid, fwht128

    BlkSubGrid, blk_sub_grid = dg.BlkSubGrid, dg.blk_sub_grid

    x, w = _ops(9, 7, 30, 3 * FB + 64)
    x = x.astype(np.float16).astype(np.float64)
    assert np.array_equal(blk_sub_grid(x, 128), blk_grid(x))
    g = blk_sub_grid(x, 32)
    R, K = x.shape
    y = _rotated(x).reshape(R, -1, 32).astype(np.float64)  # the rotated values
    gp = np.zeros((R, 4 * FB), np.float32)
    gp[:, :K] = g
    yh = fwht128(gp.reshape(R, 4, FB)).reshape(R, -1, 32).astype(np.float64)  # g rotated
    step = np.abs(y).max(axis=-1, keepdims=True) / 127
    assert np.all(np.abs(yh - y) <= step / 2 * (1 + 1e-5) + 1e-3 * step)
    e32 = np.linalg.norm(g - x)
    assert e32 < np.linalg.norm(blk_grid(x) - x)  # finer scales: less error here
    grid = BlkSubGrid(32)
    assert grid.name == "blk-a32" and np.array_equal(
        grid.act(x[None], "blk.0.ffn_down.weight")[0], g
    )


def test_smooth_grid(tmp_path, dg):
    """SmoothQuant's migration: s = xmax^a / wmax^(1-a); at a = 0.5 X / s and W * s share each
    channel's maximum (sqrt(xmax wmax)); on an exact inner grid X' W'^T = X W^T; the stats come
    from the npz --stats names, a clear error without it."""
    from minfer.errors import BadInput

    SmoothGrid, smooth_scales = dg.SmoothGrid, dg.smooth_scales

    x, w = _ops(11, 9, 20, FB)
    xmax, wmax = np.abs(x).max(axis=0), np.abs(w).max(axis=0)
    xmax[3] = 0  # a dead channel: s = 1
    s = smooth_scales(xmax, wmax)
    assert s[3] == 1 and np.allclose(np.delete(s, 3), np.sqrt(np.delete(xmax / wmax, 3)), rtol=1e-6)
    ok = np.arange(FB) != 3
    assert np.allclose((xmax / s)[ok], (wmax * s)[ok], rtol=1e-5)

    class Exact:
        name = "exact"

        def weight(self, w, name):
            return w

        def act(self, x, name):
            return x

    name = "blk.0.ffn_down.weight"
    np.savez(tmp_path / "st.npz", **{name + "|x": xmax, name + "|w": wmax})
    g = SmoothGrid(Exact(), stats=str(tmp_path / "st.npz"))
    assert g.name == "sq-exact" and np.array_equal(g.scales(name), s)
    got = g.act(x, name).astype(np.float64) @ g.weight(w, name).astype(np.float64).T
    assert np.allclose(got, x @ w.T, rtol=1e-5, atol=1e-5 * (np.abs(x) @ np.abs(w).T).max())
    g8 = SmoothGrid(Fp8Grid(), stats=str(tmp_path / "st.npz"))
    assert np.array_equal(g8.act(x, name), fp8_grid((x / s).astype(np.float32)))
    with pytest.raises(BadInput, match="--stats FILE"):
        SmoothGrid(Fp8Grid()).act(x, name)


def test_blk_sub_grid_weight_pairs(dg):
    """BlkSubGrid's weight: blk's rotated int8 per (row, pair x 128); pair 2 is blk's own."""
    from minfer.cuda.paths.blk.twin import BlkGrid, blk_grid

    BlkSubGrid = dg.BlkSubGrid

    _, w = _ops(4, 3, 20, 3 * FB)
    n = "blk.0.ffn_down.weight"
    assert np.array_equal(BlkSubGrid(128).weight(w, n), BlkGrid().weight(w, n))
    g = BlkSubGrid(128, pair=1)
    assert g.name == "blk-w128" and np.array_equal(g.weight(w, n), blk_grid(w, True, pair=1))
    assert np.array_equal(g.act(w[None], n)[0], BlkGrid().act(w, n))


def test_lab_variants_patch_only_ffn_down(tmp_path, monkeypatch, dg):
    """lab/down_grids.py's patch: under --emulate blk-fp8down, ffn_down takes the variant's grid
    (SmoothQuant's with their inner grid), every other weight keeps blk's."""
    from synth_data import small_parts, write_small

    from minfer.cuda.paths.blk.outliers import OutlierGrid
    from minfer.cuda.paths.blk.twin import BlkGrid
    from minfer.gguf.loader import load_model
    from minfer.tools.perplexity import emulate

    model = load_model(write_small(tmp_path / "small.gguf", *small_parts(seed=2, tied=False)))
    want = {
        "fp8-a32": Fp8Grid,
        "fp8-32": Fp8Grid,
        "int8": BlkGrid,
        "int8-a32": dg.BlkSubGrid,
        "sq-int8-w128": dg.SmoothGrid,
        "sq-fp8": dg.SmoothGrid,
    }
    import re

    def kind(variant):  # the outermost grid a variant's name says
        if variant == "int8down-tok":  # the package's split, bound by its calibration
            return OutlierGrid
        if re.search(r"-[or]\d+$", variant):
            return dg.OutlierSplit
        if variant.endswith("only"):
            return dg.OneSide
        if variant.startswith("rot"):
            return dg.RotGrid
        return want.get(variant, dg.SmoothGrid)

    for variant in dg.VARIANTS:
        monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "cache"))  # (int8down-tok calibrates)
        monkeypatch.setattr(emulate, "emulated_grids", emulate.emulated_grids)
        base = emulate.emulated_grids(model, "blk-fp8down")
        dg.patch(variant, stats={})
        g = emulate.emulated_grids(model, "blk-fp8down")
        assert set(g) == set(base)
        for n, v in g.items():
            if ".ffn_down." in n:
                assert isinstance(v, kind(variant)), (variant, n)
                if variant == "int8down-tok":
                    assert isinstance(v.inner, dg.TokGrid) and len(v.cols(n)) == v.n
            else:
                assert v is base[n] or isinstance(v, BlkGrid)
        monkeypatch.undo()


def test_lab_skip_keeps_the_outlier_layers_exact(tmp_path, monkeypatch, dg):
    """A "-skipN" variant leaves the ffn_down of the N layers with the largest max-to-median
    input ratio off the grid (exact: f16 on the GPU), every other ffn_down on the variant's."""
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model
    from minfer.tools.perplexity import emulate

    model = load_model(write_small(tmp_path / "small.gguf", *small_parts(seed=2, tied=False)))
    down = sorted(n for n in emulate.emulated_grids(model, "blk-fp8down") if ".ffn_down." in n)
    rng = np.random.default_rng(0)
    stats = {n: (rng.uniform(1, 2, 64), np.ones(64)) for n in down}
    stats[down[-1]][0][5] = 1000.0  # the outlier layer
    assert dg.outlier_layers(stats, 1) == {down[-1]}
    monkeypatch.setattr(emulate, "emulated_grids", emulate.emulated_grids)
    dg.patch("int8-skip1", stats=stats)
    g = emulate.emulated_grids(model, "blk-fp8down")
    assert down[-1] not in g and all(n in g for n in down[:-1])
