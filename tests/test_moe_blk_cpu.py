"""CPU: the mixture-of-experts FFN's blk int8 expert path without a GPU. The numpy twins of
kernels/mmq_blk.cu's moe_blk_* entries (minfer.cuda.paths.blk.moe), composed as the device runs
them, against an independent float64 composition of the dense blk twins (quantize_blk and
blk_gemm per expert on its gathered rows: what the kernels must compute) and against the f64
MoE of the CPU reference (the int8 grid's distance), on ragged routings (experts with no row,
one row, rows not a multiple of the 128-row tile), E = 8 k = 2 and E = 128 k = 8; the token
operand's padded layout; the launchers' checks and grids; MoeLayers(experts=BLK_EXPERTS) on the heap
runtime (upload and ffn: every launch and argument as the forward runs them); the plan's
expert path and bytes. The kernels against these twins on a GPU: tests/gpu/test_moe_blk_device.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from minfer.cuda.ops import moe as M
from minfer.cuda.paths.blk import moe as B
from minfer.cuda.paths.blk import twin
from minfer.cuda.paths.f16.moe import F16_EXPERTS
from minfer.errors import GPUError
from minfer.reference import moe as R


def _weights(rng, E, d, fe):
    wg = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wu = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wd = (rng.standard_normal((E, d, fe)) / np.sqrt(fe)).astype(np.float16)
    return wg, wu, wd


def _silu_mul(g, u):
    return (g / (1 + np.exp(-g)) * u).astype(np.float16)


def _blk_reference(h16, sel, wts, wg, wu, wd):
    """The float64 composition of the dense blk twins, expert by expert on its gathered rows in
    pair order: gate and up from the per-token operand, f16 swiglu, down from the per-(token,
    128) operand, the k outputs times their weights summed in rank order in f32."""
    T, k = sel.shape
    d = h16.shape[1]
    ys = np.zeros((T, k, d), np.float32)
    for e in np.unique(sel):
        tok, slot = np.nonzero(sel == e)
        qa, sa = twin.quantize_blk(h16[tok], per_token=True)
        g = twin.blk_gemm(qa, sa, *twin.quantize_blk(wg[e], weight=True))
        u = twin.blk_gemm(qa, sa, *twin.quantize_blk(wu[e], weight=True))
        act = _silu_mul(g, u)
        y = twin.blk_gemm(*twin.quantize_blk(act), *twin.quantize_blk(wd[e], weight=True))
        ys[tok, slot] = y.astype(np.float32)
    out = wts[:, 0:1] * ys[:, 0]
    for j in range(1, k):
        out = out + wts[:, j : j + 1] * ys[:, j]
    return out


def _f64_reference(h16, wr, wg, wu, wd, k):
    h = h16.astype(np.float64)
    sel, w, _ = R.route(h @ wr.astype(np.float64).T, k)
    W = {"gate": wg, "up": wu, "down": wd}

    def expert(name, e):
        return W[name.split("ffn_")[1].split("_exps")[0]][e].astype(np.float64)

    return R.moe_ffn(h, sel, w, expert, "", lambda x, Wt, name: x @ Wt.T)


def _ragged(T, d, E, fe, seed=0):
    """k = 2: expert 0 in every token (T rows), expert 1 in every token but 3, expert 5 in
    token 3 alone (one row), the other five none."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, d)) * 0.1
    h[:, 0], h[:, 1], h[3, 1] = 1.0, 0.0, 1.0
    wr = rng.standard_normal((E, d)) * 0.01
    wr[:, :2] = 0.0
    wr[0, 0], wr[1, 0], wr[5, 1] = 8.0, 4.0, 20.0
    return h.astype(np.float16), wr.astype(np.float16), *_weights(rng, E, d, fe)


