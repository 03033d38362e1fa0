"""Launchers for the mixture-of-experts FFN's grouped GEMMs on the block-scaled int8 path
(kernels/mmq_blk.cu's moe_blk_* entries, sm_90a) and their numpy twins, each twin with its
launcher's signature less `rt` (numpy arrays in, outputs written in place and returned). The
routing, the sort and the weighted scatter-add are moe.cu's (minfer.cuda.ops.moe), the sort
run with BM = 128-row tiles; the math of a block is the dense blk path's
(minfer.cuda.paths.blk.twin).

Per layer, P = T k (token, slot) pairs sorted by expert (offs, toff int32 [E + 1]: expert e's
sorted rows offs[e] .. offs[e + 1], its 128-row tiles toff[e] .. toff[e + 1]):
- `operand(rt, tt, x, offs, toff, a_rows=None, a_div=1, per_token=False)`: the token operand
  tt uint8 [KB, MT, BLK_OP] of the padded sorted rows: row tile mt < toff[E] holds expert e's
  sorted rows offs[e] + (mt - toff[e]) 128 + i (i < 128; those at or past offs[e + 1] are
  padding: zeros, scale 0); sorted row r's values are x row a_rows[r] // a_div (the gather of
  the normed activations: a_rows = perm, a_div = k), else x row r; per_token: one scale per
  token (the gate|up GEMM's, as the dense GEMMs after an rmsnorm), else per (token, 128).
  Tiles mt >= toff[E] are not written. MT >= max_row_tiles(P, E) (the worst case: no sync).
- `grouped_gemm(rt, out, tt, w, offs, toff, glu=False)`: w a BlkExperts (E dense blk weight
  operands of [N, K], one per expert); glu: w's rows gate|up interleaved per 16 (quants.glu's
  glu_rows), tt per token, out f16 [P, N / 2] = f16(silu(gate) up) (moe_blk_tok_swiglu: the
  epilogue's fast silu, as the dense blk swiglu); else tt per (token, 128), out f32 [P, N]
  (moe_blk). Sorted rows of expert e = its tiles' rows @ W_e^T; padding rows never written.
  grid (ceil(N / 128), MT): one CTA per output tile, tiles past toff[E] exit at once, so one
  launch serves any routing and a CUDA graph replays it.
- `experts_ref(w16)`: the numpy twin of the upload's operands: f16 [E, N, K] -> uint8
  [E, KB, ceil(N / 128), BLK_OP] (each expert as blk.twin's weight operand).
Launchers validate shapes, dtypes and sizes (GPUError, one line) and never choose anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.ops.moe import MAX_EXPERTS, max_row_tiles
from minfer.cuda.paths.base import ExpertGemms
from minfer.cuda.paths.blk.twin import BLK_OP, BlkGrid, kblocks, pad128
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

KERNEL = "mmq_blk"  # kernels/mmq_blk.cu (sm_90a)
OPTS = ("-arch=sm_90a",)
BM = BN = 128  # the row tile (the sort's bm) and the weight row tile


def row_tiles(P: int, E: int) -> int:
    """MT of the token operand and of the grid: the most 128-row tiles P rows over E experts
    can need."""
    return max_row_tiles(P, E, BM)


def operand_shape(P: int, E: int, K: int) -> tuple[int, int, int]:
    """The token operand of P sorted rows of width K: uint8 [KB, MT, BLK_OP]."""
    return kblocks(K), row_tiles(P, E), BLK_OP


def operand_bytes(P: int, E: int, K: int) -> int:
    return int(np.prod(operand_shape(P, E, K)))


def experts_shape(E: int, N: int, K: int) -> tuple[int, int, int, int]:
    """E experts' [N, K] weights as blk operands: uint8 [E, KB, Np / 128, BLK_OP]."""
    return E, kblocks(K), pad128(N) // 128, BLK_OP


def experts_bytes(E: int, N: int, K: int) -> int:
    return int(np.prod(experts_shape(E, N, K), dtype=np.int64))


@dataclass
class BlkExperts(da.DeviceArrays):
    """A stacked expert weight [E, N, K] as E blk weight operands: wb uint8 [E, KB, Np / 128,
    BLK_OP] (expert e's: blk.launch.blk_weight's bytes of its [N, K] rows)."""

    wb: object
    E: int
    N: int
    K: int


