"""CPU: the CUDA mixture-of-experts FFN without a GPU. The numpy twins of kernels/moe.cu
(minfer.cuda.ops.moe), composed as the device runs them, against the CPU reference's MoE
(minfer.reference.moe) on ragged routings (experts with no token, one token, every token); the
grouping's invariants; the launchers' checks; the CudaBackend's whole forward of the tiny MoE
presets on the fake runtime of test_backend_forward_cpu (each layer launches router, route,
sort, both grouped GEMMs and the combine); the memory plan's f16 experts and its refusal. The
kernels against these twins on a GPU: tests/gpu/test_moe_device.py."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minfer.cuda.ops import moe as M
from minfer.errors import GPUError
from minfer.reference import moe as R
from minfer.reference import ops


def _weights(rng, E, d, fe):
    wg = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wu = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wd = (rng.standard_normal((E, d, fe)) / np.sqrt(fe)).astype(np.float16)
    return wg, wu, wd


def _reference(h16, wr, wg, wu, wd, k, norm_w=True, w_scale=0.0):
    """The CPU reference's MoE FFN (minfer.reference.moe) on the same f16 numbers, in f64."""
    h = h16.astype(np.float64)
    logits = h @ wr.astype(np.float64).T
    sel, w, _ = R.route(logits, k, "softmax", norm_w, w_scale)
    W = {"gate": wg, "up": wu, "down": wd}

    def expert(name, e):
        return W[name.split("ffn_")[1].split("_exps")[0]][e].astype(np.float64)

    out = R.moe_ffn(h, sel, w, expert, "", lambda x, Wt, name: x @ Wt.T)
    return out, sel