@pytest.mark.parametrize("T,d,fe", [(9, 64, 48), (140, 200, 24), (131, 256, 136)])
def test_twins_compose_to_the_blk_reference_on_a_ragged_routing(T, d, fe):
    """Experts with T rows (past one 128-row tile at T = 131 / 140), T - 1, one and none; K not
    a multiple of 128 (200), F not one of 128 (24, 136: a partial weight tile)."""
    h16, wr, wg, wu, wd = _ragged(T, d, 8, fe)
    out, sel, wts = B.moe_ffn_ref(h16, wr, wg, wu, wd, 2)
    cnt = np.bincount(sel.reshape(-1), minlength=8)
    assert cnt[0] == T and cnt[1] == T - 1 and cnt[5] == 1 and (cnt[[2, 3, 4, 6, 7]] == 0).all()
    want = _blk_reference(h16, sel, wts, wg, wu, wd)
    assert np.array_equal(out, want)  # the same f64 products and roundings, another layout
    ref = _f64_reference(h16, wr, wg, wu, wd, 2)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 3e-2, err  # the rotated int8 grid's distance from f64 (~1e-2)


@pytest.mark.parametrize("T,E,k,d,fe", [(37, 8, 2, 128, 64), (70, 128, 8, 256, 32)])
def test_twins_compose_to_the_blk_reference_random(T, E, k, d, fe):
    rng = np.random.default_rng(T + E)
    h16 = rng.standard_normal((T, d)).astype(np.float16)
    wr = (rng.standard_normal((E, d)) / np.sqrt(d)).astype(np.float16)
    wg, wu, wd = _weights(rng, E, d, fe)
    out, sel, wts = B.moe_ffn_ref(h16, wr, wg, wu, wd, k)
    assert np.array_equal(out, _blk_reference(h16, sel, wts, wg, wu, wd))
    ref = _f64_reference(h16, wr, wg, wu, wd, k)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 3e-2


