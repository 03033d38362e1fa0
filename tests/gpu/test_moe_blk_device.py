"""GPU (sm_90 only; skips elsewhere): the mixture-of-experts FFN's blk int8 expert path
(kernels/mmq_blk.cu's moe_blk_* entries, minfer.cuda.paths.blk.moe; MoeLayers(experts=BLK_EXPERTS)).

Kernels against their numpy twins (the CPU side: tests/test_moe_blk_cpu.py):
- the expert weight operands of the upload (blk_weight into each expert's slot) and the token
  operands of the padded sorted rows (moe_blk_operand_f16_tok with the gather, moe_blk_operand_f16
  without): bit for bit on every tile below toff[E], the tiles past it untouched;
- moe_blk_tok_swiglu / moe_blk on the device's operands against the float64 twin: the plain
  GEMM within the dense blk parity bounds (rel err 1e-5 Frobenius, 1e-4 of the max: the f32
  folds), the swiglu within 2e-3 (the epilogue's fast silu and the f16 rounding, as the dense
  test_blk_swiglu), bitwise on a second launch, no row past P written; ragged routings (experts
  with no row, one row, 130+ rows), K and N not multiples of 128, odd block counts, the real
  layer shapes (Qwen3-30B-A3B: 128 experts of 768 over 2048, 8 used; Mixtral's 8 of 14336 over
  4096 cut to 1792);
- the chain (router GEMM, route, sort on 128-row tiles, operands, both grouped GEMMs,
  combine) against moe_blk.moe_ffn_ref, rel err <= 3e-3 on the rows routed alike (the fast silu
  moves an f16 act value by an ulp now and then, and with it an int8 of the down operand).
The whole forward on --gemm blk (tiny qwen3moe and Mixtral, F16 and Q4_K_M) against the CPU
reference with the blk grids on the experts too (check.reference_grids): logits tie-aware about
the router, rel err before the first router near-tie within the bound derived from the grid
reference's own spread (minfer.reference.spread), greedy-32 tie-aware identical; the
same prompt twice bit for bit (graph replay).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import MOE, MOE_NAMES, check_moe_chain, moe_models, rel_err

from minfer.cuda.ops import moe as M
from minfer.cuda.paths.blk import moe as B

pytestmark = pytest.mark.gpu

TOL = 0.05  # max |dlogit| at any position vs the grid-emulating reference (router-tie-aware)


def _dev(rt, a):
    from minfer.cuda.runtime import devarray as da

    return da.to_device(rt, np.ascontiguousarray(a))


def _grouping(sel, E):
    P = sel.size
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    M.sort_ref(offs, toff, perm, rowpos, sel, E, B.BM)
    return offs, toff, perm, rowpos


def _sel(T, E, k, rng):
    """Expert 0 in every token (T rows: past a tile from T = 129), expert E-1 in token 0 alone,
    expert 1 in none, the rest random."""
    if k < 2 or E < 5:
        return rng.integers(0, E, (T, k)).astype(np.int32)
    sel = np.empty((T, k), np.int32)
    pool = list(range(2, E - 1))
    for t in range(T):
        rest = list(rng.choice(pool, k - 1, replace=False))
        if t == 0:
            rest[-1] = E - 1
        sel[t] = [0, *rest]
    return sel


def _experts(rt, w16):
    """The upload's requantization (blk_weight into each expert's slot) -> BlkExperts."""
    from minfer.cuda.paths.blk.launch import blk_weight
    from minfer.cuda.runtime import devarray as da

    E, N, K = w16.shape
    wb = da.empty(rt, B.experts_shape(E, N, K), np.uint8)
    flat = _dev(rt, w16.reshape(E * N, K))
    for e in range(E):
        blk_weight(rt, da.rows(flat, e * N, N), out=da.reshape(da.rows(wb, e, 1), wb.shape[1:]))
    return B.BlkExperts(wb, E, N, K)


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("T,E,k,K", [(1, 8, 2, 128), (140, 8, 2, 200), (300, 128, 8, 2048)])
def test_operands_bitwise(hopper, same_bytes, T, E, k, K, per_token):
    rt = hopper
    rng = np.random.default_rng(T + K)
    sel = _sel(T, E, k, rng)
    offs, toff, perm, _ = _grouping(sel, E)
    P = T * k
    x = (rng.standard_normal((T if per_token else P, K)) * 2).astype(np.float16)
    x[:, 3 % K] *= 40  # an outlier channel
    x[min(1, len(x) - 1)] = 0  # an all-zero row: scale 0
    rows = (_dev(rt, perm), k) if per_token else (None, 1)
    shape = B.operand_shape(P, E, K)
    tt = _dev(rt, np.full(shape, 0xAB, np.uint8))
    B.operand(rt, tt, _dev(rt, x), _dev(rt, offs), _dev(rt, toff), *rows, per_token=per_token)
    want = np.full(shape, 0xAB, np.uint8)
    B.operand_ref(
        want, x, offs, toff, perm if per_token else None, k if per_token else 1, per_token
    )
    assert same_bytes(tt, want)


@pytest.mark.parametrize(
    "T,E,k,d,fe",
    [
        (9, 8, 2, 200, 24),  # K % 128 != 0, one partial weight tile
        (140, 8, 2, 256, 136),  # an expert of 140 rows (two tiles), one of one, one of none
        (1, 8, 2, 256, 256),  # one token
        (300, 16, 4, 1096, 520),  # odd block counts (9, 5): the per-pair fold's odd last block
        (512, 128, 8, 2048, 768),  # Qwen3-30B-A3B's layer
        (256, 8, 2, 4096, 1792),  # Mixtral-8x7B's, its 14336 cut to 1792
    ],
)
def test_grouped_gemms_against_the_twin(hopper, same_bytes, T, E, k, d, fe):
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    rng = np.random.default_rng(T + d)
    sel = _sel(T, E, k, rng)
    offs, toff, perm, _ = _grouping(sel, E)
    P = T * k
    h16 = rng.standard_normal((T, d)).astype(np.float16)
    wg = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wu = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wd = (rng.standard_normal((E, d, fe)) / np.sqrt(fe)).astype(np.float16)
    wgu16 = M.interleave_glu(wg, wu)
    wgu, wdn = _experts(rt, wgu16), _experts(rt, wd)
    assert same_bytes(wgu.wb, B.experts_ref(wgu16)) and same_bytes(wdn.wb, B.experts_ref(wd))
    od, td = _dev(rt, offs), _dev(rt, toff)
    tt = da.empty(rt, B.operand_shape(P, E, d), np.uint8)
    B.operand(rt, tt, _dev(rt, h16), od, td, _dev(rt, perm), k, per_token=True)
    tt_h = tt.get()
    # gate|up with the swiglu: P rows of a buffer of P + 5 (the 5 past P stay NaN)
    buf = _dev(rt, np.full((P + 5, fe), np.nan, np.float16))
    B.grouped_gemm(rt, da.rows(buf, 0, P), tt, wgu, od, td, True)
    got = buf.get()
    assert np.isnan(got[P:].astype(np.float32)).all()
    got = got[:P].astype(np.float64)
    ref_act = np.zeros((P, fe), np.float16)
    B.grouped_gemm_ref(ref_act, tt_h, B.BlkExperts(wgu.wb.get(), E, 2 * fe, d), offs, toff, True)
    assert np.isfinite(got).all()
    e1 = rel_err(got, ref_act.astype(np.float64))
    assert e1 < 2e-3, e1
    # down on the twin's act: its operand per (token, 128), the plain GEMM into f32
    tt2 = da.empty(rt, B.operand_shape(P, E, fe), np.uint8)
    B.operand(rt, tt2, _dev(rt, ref_act), od, td)
    ref_ys = np.zeros((P, d), np.float32)
    B.grouped_gemm_ref(ref_ys, tt2.get(), B.BlkExperts(wdn.wb.get(), E, d, fe), offs, toff)
    outs = []
    for _ in range(2):
        ys = _dev(rt, np.full((P, d), np.nan, np.float32))
        B.grouped_gemm(rt, ys, tt2, wdn, od, td)
        outs.append(ys.get())
    assert np.isfinite(outs[0]).all() and np.array_equal(outs[0], outs[1])
    assert np.linalg.norm(outs[0] - ref_ys) / np.linalg.norm(ref_ys) < 1e-5
    assert np.abs(outs[0] - ref_ys).max() / np.abs(ref_ys).max() < 1e-4
    # the persistent entries (a CTA an SM walking the live tiles): the same bytes
    buf_p = _dev(rt, np.full((P + 5, fe), np.nan, np.float16))
    B.grouped_gemm(rt, da.rows(buf_p, 0, P), tt, wgu, od, td, True, persistent=True)
    assert same_bytes(buf_p, buf.get())
    ys_p = _dev(rt, np.full((P, d), np.nan, np.float32))
    B.grouped_gemm(rt, ys_p, tt2, wdn, od, td, persistent=True)
    assert same_bytes(ys_p, outs[0])
    print(f"\nmoe blk T={T} E={E} k={k} d={d} fe={fe}: swiglu rel err {e1:.2e}")


@pytest.mark.parametrize(
    "T,E,k,d,fe", [(1, 8, 2, 256, 256), (61, 8, 4, 256, 256), (700, 128, 8, 2048, 768)]
)
def test_moe_blk_chain_against_the_twins(hopper, T, E, k, d, fe):
    from minfer.cuda.paths.f16.gemm import gemm_f16_nt
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    rng = np.random.default_rng(T * E)
    h16 = rng.standard_normal((T, d)).astype(np.float16)
    wr = (rng.standard_normal((E, d)) / np.sqrt(d)).astype(np.float16)
    wg = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wu = (rng.standard_normal((E, fe, d)) / np.sqrt(d)).astype(np.float16)
    wd = (rng.standard_normal((E, d, fe)) / np.sqrt(fe)).astype(np.float16)
    P = T * k
    e = da.empty
    hd = _dev(rt, h16)
    logits = e(rt, (T, E), np.float32)
    gemm_f16_nt(hd, _dev(rt, wr), out=logits, rt=rt)
    sel, wts = e(rt, (T, k), np.int32), e(rt, (T, k), np.float32)
    M.route(rt, sel, wts, logits, k)
    offs, toff = e(rt, (E + 1,), np.int32), e(rt, (E + 1,), np.int32)
    perm, rowpos = e(rt, (P,), np.int32), e(rt, (P,), np.int32)
    M.sort(rt, offs, toff, perm, rowpos, sel, E, B.BM)
    act, ys = e(rt, (P, fe), np.float16), e(rt, (P, d), np.float32)
    tt = e(rt, B.operand_shape(P, E, d), np.uint8)
    B.operand(rt, tt, hd, offs, toff, perm, k, per_token=True)
    B.grouped_gemm(rt, act, tt, _experts(rt, M.interleave_glu(wg, wu)), offs, toff, True)
    tt2 = e(rt, B.operand_shape(P, E, fe), np.uint8)
    B.operand(rt, tt2, act, offs, toff)
    B.grouped_gemm(rt, ys, tt2, _experts(rt, wd), offs, toff)
    x = _dev(rt, np.zeros((T, d), np.float32))
    M.combine(rt, x, ys, wts, rowpos)
    out = x.get()
    want, rsel, _ = B.moe_ffn_ref(h16, wr, wg, wu, wd, k)
    label = f"moe blk chain T={T} E={E} k={k}"
    check_moe_chain(label, out, sel.get(), logits.get(), want, rsel, k, 3e-3)


# ---- the whole forward on --gemm blk ----------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return moe_models(tmp_path_factory.mktemp("moe_blk_dev"))


NAMES = MOE_NAMES


# The H100 (2026-12-07), with the bounds of the dense blk path (rel 3e-2, TOL 0.05): qwen3moe
# rel 0.040 (F16) / 0.052 (q4km), mixtral 18 / 28 positions past 0.05 before a tie. The CPU
# diagnosis (minfer.reference.spread; tests/test_moe_grid_spread.py): not the kernels. The
# forward with each MoE layer as their bit-exact twins sits rel 0.006-0.009 (max 0.04-0.05)
# from the grid reference, but the grid reference itself moves rel 0.012-0.016 (max 0.07-0.11,
# 26-88 positions past 0.05) when its MoE input moves by 1e-3 (the continuous forward: 1.4e-3,
# 0.01): the int8 grids' rounding flips amplify the engine's own rounding ~10x; its f64 run
# is 0.010-0.021 from its f32 run. And qwen3moe's 200 positions ran past router near-ties
# (`first_near_tie(...)[0] or T` read a tie at token 0 as none). The bounds here are derived:
# SPREAD_MARGIN times the grid reference's spread on the prompt (rel at least 3e-2, TOL at
# least 0.05). Still xfail until an H100 run shows them held.
@pytest.mark.xfail(
    reason="blk experts' forward against the derived bounds not yet run on the H100", strict=False
)
@pytest.mark.parametrize("name", NAMES)
def test_blk_forward_matches_the_grid_reference(hopper, models, name, report):
    """--gemm blk: every GEMM and the experts on blk; every position's logits of a 200-token
    prompt against the CPU reference with the blk grids (dense weights and experts:
    check.reference_grids) within max(TOL, SPREAD_MARGIN x the grid reference's own max
    |dlogit| spread), tie-aware about the router; rel err <= max(3e-2, SPREAD_MARGIN x its rel
    spread) before the first router near-tie (minfer.reference.spread: the grids amplify any
    engine's rounding); greedy 32 tie-aware identical. Figures to the run's summary."""
    from minfer.batch import single
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.reference.forward import ReferenceBackend
    from minfer.reference.moe import SPREAD_MARGIN, positions_before_tie, tie_excused
    from minfer.reference.spread import grid_spread
    from minfer.tools.check import identity_verdict, reference_grids

    m = models[name]
    gpu = CudaBackend(m, GemmChoice("blk"), max_tokens=512, ubatch=128)
    assert gpu.moe.experts is B.BLK_EXPERTS and gpu.plan.moe is B.BLK_EXPERTS
    grids = reference_grids(gpu.routes, m)
    cpu = ReferenceBackend(m, max_tokens=512, grids=grids)
    best = None  # the prompt (of 8 seeds) whose first router near-tie comes latest
    for seed in range(7, 15):
        ids = np.random.default_rng(seed).integers(0, m.config.vocab_size, 200).astype(np.int32)
        cpu.router_log = []
        want = cpu.window_logits(ids, 0)
        n = positions_before_tie(cpu.router_log, len(ids))  # (a tie at token 0: none)
        if best is None or n > best[0]:
            best = (n, ids, want, cpu.router_log)
        if n >= 64:
            break
    n, ids, want, cpu.router_log = best
    # the derived bounds: the grid reference's own spread under the engine's rounding
    sr, sd, _ = grid_spread(m, grids, ids, max(n, 1))
    bound, tol = max(3e-2, SPREAD_MARGIN * sr), max(TOL, SPREAD_MARGIN * sd)
    got = gpu.window_logits(ids, 0)
    errs = np.abs(got - want).max(axis=1)
    rel = rel_err(got[:n], want[:n])
    ok, line = tie_excused(np.arange(len(ids)), errs, cpu.router_log, tol)
    ref = single.run(ReferenceBackend(m, grids=grids), ids[:64], 32, 512)
    res = single.run(gpu, ids[:64], 32, 512)
    v, diff = identity_verdict(ref, res)
    report(
        f"moe cuda blk {name}: logits rel err {rel:.2e} over {n} positions (bound {bound:.3f}"
        f" from the grid spread {sr:.2e}; max |d| {errs.max():.4f}, tol {tol:.3f}; {line}); "
        f"greedy {v.describe()} (max |dlogit| {diff:.4f})"
    )
    assert ok, f"{name}: {line}"
    assert v.ok, f"{name}: {v.describe()}"
    assert n >= 16, f"{name}: a router near-tie at token {n}: too few positions to measure"
    assert rel <= bound


@pytest.mark.parametrize("name", MOE)
def test_blk_forward_is_deterministic_and_graph_safe(hopper, models, name):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    m = models[name]
    ids = np.random.default_rng(3).integers(0, m.config.vocab_size, 150).astype(np.int32)
    be = CudaBackend(m, GemmChoice("blk"), max_tokens=256, ubatch=64)
    a = be.forward(ids, 0)
    be.reset()
    b = be.forward(ids, 0)
    assert be._graphs, "no chunk graph was recorded"
    eager = CudaBackend(m, GemmChoice("blk"), max_tokens=256, ubatch=64, graphs=False)
    assert np.array_equal(a, b) and np.array_equal(a, eager.forward(ids, 0))