def _ragged(T=9, d=64, E=8, fe=48, seed=0):
    """A routing with experts of every kind: expert 0 takes every token, expert 5 token 3 alone,
    expert 1 every token but 3, the other five none (k = 2)."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, d)) * 0.1
    h[:, 0] = 1.0
    h[:, 1] = 0.0
    h[3, 1] = 1.0
    wr = rng.standard_normal((E, d)) * 0.01
    wr[:, :2] = 0.0
    wr[0, 0], wr[1, 0], wr[5, 1] = 8.0, 4.0, 20.0
    return h.astype(np.float16), wr.astype(np.float16), *_weights(rng, E, d, fe)


def test_twins_compose_to_the_reference_on_a_ragged_routing():
    h16, wr, wg, wu, wd = _ragged()
    out, sel, wts = M.moe_ffn_ref(h16, wr, wg, wu, wd, 2)
    want, rsel = _reference(h16, wr, wg, wu, wd, 2)
    assert np.array_equal(sel, rsel)
    cnt = np.bincount(sel.reshape(-1), minlength=8)
    assert cnt.tolist() == [9, 8, 0, 0, 0, 1, 0, 0]  # all, all but one, none, one
    assert sel[3].tolist() == [5, 0] and (sel[np.arange(9) != 3] == [0, 1]).all()
    err = np.abs(out - want).max() / np.abs(want).max()
    assert err < 2e-3, err  # the f16 rounding of the SwiGLU output between the GEMMs


@pytest.mark.parametrize(
    "T,E,k,norm_w,w_scale", [(1, 8, 2, True, 0.0), (37, 8, 3, True, 0.0), (64, 16, 4, False, 2.5)]
)
def test_twins_compose_to_the_reference_random(T, E, k, norm_w, w_scale):
    rng = np.random.default_rng(T * 100 + E)
    d, fe = 40, 24  # K % 8 == 0, neither a multiple of the 32-deep step
    h16 = (rng.standard_normal((T, d))).astype(np.float16)
    wr = (rng.standard_normal((E, d)) / np.sqrt(d)).astype(np.float16)
    wg, wu, wd = _weights(rng, E, d, fe)
    out, sel, wts = M.moe_ffn_ref(h16, wr, wg, wu, wd, k, norm_w, w_scale)
    want, rsel = _reference(h16, wr, wg, wu, wd, k, norm_w, w_scale)
    logits = h16.astype(np.float64) @ wr.astype(np.float64).T
    _, _, gap = R.route(logits, k)
    sure = np.abs(gap) > 1e-4  # rows far from a tie route the same in f32 and f64
    assert np.array_equal(sel[sure], rsel[sure])
    err = np.abs(out[sure] - want[sure]).max() / np.abs(want).max()
    assert err < 2e-3, err
    if norm_w:
        assert np.allclose(wts.sum(1), 1, atol=1e-6)


def test_sort_twin_groups_pairs_by_expert():
    rng = np.random.default_rng(1)
    for T, E, k in ((1, 4, 1), (7, 8, 2), (300, 128, 8), (5, 512, 3)):
        sel = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
        P = T * k
        offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
        perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
        M.sort_ref(offs, toff, perm, rowpos, sel, E)
        cnt = np.bincount(sel.reshape(-1), minlength=E)
        assert offs[0] == 0 and (np.diff(offs) == cnt).all() and offs[E] == P
        assert (np.diff(toff) == -(-cnt // M.BM)).all()
        assert toff[E] <= M.max_row_tiles(P, E)
        assert (perm[rowpos] == np.arange(P)).all()  # inverse permutations
        flat = sel.reshape(-1)
        for e in range(E):
            rows = perm[offs[e] : offs[e + 1]]
            assert (flat[rows] == e).all() and (np.diff(rows) > 0).all()  # stable


def test_max_row_tiles_is_the_worst_case():
    # every expert with one row past a full tile: ceil(P / 64) + E bounds it
    E, bm = 8, M.BM
    cnt = np.full(E, bm + 1)
    assert int((-(-cnt // bm)).sum()) <= M.max_row_tiles(int(cnt.sum()), E)
    assert M.max_row_tiles(3, 128) == 1 + 3  # at most P experts have rows


def test_grouped_gemm_twin_gathers_and_skips_empty_experts():
    rng = np.random.default_rng(2)
    E, N, K, T, k = 4, 24, 16, 5, 2
    a = rng.standard_normal((T, K)).astype(np.float16)
    w = rng.standard_normal((E, N, K)).astype(np.float16)
    sel = np.array([[0, 2], [2, 0], [0, 2], [2, 0], [0, 2]], np.int32)  # experts 1, 3 empty
    P = T * k
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    M.sort_ref(offs, toff, perm, rowpos, sel, E)
    out = np.full((P, N), np.nan, np.float32)
    M.grouped_gemm_ref(out, a, w, offs, toff, a_rows=perm, a_div=k)
    for p in range(P):
        t, j = divmod(p, k)
        want = a[t].astype(np.float32) @ w[sel[t, j]].astype(np.float32).T
        assert np.allclose(out[rowpos[p]], want, rtol=1e-5, atol=1e-5)
    g = np.zeros((P, N), np.float16)
    wu = w[::-1].copy()
    wgu = M.interleave_glu(w, wu)
    assert np.array_equal(wgu[1, 16:24], w[1, 8:16]) and np.array_equal(wgu[2, 24:32], wu[2, 8:16])
    M.grouped_gemm_ref(g, a, wgu, offs, toff, True, perm, k)
    t, j = divmod(int(perm[0]), k)
    x = a[t].astype(np.float32)
    want = ops.swiglu(x @ w[sel[t, j]].astype(np.float32).T, x @ wu[sel[t, j]].astype(np.float32).T)
    assert np.array_equal(g[0], want.astype(np.float16))


def test_combine_twin_rank_order():
    rng = np.random.default_rng(3)
    T, k, D = 6, 3, 10
    ys = rng.standard_normal((T * k, D)).astype(np.float32)
    wts = rng.random((T, k)).astype(np.float32)
    rowpos = rng.permutation(T * k).astype(np.int32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    x0 = x.copy()
    M.combine_ref(x, ys, wts, rowpos)
    y = ys[rowpos.reshape(T, k)] * wts[..., None]  # as reference.moe.moe_ffn adds them
    f = y[:, 0].copy()
    for j in range(1, k):
        f += y[:, j]
    assert np.array_equal(x, x0 + f)


def test_route_twin_is_the_reference_routing():
    logits = np.array([[0.0, 2.0, 1.0, 2.0], [3.0, 0.0, 1.0, -1.0]], np.float32)
    sel, wts = np.empty((2, 2), np.int32), np.empty((2, 2), np.float32)
    M.route_ref(sel, wts, logits, 2)
    assert sel.tolist() == [[1, 3], [0, 2]] and np.allclose(wts[0], 0.5)
    with pytest.raises(GPUError, match="k=5"):
        M.route_ref(np.empty((2, 5), np.int32), np.empty((2, 5), np.float32), logits, 5)


# ---- launchers on fake device arrays ----------------------------------------------------------
class _RT:
    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return (name, entry)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, tuple(grid), tuple(block), args))


def _dev(shape, dtype):
    from fake_gpuarray import fake_dev

    return fake_dev(shape, dtype)


def test_launchers_check_and_size_their_grids():
    rt = _RT()
    T, E, k, d, fe = 100, 128, 8, 64, 48
    P = T * k
    logits, sel, wts = _dev((T, E), np.float32), _dev((T, k), np.int32), _dev((T, k), np.float32)
    M.route(rt, sel, wts, logits, k)
    assert rt.launches[-1][0] == ("moe", "moe_route_f32") and rt.launches[-1][1] == (25,)
    offs, toff = _dev((E + 1,), np.int32), _dev((E + 1,), np.int32)
    perm, rowpos = _dev((P,), np.int32), _dev((P,), np.int32)
    M.sort(rt, offs, toff, perm, rowpos, sel, E)
    assert rt.launches[-1][1:3] == ((1,), (1024,))
    h16, act, ys = _dev((T, d), np.float16), _dev((P, fe), np.float16), _dev((P, d), np.float32)
    wgu, wd = _dev((E, 2 * fe, d), np.float16), _dev((E, d, fe), np.float16)
    M.grouped_gemm(rt, act, h16, wgu, offs, toff, True, perm, k, kernel="wmma")
    fn, grid, block, args = rt.launches[-1]
    assert fn[1] == "moe_gemm_f16_glu" and grid == (1, -(-P // 64) + E) and block == (128,)
    assert int(args[0]) == 0 and int(args[1]) == act.gpudata  # Ch, not Cf
    assert int(args[-2]) == fe  # the output width
    M.grouped_gemm(rt, ys, act, wd, offs, toff, kernel="wmma")
    fn, grid, _, args = rt.launches[-1]
    assert fn[1] == "moe_gemm_f16" and grid == (1, -(-P // 64) + E) and int(args[3]) == 0
    M.grouped_gemm(rt, act, h16, wgu, offs, toff, True, perm, k)  # the default: mma
    fn, grid, _, args = rt.launches[-1]
    assert fn[1] == "moe_mma_f16_glu" and grid == (1, -(-P // 64) + E)  # 2 fe = 96 W rows
    assert int(args[0]) == act.gpudata and int(args[-2]) == 2 * fe  # W's rows
    M.grouped_gemm(rt, ys, act, wd, offs, toff)
    assert rt.launches[-1][0][1] == "moe_mma_f16" and rt.launches[-1][1] == (1, -(-P // 64) + E)
    M.combine(rt, _dev((T, d), np.float32), ys, wts, rowpos)
    assert rt.launches[-1][1] == (T,)
    with pytest.raises(GPUError, match="expected float32"):
        M.grouped_gemm(rt, _dev((P, d), np.float16), act, wd, offs, toff)  # f16 out, no glu
    with pytest.raises(GPUError, match="does not match"):
        M.grouped_gemm(rt, act, act, wgu, offs, toff, True)
    with pytest.raises(GPUError, match="expected \\[P, 48\\]"):
        M.grouped_gemm(rt, _dev((P, 96), np.float16), h16, wgu, offs, toff, True)
    with pytest.raises(GPUError, match="2F % 16"):
        M.grouped_gemm(rt, act, h16, _dev((E, 40, d), np.float16), offs, toff, True)
    with pytest.raises(GPUError, match="kernel 'cublas'"):
        M.grouped_gemm(rt, ys, act, wd, offs, toff, kernel="cublas")
    with pytest.raises(GPUError, match="multiple of 8"):
        M.grouped_gemm(
            rt,
            _dev((P, 4), np.float32),
            _dev((T, 12), np.float16),
            _dev((E, 4, 12), np.float16),
            offs,
            toff,
        )
    with pytest.raises(GPUError, match="1..512"):
        M.route(rt, _dev((T, 1), np.int32), _dev((T, 1), np.float32), _dev((T, 600), np.float32), 1)
    with pytest.raises(GPUError, match="rowpos"):
        M.combine(rt, _dev((T, d), np.float32), ys, wts, _dev((P - 1,), np.int32))


# ---- the whole backend on the fake runtime ----------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from families_data import synth_family

    d = tmp_path_factory.mktemp("moecuda")
    return {p: synth_family(p, d) for p in ("tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe")}


def _fake_backend(monkeypatch, model, free=80 << 30, ubatch=16):
    from fake_gpuarray import install
    from test_backend_forward_cpu import FakeRT, _Arr, fake_tensor_maps

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90")
    rt.mem_info = lambda: (free, 80 << 30)
    return rt, CudaBackend(
        model, GemmChoice("auto"), rt=rt, max_tokens=64, ubatch=ubatch, warmup=False, graphs=False
    )


@pytest.mark.parametrize("preset", ["tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe"])
def test_backend_runs_moe_layers(monkeypatch, files, preset):
    from minfer.gguf.loader import load_model

    m = load_model(files[preset])
    c = m.config
    rt, be = _fake_backend(monkeypatch, m)
    assert be.moe is not None and be.fwd.moe is be.moe
    assert be.route_summary().endswith(
        f"; experts: f16 grouped GEMMs (2 layers x 8 experts, {c.n_expert_used} used)"
    )
    assert not any("_exps" in n or "gate_inp" in n or "shexp" in n for n in be.routes)
    shared = 3 * c.d_ff_shexp * c.d_model + c.d_model if c.d_ff_shexp else 0  # qwen2moe's
    assert (
        be.plan.parts["expert weights"]
        == c.n_layers
        * (3 * c.n_expert * c.d_ff_exp * c.d_model + c.n_expert * c.d_model + shared)
        * 2
    )
    assert be.plan.parts["MoE activations"] > 0
    w = be.moe.w["blk.1.ffn_down_exps.weight"]
    assert w.shape == (c.n_expert, c.d_model, c.d_ff_exp) and w.dtype == np.float16
    for ids, pos0 in ((np.arange(21, dtype=np.int32) % 50, 0), (np.array([3], np.int32), 21)):
        rt.launches.clear()
        be.forward_device(ids, pos0)
        entries = [e for f, e in rt.launches if f == "moe"]
        chunks = -(-len(ids) // 16)
        per_layer = [
            "moe_route_f32",
            "moe_sort",
            "moe_mma_f16_glu",
            "moe_mma_f16",
            "moe_combine_f32",
        ] + (["moe_shared_add_f32"] if c.d_ff_shexp else [])
        assert entries == per_layer * (c.n_layers * chunks), entries
        assert "swiglu_f32_f16" not in {e for _, e in rt.launches}
    assert be.n_past == 22
    from minfer.cuda.load.prepare import needed_kernels

    assert ("moe", ()) in needed_kernels(be, [5])


def test_backend_refuses_experts_past_free_memory(monkeypatch, files):
    from minfer.gguf.loader import load_model

    m = load_model(files["tiny-mixtral"])
    with pytest.raises(GPUError, match=r"experts as f16 take .* GB \(2 layers x 8 experts\)"):
        _fake_backend(monkeypatch, m, free=8 << 20)


def test_plan_counts_f16_experts_of_a_30b_a3b():
    """qwen3-30b-a3b: 48 x 128 experts x 3 x 768 x 2048 as f16 (~58 GB) and the routers."""
    from synth_data import fake_moe_model

    from minfer.cuda.plan import moe

    fake = fake_moe_model("qwen3-30b-a3b")[2]
    b = moe.weight_bytes(fake)
    assert b == 48 * 128 * (3 * 768 * 2048 + 2048) * 2
    assert 57e9 < b < 59e9
    c = types.SimpleNamespace(n_expert=128, n_expert_used=8, d_ff_exp=768, d_model=2048)
    assert moe.act_bytes(c, 2048) < 1 << 30


# ---- the MoE layer on a runtime that runs moe.cu's entries in numpy (tests/moe_heap.py) -------
@pytest.fixture(scope="module")
def q4files(tmp_path_factory):
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    d = tmp_path_factory.mktemp("moeq4")
    out = {}
    for p in ("tiny-qwen3moe", "tiny-mixtral"):
        out[p] = d / f"{p}.gguf"
        make_synthetic_model(
            out[p],
            SynthOptions(preset=p, qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1),
            progress=False,
        )
    return out


@pytest.mark.parametrize(
    "preset,kernel", [("tiny-qwen3moe", "mma"), ("tiny-mixtral", "mma"), ("tiny-mixtral", "wmma")]
)
def test_moe_layer_on_the_heap_runtime(monkeypatch, q4files, preset, kernel):
    """MoeLayers: the upload (pinned chunks of 8 KiB, dequantized on the "device") holds each
    expert's f16 rows; ffn() (every launcher, buffer view and argument as the forward runs
    them) equals the twins composed (to f32 rounding), every output row written by one tile,
    and the CPU reference's MoE within the f16 rounding of the activations."""
    from contextlib import nullcontext

    from moe_heap import install

    from minfer.cuda.load.moe import MoeLayers
    from minfer.cuda.runtime import devarray as da
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    rt = install(monkeypatch)
    m = load_model(q4files[preset])
    c = m.config
    ml = MoeLayers(rt, m, ubatch=48, chunk=8 << 10, kernel=kernel)
    il = c.n_layers - 1
    p = f"blk.{il}."
    w = {
        s: m.dequant(p + s + ".weight").astype(np.float16)
        for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    }
    for s in ("ffn_gate_inp", "ffn_down_exps"):
        assert np.array_equal(ml.w[p + s + ".weight"].get(), w[s]), s
    gu = M.interleave_glu(w["ffn_gate_exps"], w["ffn_up_exps"])
    assert np.array_equal(ml.w[p + "ffn_gate_up_exps.weight"].get(), gu)
    rng = np.random.default_rng(5)
    for T in (37, 1, 48):
        h16 = rng.standard_normal((T, c.d_model)).astype(np.float16)
        x0 = rng.standard_normal((T, c.d_model)).astype(np.float32)
        x = da.to_device(rt, x0)
        rt.launches.clear()
        ml.ffn(rt, il, x, da.to_device(rt, h16), lambda *a: nullcontext())
        g = "moe_mma_f16" if kernel == "mma" else "moe_gemm_f16"
        assert rt.launches == ["moe_route_f32", "moe_sort", g + "_glu", g, "moe_combine_f32"]
        assert (rt.covered == 1).all()  # the down GEMM: every row and column once
        want, sel, _ = M.moe_ffn_ref(h16, *w.values(), c.n_expert_used)
        got = x.get()
        assert np.array_equal(da.rows(ml.sel, 0, T).get(), sel)
        # (numpy's f32 GEMM sums K in an order that depends on the block's shape: the tiles
        # of the walk and the twin's whole-expert products differ in the last bits, now and
        # then an f16 rounding of the SwiGLU between the GEMMs)
        assert np.abs(got - (x0 + want)).max() <= 1e-4 * np.abs(want).max()
        ref = ReferenceBackend(m)._moe(il, h16.astype(np.float32))
        assert np.abs((got - x0) - ref).max() <= 2e-3 * np.abs(ref).max()


