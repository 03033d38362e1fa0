"""Launchers for the Hopper wgmma MMQ path (kernels/mmq_wgmma_q4k.cu, mmq_wgmma_q6k.cu,
mmq_repack.cu and the split entries of quantize_q8_1.cu).

    y[M, N] (f32) = x[M, K] @ W[N, K].T, W q4_K or q6_K: the math of minfer.cuda.mmq (its numpy
    twin minfer.quants.mmq_ref.mmq_linear_ref is this path's parity oracle too)

The operands live in layouts a wgmma reads from shared memory (minfer.quants.mmq_wgmma_ref
has the bit-exact twins); `repack` turns a raw weight into a `WgmmaQ4K` / `WgmmaQ6K` once, at
load, and `split_q8_1` / `split6_q8_1` are the per-GEMM activation prepasses.
- q4_K: 1 byte per weight plus 16 B of tables per 32 weights (1.5 B/weight against q4_K's
  0.5625); block tile 128 tokens x 128 weight rows (2 warpgroups of 128 x 64), stages of 128 k.
- q6_K: 1 byte per weight plus 32 B of tables per 32 (2 B/weight against 0.82); activations
  zero-padded to 2K bytes per row (each wgmma half-step sees one 16-value half); block tile
  128 weight rows x 64 tokens (2 warpgroups of 64 x 64).
Both: 1 block per SM, `WG_STAGES` deep, persistent; the smem sizes mirror the kernels'
static_asserts (tests/test_mmq_wgmma.py). sm_90 only (wgmma); minfer.cuda.mmq.pick_variant
decides when this path runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq import launch_prepass, launch_prepass_fn
from minfer.cuda.stream_k import schedule, sk_workspace
from minfer.errors import GPUError
from minfer.quants.mmq_wgmma_ref import Q6_BK, Q6_BN, Q6_BT, Q6_TWB, Q6_TXB, TPAD, pad_rows

Q4_K, Q6_K = 12, 14

WG_BN, WG_STAGES, WG_BM, WG_BK = 128, 3, 128, 128
WG_PERSIST = True    # grid <= one block per SM, each walking its work items (A/B: -DMMQ_WG_PERSIST=0)
WG_STREAM_K = True   # the last 1-2 waves' tiles split by k-stages (A/B: -DMMQ_WG_SK=0)
_GEOMETRY_ONLY = ("-DMMQ_WG_PERSIST", "-DMMQ_WG_SK")   # A/B options the launcher reads, not nvcc
_OPTS = ("-arch=sm_90a",)   # last -arch wins in nvcc: wgmma needs the sm_90a target


def wgmma_smem(bn: int = WG_BN, stages: int = WG_STAGES) -> int:
    """Dynamic smem of mmq_wgmma_q4k (WgSmem<BN, STAGES>::BYTES): per stage A 128 x 128 B,
    B bn x 128 B, the token table 4 x 128 x 8 B and two weight tables 4 x bn x 8 B; + 1 KB
    for the manual 1024-byte alignment of the swizzled tiles."""
    return stages * (WG_BM * WG_BK + bn * WG_BK + 4 * WG_BM * 8 + 2 * 4 * bn * 8) + 1024


def wgmma6_smem(stages: int = WG_STAGES) -> int:
    """Dynamic smem of mmq_wgmma_q6k (Q6Smem<STAGES>::BYTES): per stage W 128 x 128 B, X 64 x
    256 B (padded activations), one Tx and one Tw table block; + 1 KB alignment."""
    return stages * (Q6_BN * Q6_BK + Q6_BT * 2 * Q6_BK + Q6_TXB + Q6_TWB) + 1024


@dataclass
class WgmmaWeight(da.DeviceArrays):
    """A weight [N, K] in a wgmma layout (device arrays): the byte values wq uint8 [N, K] and
    the tables tw (q4_K: uint32 [2, K/32, Np, 2], Tb then Tm; q6_K: uint8 [Np/128, K/128,
    16384] blocks)."""
    wq: object
    tw: object
    N: int
    K: int
    qtype: ClassVar[int] = 0


class WgmmaQ4K(WgmmaWeight):
    qtype = Q4_K


class WgmmaQ6K(WgmmaWeight):
    qtype = Q6_K


def wgmma_weight_bytes(N: int, K: int, qtype: int = Q4_K) -> int:
    """Device bytes of a repacked [N, K] weight (WgmmaWeight.nbytes)."""
    if int(qtype) == Q6_K:
        return N * K + -(-N // Q6_BN) * (K // Q6_BK) * Q6_TWB
    return N * K + 2 * (K // 32) * pad_rows(N) * 8


def split6_scratch_bytes(T: int, K: int) -> int:
    """Bytes of one q6_K-split activation [T, K]: Xq [T, 2K], then the Tx blocks."""
    return T * 2 * K + (-(T * 2 * K)) % 16 + -(-T // Q6_BT) * (K // Q6_BK) * Q6_TXB


def split6_views(buf, M: int, K: int):
    """(xq uint8 [M, 2K], tx uint8 [Mt, K/128, 5120]) carved from a uint8 scratch buffer."""
    off = M * 2 * K + (-(M * 2 * K)) % 16
    mt = -(-M // Q6_BT)
    need = off + mt * (K // Q6_BK) * Q6_TXB
    if buf.nbytes < need:
        raise GPUError(f"split6 q8_1 scratch holds {buf.nbytes} B, [{M}, {K}] needs {need}")
    xq = da.view(da.ptr(buf), (M, 2 * K), np.uint8, base=buf)
    tx = da.view(da.ptr(buf) + off, (mt, K // Q6_BK, Q6_TXB), np.uint8, base=buf)
    return xq, tx


def split_scratch_bytes(T: int, K: int) -> int:
    """Bytes of one split activation [T, K] (Aq, then Ta at a 16-byte aligned offset)."""
    return T * K + (-(T * K)) % 16 + (K // 32) * pad_rows(T) * 8


def split_views(buf, M: int, K: int):
    """(aq uint8 [M, K], ta f32 [K/32, Mp, 2]) carved from a uint8 scratch buffer."""
    off = M * K + (-(M * K)) % 16
    need = off + (K // 32) * pad_rows(M) * 8
    if buf.nbytes < need:
        raise GPUError(f"split q8_1 scratch holds {buf.nbytes} B, [{M}, {K}] needs {need}")
    aq = da.view(da.ptr(buf), (M, K), np.uint8, base=buf)
    ta = da.view(da.ptr(buf) + off, (K // 32, pad_rows(M), 2), np.float32, base=buf)
    return aq, ta


def zeroed(rt, shape, dtype, what):
    a = da.empty(rt, shape, dtype, what)
    if a.size:
        rt.drv.memset_d8(da.ptr(a), 0, int(a.nbytes))
    return a


def check_raw(what, w_raw, N, K, block, align):
    if K % 256 or K <= 0 or N <= 0:
        raise GPUError(f"{what}: need N >= 1 and K a multiple of 256, got N={N} K={K}")
    nbytes = N * (K // 256) * block
    if not hasattr(w_raw, "gpudata") or w_raw.dtype != np.uint8 or w_raw.nbytes != nbytes:
        raise GPUError(f"{what}: weight must be uint8 device bytes, {nbytes} B for [{N}, {K}]")
    if da.ptr(w_raw) % align:
        raise GPUError(f"{what}: weight bytes not {align}-byte aligned")
    if N * K >= 2**31:
        raise GPUError(f"{what}: [{N}, {K}] is over the kernel's 2^31-byte buffers")


def repack(rt, w_raw, qtype: int, N: int, K: int, what: str = "weight") -> WgmmaWeight:
    """raw q4_K / q6_K device bytes [N, K/256*bytes] -> its wgmma layout."""
    if int(qtype) == Q6_K:
        return repack_q6k(rt, w_raw, N, K, what)
    if int(qtype) == Q4_K:
        return repack_q4k(rt, w_raw, N, K, what)
    raise GPUError(f"repack: no wgmma layout for tensor type {qtype}")


def repack_q6k(rt, w_raw, N: int, K: int, what: str = "weight") -> WgmmaQ6K:
    """raw q6_K device bytes [N, K/256*210] (any shape) -> WgmmaQ6K."""
    check_raw("repack_q6k", w_raw, N, K, 210, 1)
    r = WgmmaQ6K(da.empty(rt, (N, K), np.uint8, f"wgmma q6_K values {what}"),
                 zeroed(rt, (-(-N // Q6_BN), K // Q6_BK, Q6_TWB), np.uint8,
                         f"wgmma q6_K tables {what}"), N, K)
    fn = rt.function("mmq_repack", "repack_q6k_wgmma")
    n = N * (K // 32)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wq), da.arg(r.tw),
                                               np.int32(N), np.int32(K)))
    return r


def repack_q4k(rt, w_raw, N: int, K: int, what: str = "weight") -> WgmmaQ4K:
    """raw q4_K device bytes [N, K/256*144] (any shape, 16-byte aligned) -> WgmmaQ4K."""
    check_raw("repack_q4k", w_raw, N, K, 144, 16)
    Np = pad_rows(N)
    r = WgmmaQ4K(da.empty(rt, (N, K), np.uint8, f"wgmma nibbles {what}"),
                 zeroed(rt, (2, K // 32, Np, 2), np.uint32, f"wgmma tables {what}"), N, K)
    fn = rt.function("mmq_repack", "repack_q4k_wgmma")
    n = N * (K // 32)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wq), da.arg(r.tw),
                                               np.int32(N), np.int32(K), np.int32(Np)))
    return r


def _operands(qtype: int, M: int, K: int):
    """The split activation of a type: (values shape, tables shape, tables dtype, prepass entry,
    K multiple, names)."""
    if int(qtype) == Q6_K:
        return ((M, 2 * K), (-(-M // Q6_BT), K // Q6_BK, Q6_TXB), np.uint8,
                "quantize_q8_1_split6", Q6_BK, ("xq", "tx"))
    return ((M, K), (K // 32, pad_rows(M), 2), np.float32, "quantize_q8_1_split", 32,
            ("aq", "ta"))


def _split_outputs(rt, qtype: int, what: str, M: int, K: int, a, t):
    """(a, t, entry, extra args) of a split prepass of [M, K]: the outputs given or made (a
    fresh table is zeroed, so its padding tokens are 0), checked; the entry's base name."""
    a_shape, t_shape, t_dtype, entry, kmul, (an, tn) = _operands(qtype, M, K)
    if K % kmul or M <= 0:
        raise GPUError(f"{what}: need M >= 1 and K a multiple of {kmul}, got M={M} K={K}")
    if a is None:
        a = da.empty(rt, a_shape, np.uint8, f"q8_1 activations ({what})")
    if t is None:
        t = zeroed(rt, t_shape, t_dtype, f"q8_1 tables ({what})")
    da.check(f"{what} {an}", a, a_shape, np.uint8, align=16)
    da.check(f"{what} {tn}", t, t_shape, t_dtype, align=16)
    extra = (np.int32(t_shape[1]),) if int(qtype) == Q4_K else ()   # q4_K: Ta's row count Mp
    return a, t, entry, extra