def test_operand_twin_pads_each_expert_to_its_tiles():
    """Tile toff[e] + j holds expert e's sorted rows 128 j ..; padding rows zero with scale 0;
    tiles past toff[E] untouched; the gather reads x row a_rows[r] // a_div."""
    rng = np.random.default_rng(1)
    E, k, T, K = 4, 2, 100, 136
    sel = np.stack([rng.choice([0, 2], 2, replace=False) for _ in range(T)]).astype(np.int32)
    sel[5, 1] = 3  # expert 3: one row; expert 1: none
    P = T * k
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    M.sort_ref(offs, toff, perm, rowpos, sel, E, B.BM)
    assert list(np.diff(toff)) == [1, 0, 1, 1]
    x = rng.standard_normal((T, K)).astype(np.float16)
    tt = np.full(B.operand_shape(P, E, K), 0xAB, np.uint8)
    MT = tt.shape[1]
    assert MT == -(-P // 128) + E
    B.operand_ref(tt, x, offs, toff, perm, k, per_token=True)
    assert (tt[:, int(toff[E]) :] == 0xAB).all()
    q, s = twin.blk_unoperand(tt[:, : int(toff[E])], int(toff[E]) * 128)
    for e in range(E):
        r0, r1 = int(offs[e]), int(offs[e + 1])
        p0 = int(toff[e]) * 128
        n = r1 - r0
        if n == 0:
            continue
        qe, se = twin.quantize_blk(x[perm[r0:r1] // k], per_token=True)
        assert np.array_equal(q[p0 : p0 + n], qe) and np.array_equal(s[p0 : p0 + n], se)
        pad = slice(p0 + n, p0 + (-(-n // 128)) * 128)
        assert not q[pad].any() and not s[pad].any()


def test_grouped_gemm_twin_writes_only_the_sorted_rows():
    rng = np.random.default_rng(2)
    E, T, k, d, fe = 8, 20, 2, 128, 32
    h16 = rng.standard_normal((T, d)).astype(np.float16)
    wg, wu, wd = _weights(rng, E, d, fe)
    sel = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    P = T * k
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    M.sort_ref(offs, toff, perm, rowpos, sel, E, B.BM)
    tt = np.zeros(B.operand_shape(P, E, d), np.uint8)
    B.operand_ref(tt, h16, offs, toff, perm, k, per_token=True)
    w = B.BlkExperts(B.experts_ref(M.interleave_glu(wg, wu)), E, 2 * fe, d)
    act = np.full((P + 3, fe), np.nan, np.float16)  # (3 rows past P: never written)
    with pytest.raises(GPUError, match="row tiles"):  # P + 3 rows can need more tiles
        B.grouped_gemm_ref(np.zeros((P + 200, fe), np.float16), tt, w, offs, toff, True)
    B.grouped_gemm_ref(act, tt, w, offs, toff, True)
    assert np.isfinite(act[:P].astype(np.float32)).all() and np.isnan(act[P:]).all()
    for p in (0, 7, P - 1):  # the pair's row against its own product
        t, e = perm[p] // k, sel.reshape(-1)[perm[p]]
        qa, sa = twin.quantize_blk(h16[t : t + 1], per_token=True)
        g = twin.blk_gemm(qa, sa, *twin.quantize_blk(wg[e], weight=True))
        u = twin.blk_gemm(qa, sa, *twin.quantize_blk(wu[e], weight=True))
        assert np.array_equal(act[p], _silu_mul(g, u)[0])


def test_experts_ref_is_each_experts_weight_operand():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((3, 200, 264)) * 0.1).astype(np.float16)
    ops_ = B.experts_ref(w)
    assert ops_.shape == B.experts_shape(3, 200, 264) == (3, 3, 2, twin.BLK_OP)
    for e in range(3):
        assert np.array_equal(ops_[e], twin.blk_operand(*twin.quantize_blk(w[e], weight=True)))


# ---- the launchers ----------------------------------------------------------------------------
class _RT:
    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return (name, entry, tuple(options), dyn_smem)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, tuple(grid), tuple(block), args, smem))


def _dev(shape, dtype):
    from fake_gpuarray import fake_dev

    return fake_dev(shape, dtype)


def test_launchers_check_and_size_their_grids():
    from minfer.cuda.paths.blk.launch import blk_smem

    rt = _RT()
    T, E, k, d, fe = 100, 128, 8, 2048, 768
    P = T * k
    MT = -(-P // 128) + E
    offs, toff = _dev((E + 1,), np.int32), _dev((E + 1,), np.int32)
    perm, h16 = _dev((P,), np.int32), _dev((T, d), np.float16)
    act, ys = _dev((P, fe), np.float16), _dev((P, d), np.float32)
    tt_gu, tt_dn = (
        _dev(B.operand_shape(P, E, d), np.uint8),
        _dev(B.operand_shape(P, E, fe), np.uint8),
    )
    assert tt_gu.shape == (16, MT, twin.BLK_OP) and tt_dn.shape == (6, MT, twin.BLK_OP)
    wgu = B.BlkExperts(_dev(B.experts_shape(E, 2 * fe, d), np.uint8), E, 2 * fe, d)
    wdn = B.BlkExperts(_dev(B.experts_shape(E, d, fe), np.uint8), E, d, fe)
    B.operand(rt, tt_gu, h16, offs, toff, perm, k, per_token=True)
    fn, grid, block, args, _ = rt.launches[-1]
    assert fn[:3] == ("mmq_blk", "moe_blk_operand_f16_tok", ("-arch=sm_90a",))
    assert grid == (MT * 16,) and block == (256,) and int(args[2]) == k and int(args[-2]) == MT
    B.operand(rt, tt_dn, act, offs, toff)
    fn, grid, _, args, _ = rt.launches[-1]
    assert fn[1] == "moe_blk_operand_f16" and grid == (-(-MT * 128 * 6 // 64),)
    assert int(args[1]) == 0  # no gather: sorted row r is act row r
    B.grouped_gemm(rt, act, tt_gu, wgu, offs, toff, True)
    fn, grid, block, args, smem = rt.launches[-1]
    assert fn[1] == "moe_blk_tok_swiglu" and grid == (12, MT) and block == (384,)
    assert smem == fn[3] == blk_smem() and int(args[-2]) == 2 * fe and int(args[-1]) == d
    B.grouped_gemm(rt, ys, tt_dn, wdn, offs, toff)
    fn, grid, _, args, _ = rt.launches[-1]
    assert fn[1] == "moe_blk" and grid == (16, MT) and int(args[-3]) == MT
    # persistent: the _p entries on at most a CTA an SM (fewer where the tiles are fewer)
    rt.sm_count = 132
    B.grouped_gemm(rt, ys, tt_dn, wdn, offs, toff, persistent=True)
    fn, grid, _, args, _ = rt.launches[-1]
    assert fn[1] == "moe_blk_p" and grid == (132,) and int(args[-3]) == MT
    rt.sm_count = 100_000
    B.grouped_gemm(rt, act, tt_gu, wgu, offs, toff, True, persistent=True)
    fn, grid, _, _, _ = rt.launches[-1]
    assert fn[1] == "moe_blk_tok_swiglu_p" and grid == (12 * MT,)
    # one clear error per bad shape
    bad = [
        (lambda: B.grouped_gemm(rt, ys, tt_dn, wdn, offs, toff, True), "expected \\[P, 1024\\]"),
        (lambda: B.grouped_gemm(rt, act, tt_gu, wdn, offs, toff, True), "expected \\[P, 1024\\]"),
        (lambda: B.grouped_gemm(rt, ys, tt_gu, wdn, offs, toff), "tt .* expected \\[6"),
        (lambda: B.grouped_gemm(rt, ys, tt_dn, wdn.wb, offs, toff), "BlkExperts"),
        (
            lambda: B.grouped_gemm(rt, _dev((P, fe), np.float32), tt_gu, wgu, offs, toff, True),
            "out: dtype float32",
        ),
        (
            lambda: B.grouped_gemm(rt, ys, tt_dn, wdn, _dev((9,), np.int32), toff),
            "toff \\(129,\\), expected \\(9,\\)",
        ),
        (
            lambda: B.grouped_gemm(
                rt, ys, _dev((6, MT - 1, twin.BLK_OP), np.uint8), wdn, offs, toff
            ),
            "can need",
        ),
        (
            lambda: B.grouped_gemm(
                rt,
                _dev((P, 36), np.float16),
                tt_gu,
                B.BlkExperts(_dev(B.experts_shape(E, 72, d), np.uint8), E, 72, d),
                offs,
                toff,
                True,
            ),
            "2F % 16",
        ),
        (lambda: B.operand(rt, tt_gu, _dev((T, 16), np.float16), offs, toff), "tt .* expected"),
        (lambda: B.operand(rt, tt_dn, _dev((P, d), np.float16), offs, toff), "tt .* expected"),
        (lambda: B.operand(rt, tt_dn, _dev((P, 20), np.float16), offs, toff), "multiple of 8"),
        (lambda: B.operand(rt, tt_gu, h16, offs, toff, perm, 0), "a_div 0"),
        (
            lambda: B.operand(rt, tt_gu, h16, offs, toff, _dev((P,), np.float32), k),
            "a_rows: dtype",
        ),
        (lambda: B.operand(rt, tt_gu, h16, _dev((600,), np.int32), toff, perm, k), "1..512"),
        (lambda: B.operand(rt, tt_gu, h16, offs, _dev((E,), np.int32), perm, k), "toff"),
    ]
    n = len(rt.launches)
    for f, msg in bad:
        with pytest.raises(GPUError, match=msg):
            f()
    assert len(rt.launches) == n  # nothing launched


# ---- MoeLayers on the heap runtime (tests/moe_heap.py) ------------------------------------------
@pytest.fixture(scope="module")
def q4file(tmp_path_factory):
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    p = tmp_path_factory.mktemp("moeblk") / "tiny-qwen3moe.gguf"
    make_synthetic_model(
        p,
        SynthOptions(
            preset="tiny-qwen3moe", qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1
        ),
        progress=False,
    )
    return p


def test_moe_layer_blk_on_the_heap_runtime(monkeypatch, q4file):
    """MoeLayers(experts=BLK_EXPERTS): the upload holds each expert's blk weight operand (of its f16
    dequant, gate|up interleaved); ffn() launches route, sort (128-row tiles), the gathered
    per-token operand, the gate|up GEMM with the swiglu, act's operand, the down GEMM and the
    combine, and equals the twins composed (moe_blk.moe_ffn_ref) bit for bit."""
    from contextlib import nullcontext

    from moe_heap import install

    from minfer.cuda.load.moe import MoeLayers
    from minfer.cuda.runtime import devarray as da
    from minfer.gguf.loader import load_model

    rt = install(monkeypatch)
    m = load_model(q4file)
    c = m.config
    il = c.n_layers - 1
    ml = MoeLayers(rt, m, ubatch=48, chunk=8 << 10, layers=[il], experts=B.BLK_EXPERTS)
    assert ml.bm == 128
    p = f"blk.{il}."
    w = {
        s: m.dequant(p + s + ".weight").astype(np.float16)
        for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    }
    gu = ml.w[p + "ffn_gate_up_exps.weight"]
    assert isinstance(gu, B.BlkExperts) and (gu.E, gu.N, gu.K) == (
        c.n_expert,
        2 * c.d_ff_exp,
        c.d_model,
    )
    want_gu = B.experts_ref(M.interleave_glu(w["ffn_gate_exps"], w["ffn_up_exps"]))
    assert np.array_equal(gu.wb.get(), want_gu)
    assert np.array_equal(
        ml.w[p + "ffn_down_exps.weight"].wb.get(), B.experts_ref(w["ffn_down_exps"])
    )
    rng = np.random.default_rng(5)
    for T in (37, 1, 48):
        h16 = rng.standard_normal((T, c.d_model)).astype(np.float16)
        x0 = rng.standard_normal((T, c.d_model)).astype(np.float32)
        x = da.to_device(rt, x0)
        rt.launches.clear()
        ml.ffn(rt, il, x, da.to_device(rt, h16), lambda *a: nullcontext())
        assert rt.launches == [
            "moe_route_f32",
            "moe_sort",
            "moe_blk_operand_f16_tok",
            "moe_blk_tok_swiglu",
            "moe_blk_operand_f16",
            "moe_blk",
            "moe_combine_f32",
        ]
        want, sel, _ = B.moe_ffn_ref(h16, *w.values(), c.n_expert_used)
        assert np.array_equal(da.rows(ml.sel, 0, T).get(), sel)
        assert np.array_equal(x.get(), x0 + want)


# ---- the plan -----------------------------------------------------------------------------------
def test_plan_counts_blk_experts_of_a_30b_a3b():
    """qwen3-30b-a3b's experts as blk operands: 16896 / 16384 B a weight (768 and 2048 rows are
    whole tiles) against f16's 2; one layer's f16 stacks as the requant staging."""
    from synth_data import fake_moe_model

    from minfer.cuda.plan import moe

    fake = fake_moe_model("qwen3-30b-a3b")[2]
    F, X = F16_EXPERTS, B.BLK_EXPERTS
    f16, blk = moe.weight_bytes(fake, F), moe.weight_bytes(fake, X)
    routers = 48 * 128 * 2048 * 2
    assert blk - routers == 48 * 128 * 3 * 768 * 2048 * 16896 // 16384
    assert 29e9 < blk < 31e9 and 57e9 < f16 < 59e9
    assert moe.staging_bytes(fake, X) == 128 * 3 * 768 * 2048 * 2
    assert moe.staging_bytes(fake, F) == 0
    c = fake.config
    extra = moe.act_bytes(c, 2048, X) - moe.act_bytes(c, 2048, F)
    assert extra == B.operand_bytes(2048 * 8, 128, 2048) and extra < 1 << 30
    with pytest.raises(
        GPUError,
        match=r"The blk int8 expert GEMMs \(--gemm blk, sm_90: ~1.03 B a weight\) hold them in 29.9 GB; otherwise use a GPU",
    ):
        moe.check_fits(fake, {"expert weights": f16}, 40 << 30, 1 << 30, F)
    with pytest.raises(GPUError, match="experts as blk int8 take"):
        moe.check_fits(fake, {"expert weights": blk}, 20 << 30, 1 << 30, X)
    # blk's bytes named only where they would fit: 25 GB free holds neither (a 235B's case)
    with pytest.raises(GPUError) as e:
        moe.check_fits(fake, {"expert weights": f16}, 25 << 30, 1 << 30, F)
    assert "experts as f16 take" in str(e.value) and "blk" not in str(e.value)
    assert "Use a GPU with more memory" in str(e.value)


def test_moe_experts_follow_the_plans_gemm_path():
    """The most compact expert GEMMs the plan's paths bring: blk's with any blk weight."""
    from minfer.cuda.plan.moe import moe_experts

    assert moe_experts({"a": ("blk", ""), "b": ("f16", "alone")}) is B.BLK_EXPERTS
    assert moe_experts({"a": ("f16", ""), "b": ("wide-kd4", "")}) is F16_EXPERTS
    assert moe_experts({"a": ("wide-kd4", "")}) is F16_EXPERTS  # (q8_1 brings none)
    assert moe_experts({}) is F16_EXPERTS


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from families_data import synth_family

    d = tmp_path_factory.mktemp("moeblkcuda")
    return {p: synth_family(p, d) for p in ("tiny-qwen3moe", "tiny-qwen2moe")}


@pytest.mark.parametrize("preset", ["tiny-qwen3moe", "tiny-qwen2moe"])
def test_backend_runs_blk_experts_with_the_blk_plan(monkeypatch, files, preset):
    """--gemm blk on sm_90: the plan's expert path is blk (its bytes in the plan), MoeLayers
    holds BlkExperts and each layer launches the moe_blk entries; --gemm f16 keeps f16.
    qwen2moe's shared expert stays on f16 under either (moe_shared_add_f32 each layer)."""
    from fake_gpuarray import install
    from test_backend_forward_cpu import FakeRT, _Arr, fake_tensor_maps

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan import moe
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    m = load_model(files[preset])
    c = m.config
    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    for path in ("blk", "f16"):
        rt = FakeRT("sm_90")
        rt.mem_info = lambda: (80 << 30, 80 << 30)
        be = CudaBackend(
            m, GemmChoice(path), rt=rt, max_tokens=64, ubatch=16, warmup=False, graphs=False
        )
        assert be.plan.moe is be.moe.experts and be.moe.experts.name == path
        assert be.plan.parts["expert weights"] == moe.weight_bytes(m, be.moe.experts)
        assert be.route_summary().endswith(
            f"; experts: {'blk int8' if path == 'blk' else 'f16'} grouped GEMMs (2 layers x 8 "
            f"experts, {c.n_expert_used} used)"
        )
        rt.launches.clear()
        be.forward_device(np.arange(21, dtype=np.int32) % 50, 0)
        entries = [e for _, e in rt.launches]
        n = c.n_layers * 2  # two chunks of 16
        assert entries.count("moe_shared_add_f32") == (n if c.d_ff_shexp else 0)
        if path == "blk":
            assert isinstance(be.moe.w["blk.0.ffn_down_exps.weight"], B.BlkExperts)
            for e in ("moe_blk_tok_swiglu", "moe_blk", "moe_blk_operand_f16_tok"):
                assert entries.count(e) == n, (e, entries)
            assert "moe_mma_f16" not in entries
            from minfer.cuda.load.prepare import needed_kernels

            assert ("mmq_blk", ("-arch=sm_90a",)) in needed_kernels(be, [5])
        else:
            assert entries.count("moe_mma_f16") == n and "moe_blk" not in entries


def test_reference_grids_emulate_the_blk_experts(q4file):
    """The CPU reference with the blk grid on the experts (check.reference_grids of a blk plan:
    weights requantized per expert, gate|up inputs per token, down's per (token, 128)) computes
    the blk twins' numbers up to f32 / f64 rounding; without it, the int8 grid's distance."""
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.check import reference_grids

    m = load_model(q4file)
    c = m.config
    routes = {"blk.0.attn_q.weight": ("blk", "")}
    grids = reference_grids(routes, m)
    assert set(grids) == {"blk.0.attn_q.weight"} | {
        f"blk.{il}.{s}.weight"
        for il in range(c.n_layers)
        for s in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    }
    assert reference_grids({"blk.0.attn_q.weight": ("f16", "")}, m) == {}
    il = c.n_layers - 1
    p = f"blk.{il}."
    w = [
        m.dequant(p + s + ".weight").astype(np.float16)
        for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    ]
    h16 = np.random.default_rng(9).standard_normal((40, c.d_model)).astype(np.float16)
    want, sel, _ = B.moe_ffn_ref(h16, *w, c.n_expert_used)
    h = h16.astype(np.float32)
    emu = ReferenceBackend(m, grids=grids)._moe(il, h)
    plain = ReferenceBackend(m)._moe(il, h)
    e_emu = np.abs(emu - want).max() / np.abs(want).max()
    e_plain = np.abs(plain - want).max() / np.abs(want).max()
    assert e_emu < 1e-3 and e_plain > 10 * e_emu, (e_emu, e_plain)  # (5e-4, 1.9e-2 seen)


def test_auto_keeps_the_experts_on_f16():
    """blk's experts only when asked for (--gemm blk): auto's plans, on any tier, hold f16's."""
    from minfer.cuda.plan.moe import moe_experts

    assert moe_experts({"a": ("blk", "")}, auto=True) is F16_EXPERTS
    assert moe_experts({"a": ("blk", "")}) is B.BLK_EXPERTS


def test_the_grid_reference_rounds_one_layer_as_the_kernels_twins():
    """One MoE layer through the CPU reference's blk grids (minfer.reference.moe.moe_ffn with
    BlkGrid on each expert's weight and activation, as ReferenceBackend(grids=) runs it) against
    the kernels' twins composed (moe_ffn_ref: the GPU's bits): 1.6e-4 apart here, against 1.7e-2
    between either and the exact layer, so the reference carries the blk experts' rounding."""
    from minfer.cuda.paths.blk.twin import BlkGrid

    rng = np.random.default_rng(0)
    T, d, E, k, fe = 96, 512, 8, 2, 256

    def f16(*shape, s=0.05):
        return (rng.standard_normal(shape) * s).astype(np.float16)

    h16, wr = f16(T, d, s=1.0), f16(E, d)
    W = {
        "ffn_gate_exps": f16(E, fe, d),
        "ffn_up_exps": f16(E, fe, d),
        "ffn_down_exps": f16(E, d, fe),
    }
    twin, sel, wts = B.moe_ffn_ref(h16, wr, *W.values(), k)
    G = BlkGrid()

    def layer(grid: bool):
        def expert(name, e):
            w = W[name.split(".")[-2]][e].astype(np.float64)
            return G.weight(w, name).astype(np.float64) if grid else w

        def linear(x, w, name):
            return (G.act(x, name).astype(np.float64) if grid else x) @ w.T

        h = h16.astype(np.float64)
        return R.moe_ffn(h, sel, wts.astype(np.float64), expert, "blk.0.", linear)

    def rel(a, b):
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    emulated, exact = layer(True), layer(False)
    assert rel(twin, emulated) < 1e-3
    assert rel(emulated, exact) > 10 * rel(twin, emulated)  # (the grid is what it carries)