def _i32(name, a, shape):
    da.check(name, a, shape, np.int32, require_contiguous=True)


def _groups(what: str, offs, toff) -> int:
    if len(offs.shape) != 1:
        raise GPUError(f"{what}: offs must be int32 [E + 1], got shape {tuple(offs.shape)}")
    E = int(offs.shape[0]) - 1
    if not 1 <= E <= MAX_EXPERTS:
        raise GPUError(f"{what}: {E} experts, the kernels take 1..{MAX_EXPERTS}")
    if tuple(toff.shape) != (E + 1,):
        raise GPUError(f"{what}: toff {tuple(toff.shape)}, expected ({E + 1},)")
    return E


def _device_groups(what: str, offs, toff, E: int) -> None:
    _i32(f"{what} offs", offs, (E + 1,))
    _i32(f"{what} toff", toff, (E + 1,))


# ---- the token operand --------------------------------------------------------------------------
def _operand_checks(tt, x, offs, toff, a_rows, a_div) -> tuple[int, int, int, int]:
    what = "moe blk operand"
    E = _groups(what, offs, toff)
    if len(x.shape) != 2:
        raise GPUError(f"{what}: x must be [rows, K], got shape {tuple(x.shape)}")
    R, K = (int(s) for s in x.shape)
    if R < 1 or K < 1 or K % 8:
        raise GPUError(f"{what}: x [{R}, {K}]: need rows >= 1 and K a multiple of 8")
    if a_div < 1:
        raise GPUError(f"{what}: a_div {a_div} < 1")
    P = R if a_rows is None else int(a_rows.size)
    KB, MT, _ = operand_shape(P, E, K)
    if len(tt.shape) != 3 or int(tt.shape[0]) != KB or int(tt.shape[2]) != BLK_OP:
        raise GPUError(f"{what}: tt {tuple(tt.shape)}, expected [{KB}, >= {MT}, {BLK_OP}]")
    if int(tt.shape[1]) < MT:
        raise GPUError(
            f"{what}: tt has {int(tt.shape[1])} row tiles, {P} rows over {E} experts can need {MT}"
        )
    return E, P, K, int(tt.shape[1])