def test_check_moe_rows_on_the_heap_runtime(monkeypatch, q4files):
    from moe_heap import install

    from minfer.gguf.loader import load_model
    from minfer.tools.check import moe_rows

    rt = install(monkeypatch)
    rows = moe_rows(rt, load_model(q4files["tiny-qwen3moe"]))
    assert len(rows) == 2 * 3 and all(r[-1] for r in rows), rows
    assert rows[0][0].startswith("moe blk.0.ffn (8 x 256, 4 used)") and rows[0][2] == "128x256x256"


def test_check_moe_rows_for_each_paths_experts(monkeypatch, q4files):
    """`minfer check` gates the experts of every checked path this GPU runs: f16's and, on
    sm_90, blk's (each against its own twins, on the heap runtime here)."""
    from moe_heap import install

    from minfer.cuda.paths import TABLE
    from minfer.cuda.paths.blk.moe import BLK_EXPERTS
    from minfer.cuda.paths.f16.moe import F16_EXPERTS
    from minfer.gguf.loader import load_model
    from minfer.tools.check import moe_experts_of, moe_rows

    rt = install(monkeypatch)
    paths = list(TABLE.values())
    rt.arch = "sm_90"
    assert moe_experts_of(rt, paths) == [F16_EXPERTS, BLK_EXPERTS]
    rt.arch = "sm_80"
    assert moe_experts_of(rt, paths) == [F16_EXPERTS]
    assert moe_experts_of(rt, [TABLE["wide-kd4"]]) == [F16_EXPERTS]  # (brings none)
    rt.arch = "sm_90"
    rows = moe_rows(rt, load_model(q4files["tiny-qwen3moe"]), layers=[0], experts=[BLK_EXPERTS])
    assert len(rows) == 3 and all(r[-1] for r in rows), rows
    assert {r[1] for r in rows} == {"moe-blk"}