def _split(rt, qtype: int, what: str, x, a=None, t=None):
    """The prepass of `qtype`'s split layout, into a / t when given."""
    da.check(f"{what} x", x, (None, None), (np.float32, np.float16), require_contiguous=True)
    M, K = x.shape
    a, t, entry, extra = _split_outputs(rt, qtype, what, M, K, a, t)
    launch_prepass(rt, entry, x, (da.arg(a), da.arg(t), np.int32(M), np.int32(K), *extra))
    return a, t


def gate_up(what: str, g, u=None) -> tuple[int, int, int, int, int]:
    """The gate and up inputs of a swiglu prepass -> (M, F, row stride ldg, gate and up device
    addresses): g, u f32 [M, F]; or u None and g the fused gate|up output f32 [M, 2F] (u = g +
    F, row stride 2F). Rows must be 16-byte aligned."""
    da.check(f"{what} g", g, (None, None), np.float32)
    if u is None:   # the fused gate|up GEMM output: u = g + F, row stride 2F
        M, F2 = g.shape
        if F2 % 2:
            raise GPUError(f"{what}: gate|up has {F2} columns, expected 2F")
        F, ldg = F2 // 2, F2
        gp, up = da.ptr(g), da.ptr(g) + 4 * (F2 // 2)
    else:
        M, F = g.shape
        da.check(f"{what} u", u, (M, F), np.float32)
        ldg, gp, up = F, da.ptr(g), da.ptr(u)
    if gp % 16 or up % 16 or ldg % 4:
        raise GPUError(f"{what}: gate / up rows not 16-byte aligned")
    return M, F, ldg, gp, up


def split_swiglu(rt, qtype: int, g, u=None, a=None, t=None):
    """The split operand of `qtype` (q4_K split, q6_K split6) of x = f16(silu(g) * u) [M, F],
    in one launch (quantize_q8_1.cu's _swiglu entries): bit-identical to layers.swiglu into
    f16 followed by split_q8_1 / split6_q8_1, without the f16 activation. g, u f32 [M, F]; or
    u None and g the fused gate|up output f32 [M, 2F]. Into a / t when given."""
    what = "split_swiglu"
    M, F, ldg, gp, up = gate_up(what, g, u)
    a, t, entry, extra = _split_outputs(rt, qtype, what, M, F, a, t)
    fn = rt.function("quantize_q8_1", entry + "_swiglu")
    launch_prepass_fn(rt, fn, M, F, (np.uintp(gp), np.uintp(up), np.int64(ldg), da.arg(a),
                                     da.arg(t), np.int32(M), np.int32(F), *extra))
    return a, t


def split_q8_1(rt, x, aq=None, ta=None):
    """x f32 / f16 [M, K] -> (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]), the q4_K wgmma operand
    (into aq / ta if given; a fresh Ta is zeroed, so its padding rows are 0)."""
    return _split(rt, Q4_K, "split_q8_1", x, aq, ta)


def split6_q8_1(rt, x, xq=None, tx=None):
    """x f32 / f16 [M, K] (K % 128 == 0) -> (Xq uint8 [M, 2K], Tx uint8 [Mt, K/128, 5120]),
    the q6_K wgmma operand (into xq / tx if given; a fresh Tx is zeroed: padding tokens 0)."""
    return _split(rt, Q6_K, "split6_q8_1", x, xq, tx)


def _geometry(build_opts: tuple) -> tuple[int, bool, bool]:
    """(stages, persistent, stream-K) of a kernel build: the defaults, or -D overrides (kernel A/B
    timing builds; the last two only steer the launch geometry)."""
    stages, persist, sk = WG_STAGES, WG_PERSIST, WG_STREAM_K
    for o in build_opts:
        key, _, val = o.partition("=")
        if key == "-DMMQ_WG_STAGES":
            stages = int(val)
        elif key == "-DMMQ_WG_PERSIST":
            persist = bool(int(val))
        elif key == "-DMMQ_WG_SK":
            sk = bool(int(val))
    return stages, persist, sk


def launch_persistent(rt, entry: str, name: str, smem: int, tiles: int, KT: int, args,
                      build_opts: tuple, stream_k: bool, sms: int | None,
                      block: int = 256) -> None:
    """One launch of the persistent kernel kernels/<name>.cu's `entry` (the C = or the C +=
    one; the wgmma and SB kernels) with `block` threads: the grid and the stream-K split of
    `tiles` tiles of KT k-units (`schedule`), the smem cap, the workspace; args end before
    (dp, ws, flags)."""
    _, persist, sk = _geometry(build_opts)
    if smem > rt.smem_optin:
        raise GPUError(f"{entry}: {smem} B of shared memory needed, over this GPU's opt-in cap "
                       f"of {rt.smem_optin} B")
    nvcc = tuple(o for o in build_opts if o.partition("=")[0] not in _GEOMETRY_ONLY)
    fn = rt.function(name, entry, (*_OPTS, *nvcc), dyn_smem=smem)
    sms = rt.sm_count if sms is None else min(int(sms), rt.sm_count)
    grid, dp = schedule(tiles, sms, persist, stream_k and sk)
    if (tiles - dp) * KT >= 2**31:
        raise GPUError(f"{entry}: too many stream-K units ({tiles - dp} tiles x {KT} stages)")
    ws, flags = sk_workspace(rt)
    rt.launch(fn, (grid,), (block,), (*args, np.int32(dp), ws, flags), smem)


def mmq_wgmma_linear(rt, x, w: WgmmaWeight, M: int, N: int, K: int, out,
                     accumulate: bool = False, split=None, build_opts: tuple = (),
                     stream_k: bool = True, sms: int | None = None) -> None:
    """out f32 [M, N] (= or +=) x @ W.T. x f32 / f16 [M, K] (split here, into `split` when
    given) or already split for w's type ((aq, ta) for q4_K, (xq, tx) for q6_K) passed as x.
    stream_k: split the ragged last waves' tiles by k (`schedule`; GemmConfig.stream_k);
    sms: cap the grid below the SM count (tests: stream-K on small problems).
    build_opts: extra nvcc -D options (kernel A/B runs; the engine passes none)."""
    if not isinstance(w, WgmmaWeight) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_wgmma_linear: weight must be a WgmmaQ4K / WgmmaQ6K of [{N}, {K}]")
    if M <= 0 or K % WG_BK:
        raise GPUError(f"mmq_wgmma_linear: need M >= 1 and K % {WG_BK} == 0, got M={M} K={K}")
    if M * 2 * K >= 2**31 or M * N >= 2**31:
        raise GPUError("mmq_wgmma_linear: problem too large (32-bit offsets)")
    a_shape, t_shape, t_dtype, _, _, (an, tn) = _operands(w.qtype, M, K)
    if isinstance(x, tuple):
        a, t = x
        da.check(f"mmq_wgmma_linear {an}", a, a_shape, np.uint8, align=16)
        da.check(f"mmq_wgmma_linear {tn}", t, t_shape, t_dtype, align=16)
    else:
        da.check("mmq_wgmma_linear x", x, (M, K), (np.float32, np.float16))
        a, t = (split6_q8_1 if w.qtype == Q6_K else split_q8_1)(rt, x, *(split or (None, None)))
    da.check("mmq_wgmma_linear out", out, (M, N), np.float32)
    stages = _geometry(build_opts)[0]
    if w.qtype == Q6_K:   # tiles: 64 tokens x 128 rows
        name, smem, bm = "mmq_wgmma_q6k", wgmma6_smem(stages), Q6_BT
    else:                 # tiles: 128 tokens x 128 rows
        name, smem, bm = "mmq_wgmma_q4k", wgmma_smem(WG_BN, stages), WG_BM
    tiles = -(-M // bm) * -(-N // WG_BN)   # Q6_BN == WG_BN
    # C += runs the _acc entry (reductions into C); the q4_K entries also take the flag (their
    # comment in mmq_wgmma_q4k.cu says why)
    flag = (np.int32(1 if accumulate else 0),) if w.qtype == Q4_K else ()
    launch_persistent(rt, name + ("_acc" if accumulate else ""), name, smem, tiles, K // WG_BK,
            (da.arg(a), da.arg(t), da.arg(w.wq), da.arg(w.tw), da.arg(out), np.int32(M),
             np.int32(N), np.int32(K), *flag), build_opts, stream_k, sms)


__all__ = ["WgmmaWeight", "WgmmaQ4K", "WgmmaQ6K", "repack", "repack_q4k", "repack_q6k",
           "split_q8_1", "split6_q8_1", "split_swiglu", "mmq_wgmma_linear", "wgmma_smem",
           "wgmma6_smem", "wgmma_weight_bytes", "split_scratch_bytes", "split_views",
           "split6_scratch_bytes", "split6_views", "TPAD"]