def operand(rt, tt, x, offs, toff, a_rows=None, a_div: int = 1, per_token: bool = False):
    """tt uint8 [KB, MT, BLK_OP] = the padded sorted rows' operand (module docstring); x f16
    [R, K] (R >= a_rows' max // a_div + 1, or the P sorted rows)."""
    E, P, K, MT = _operand_checks(tt, x, offs, toff, a_rows, a_div)
    what = "moe blk operand"
    da.check(f"{what} x", x, None, np.float16, align=16, require_contiguous=True)
    da.check(f"{what} tt", tt, None, np.uint8, align=16, require_contiguous=True)
    _device_groups(what, offs, toff, E)
    if a_rows is not None:
        _i32(f"{what} a_rows", a_rows, (P,))
    if MT * BM * kblocks(K) >= 2**31:
        raise GPUError(f"{what}: {MT} row tiles of width {K} are past the kernel's 32-bit grid")
    args = (
        da.arg(x),
        np.uintp(0) if a_rows is None else da.arg(a_rows),
        np.int32(a_div),
        da.arg(offs),
        da.arg(toff),
        np.int32(E),
        np.int32(K),
        np.int32(MT),
        da.arg(tt),
    )
    if per_token:  # a warp per padded row
        fn = rt.function(KERNEL, "moe_blk_operand_f16_tok", OPTS)
        rt.launch(fn, (MT * BM // 8,), (256,), args)
        return tt
    quads = MT * BM * kblocks(K)  # four lanes per (padded row, block)
    rt.launch(rt.function(KERNEL, "moe_blk_operand_f16", OPTS), (-(-quads // 64),), (256,), args)
    return tt


def padded_rows(x, offs, toff, MT: int, a_rows=None, a_div: int = 1) -> np.ndarray:
    """Numpy: the f16 [MT 128, K] padded sorted rows the operand quantizes (zeros: padding and
    tiles past toff[E])."""
    x = np.asarray(x, np.float16)
    offs, toff = np.asarray(offs), np.asarray(toff)
    E = len(offs) - 1
    out = np.zeros((MT * BM, x.shape[1]), np.float16)
    for e in range(E):
        r0, r1 = int(offs[e]), int(offs[e + 1])
        if r1 <= r0:
            continue
        src = np.arange(r0, r1) if a_rows is None else np.asarray(a_rows)[r0:r1] // a_div
        p0 = int(toff[e]) * BM
        out[p0 : p0 + r1 - r0] = x[src]
    return out


def operand_ref(tt, x, offs, toff, a_rows=None, a_div: int = 1, per_token: bool = False):
    """Numpy twin of operand (blk.twin's quantize_blk and blk_operand on the padded rows: the
    kernel's bytes); tiles past toff[E] are left as they are."""
    from minfer.cuda.paths.blk.twin import blk_operand, quantize_blk

    E, P, K, MT = _operand_checks(tt, x, offs, toff, a_rows, a_div)
    n = int(np.asarray(toff)[E])
    if n:
        xp = padded_rows(x, offs, toff, n, a_rows, a_div)
        tt[:, :n] = blk_operand(*quantize_blk(xp, per_token=per_token))
    return tt


# ---- the grouped GEMMs --------------------------------------------------------------------------
def _gemm_checks(out, tt, w, offs, toff, glu) -> tuple[int, int, int, int]:
    what = "moe blk grouped gemm"
    if not isinstance(w, BlkExperts):
        raise GPUError(f"{what}: w must be a BlkExperts, got {type(w).__name__}")
    E = _groups(what, offs, toff)
    if w.E != E:
        raise GPUError(f"{what}: {w.E} experts' weights for offs of {E} experts")
    N, K = w.N, w.K
    if tuple(w.wb.shape) != experts_shape(E, N, K):
        raise GPUError(f"{what}: wb {tuple(w.wb.shape)}, expected {experts_shape(E, N, K)}")
    if glu and N % 16:
        raise GPUError(f"{what}: glu needs 2F % 16 == 0 (interleaved rows), got N={N}")
    No = N // 2 if glu else N
    if len(out.shape) != 2 or int(out.shape[1]) != No or int(out.shape[0]) < 1:
        raise GPUError(f"{what}: out {tuple(out.shape)}, expected [P, {No}]")
    P = int(out.shape[0])
    KB, MT, _ = operand_shape(P, E, K)
    if len(tt.shape) != 3 or (int(tt.shape[0]), int(tt.shape[2])) != (KB, BLK_OP):
        raise GPUError(f"{what}: tt {tuple(tt.shape)}, expected [{KB}, >= {MT}, {BLK_OP}]")
    if int(tt.shape[1]) < MT:
        raise GPUError(
            f"{what}: tt has {int(tt.shape[1])} row tiles, {P} rows over {E} experts can need {MT}"
        )
    return E, N, K, P


def grouped_gemm(
    rt, out, tt, w: BlkExperts, offs, toff, glu: bool = False, persistent: bool = False
):
    """out (glu: f16 [P, N / 2], the swiglu; else f32 [P, N]) = each expert's sorted rows @
    its weight (module docstring). tt: operand()'s (per_token with glu, else per (token, 128)).
    persistent: the _p entries, at most one CTA an SM walking the live tiles (the next tile's
    loads under this one's stores), bit-identical; not yet timed on a GPU, so not the default
    (tests/gpu/test_moe_blk_device.py compares them)."""
    from minfer.cuda.paths.blk.launch import blk_smem

    E, N, K, P = _gemm_checks(out, tt, w, offs, toff, glu)
    what = "moe blk grouped gemm"
    want = np.float16 if glu else np.float32
    da.check(f"{what} out", out, None, want, align=16, require_contiguous=True)
    da.check(f"{what} tt", tt, None, np.uint8, align=16, require_contiguous=True)
    da.check(f"{what} wb", w.wb, None, np.uint8, align=16, require_contiguous=True)
    _device_groups(what, offs, toff, E)
    MT = int(tt.shape[1])
    if MT > 65535:
        raise GPUError(f"{what}: {MT} row tiles past the grid's 65,535")
    if P * N >= 2**31:
        raise GPUError(f"{what}: [{P}, {N}] is past the kernel's 32-bit indices")
    smem = blk_smem()
    cap = getattr(rt, "smem_optin", None)
    if cap is not None and smem > cap:
        raise GPUError(f"{what}: {smem} B of shared memory, over this GPU's opt-in cap of {cap} B")
    entry = ("moe_blk_tok_swiglu" if glu else "moe_blk") + ("_p" if persistent else "")
    tiles = pad128(N) // BN * MT  # (the grid's worst case; the kernel walks the live ones)
    grid = (min(tiles, rt.sm_count),) if persistent else (pad128(N) // BN, MT)
    rt.launch(
        rt.function(KERNEL, entry, OPTS, dyn_smem=smem),
        grid,
        (384,),
        (
            da.arg(tt),
            da.arg(w.wb),
            da.arg(out),
            da.arg(offs),
            da.arg(toff),
            np.int32(E),
            np.int32(MT),
            np.int32(N),
            np.int32(K),
        ),
        smem=smem,
    )
    return out


def glu_of(y: np.ndarray) -> np.ndarray:
    """f64 [R, 2F] with rows interleaved per 16 (8 gate, their 8 up) -> f16 silu(gate) up."""
    R, N = y.shape
    c = y.reshape(R, N // 16, 2, 8)
    g, u = c[:, :, 0].reshape(R, N // 2), c[:, :, 1].reshape(R, N // 2)
    with np.errstate(over="ignore"):  # (exp(-g) = inf: silu(g) = -0)
        return (g / (1 + np.exp(-g)) * u).astype(np.float16)


def grouped_gemm_ref(out, tt, w, offs, toff, glu: bool = False):
    """Numpy twin of grouped_gemm: blk.twin's blk_gemm (float64, exact int sums) of each
    expert's tiles of tt and its weight operand; glu: silu(gate) up in f64, rounded to f16 (the
    kernel's fast silu differs in the last bits); else rounded to f32. w: a BlkExperts whose wb
    is a numpy array. Rows past offs[E] are left as they are."""
    from minfer.cuda.paths.blk.twin import blk_gemm, blk_unoperand

    E, N, K, P = _gemm_checks(out, tt, w, offs, toff, glu)
    offs, toff = np.asarray(offs), np.asarray(toff)
    for e in range(E):
        r0, r1 = int(offs[e]), int(offs[e + 1])
        if r1 <= r0:
            continue
        t0, t1 = int(toff[e]), int(toff[e + 1])
        qa, sa = blk_unoperand(np.asarray(tt)[:, t0:t1], r1 - r0)
        y = blk_gemm(qa, sa, *blk_unoperand(np.asarray(w.wb)[e], N))
        out[r0:r1] = glu_of(y) if glu else y.astype(np.float32)
    return out


def experts_ref(w16) -> np.ndarray:
    """Numpy twin of the upload: f16 [E, N, K] -> uint8 [E, KB, Np / 128, BLK_OP], each expert
    as blk.twin's weight operand (one scale per (row, pair of blocks), the rotation's 1/128)."""
    from minfer.cuda.paths.blk.twin import blk_operand, quantize_blk

    E, N, K = w16.shape
    out = np.empty(experts_shape(E, N, K), np.uint8)
    for e in range(E):
        out[e] = blk_operand(*quantize_blk(np.asarray(w16[e]), weight=True))
    return out


def moe_ffn_ref(h16, wr, wg, wu, wd, k: int, norm_w: bool = True, w_scale: float = 0.0):
    """The whole blk FFN as the twins compose it (ops.moe's routing, sort with 128-row tiles,
    combine; the blk operands and grouped GEMMs here): h16 f16 [T, d], wr f16 [E, d], wg / wu
    f16 [E, fe, d], wd f16 [E, d, fe] -> (f32 [T, d], sel, wts)."""
    from minfer.cuda.ops import moe as M

    T, d = h16.shape
    E, fe = wr.shape[0], wg.shape[1]
    logits = h16.astype(np.float32) @ wr.astype(np.float32).T
    sel, wts = np.empty((T, k), np.int32), np.empty((T, k), np.float32)
    M.route_ref(sel, wts, logits, k, norm_w, w_scale)
    P = T * k
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    M.sort_ref(offs, toff, perm, rowpos, sel, E, BM)
    wgu = BlkExperts(experts_ref(M.interleave_glu(wg, wu)), E, 2 * fe, d)
    wdn = BlkExperts(experts_ref(wd), E, d, fe)
    tt = np.zeros(operand_shape(P, E, d), np.uint8)
    operand_ref(tt, h16, offs, toff, perm, k, per_token=True)
    act = np.zeros((P, fe), np.float16)
    grouped_gemm_ref(act, tt, wgu, offs, toff, True)
    tt = np.zeros(operand_shape(P, E, fe), np.uint8)
    operand_ref(tt, act, offs, toff)
    ys = np.zeros((P, d), np.float32)
    grouped_gemm_ref(ys, tt, wdn, offs, toff)
    out = np.zeros((T, d), np.float32)
    M.combine_ref(out, ys, wts, rowpos)
    return out, sel, wts


# ---- the path's expert GEMMs (GemmPath.experts) -------------------------------------------------
class BlkExpertGemms(ExpertGemms):
    """blk's mixture-of-experts GEMMs (sm_90): each expert requantized at load from its f16
    stack (one layer's at a time: the plan's "MoE requant staging") to the dense blk path's
    weight operand (~1.03 B a weight, rows padded to 128 per expert); per layer the gathered
    normed rows' token operand (one scale per token, as the dense gate|up) -> the gate|up GEMM
    with the swiglu epilogue -> act's operand (per (token, 128)) -> the down GEMM into ys.
    ffn_down's experts run on blk too (the dense blk path keeps its ffn_down on f16 for gate 6;
    the experts' bytes are the point here)."""

    name, label = "blk", "blk int8"
    bytes_per_weight = BLK_OP / (128 * 128)
    bm = BM
    requant = True
    note = "sm_90"
    # the swiglu epilogue's fast silu is an ulp off the twin's now and then, and the down
    # GEMM's int8 grid turns a few such ulps into whole steps: the chain held 3e-3 on the H100
    parity_tol = 3e-3
    grid = BlkGrid()  # the dense path's (BlkPath.grid): rounds by the weight's name

    def stack_bytes(self, E: int, N: int, K: int) -> int:
        return experts_bytes(E, N, K)

    def staging_bytes(self, c) -> int:
        return c.n_expert * 3 * c.d_ff_exp * c.d_model * 2

    def operand_bytes(self, P: int, E: int, c) -> int:
        return max(operand_bytes(P, E, c.d_model), operand_bytes(P, E, c.d_ff_exp))

    def hold(self, rt, w16, name: str) -> BlkExperts:
        """f16 [E, N, K] on the device -> BlkExperts: each expert's rows as the dense blk
        path's weight operand (launch.blk_weight into its slot of the stack)."""
        from minfer.cuda.paths.blk.launch import blk_weight

        E, N, K = (int(s) for s in w16.shape)
        wb = da.empty(rt, experts_shape(E, N, K), np.uint8, f"blk int8 experts {name}")
        flat = da.reshape(w16, (E * N, K))
        for e in range(E):
            out = da.reshape(da.rows(wb, e, 1), wb.shape[1:])
            blk_weight(rt, da.rows(flat, e * N, N), name, out=out)
        return BlkExperts(wb, E, N, K)

    def ffn_ref(self, h16, wr, wg, wu, wd, k: int, norm_w: bool = True, w_scale: float = 0.0):
        return moe_ffn_ref(h16, wr, wg, wu, wd, k, norm_w, w_scale)

    def run(self, ml, rt, il: int, h16, P: int, act, ys, perm, op) -> None:
        k, fe, d, p = ml.k, ml.fe, ml.d, f"blk.{il}."
        offs, toff = ml.offs, ml.toff
        with op("gemm:moe_gate_up", 2.0 * P * 2 * fe * d):
            da.poison(rt, act)
            tt = _scratch(rt, ml.tt, P, ml.E, d)
            operand(rt, tt, h16, offs, toff, perm, k, per_token=True)
            grouped_gemm(rt, act, tt, ml.w[p + "ffn_gate_up_exps.weight"], offs, toff, True)
        with op("gemm:moe_down", 2.0 * P * d * fe):
            da.poison(rt, ys)
            tt = _scratch(rt, ml.tt, P, ml.E, fe)
            operand(rt, tt, act, offs, toff)
            grouped_gemm(rt, ys, tt, ml.w[p + "ffn_down_exps.weight"], offs, toff)


def _scratch(rt, buf, P: int, E: int, K: int):
    """The token operand of P sorted rows of width K: a view of the scratch buf (poisoned)."""
    shape = operand_shape(P, E, K)
    tt = da.reshape(da.rows(buf, 0, int(np.prod(shape))), shape)
    da.poison(rt, tt)
    return tt


BLK_EXPERTS = BlkExpertGemms()
