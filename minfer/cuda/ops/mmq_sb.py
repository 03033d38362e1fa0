"""Launchers for the super-block MMQ path (kernels/mmq_sb_q4k.cu, repack_q4k_sb in
mmq_repack.cu, the q8s split and sb_token_tables entries of quantize_q8_1.cu).

    y[M, N] (f32) = q8s(x)[M, K] @ W[N, K].T, W q4_K, with the activations quantized per 256
    values (one scale per token and super-block) instead of q8_1's 32: the numpy oracle is
    minfer.quants.mmq_sb_ref.mmq_sb_linear_ref, the bit-exact operand twins live there too.

One byte per weight value (the nibble) plus 72 B of tables per row and 256 (1.28 B per value);
per chunk the tensor core sums 32 products and one FFMA per C value folds the sub-scale in, the
activation scale once per super-block (per-token tables). Both operands come as blocks per
(super-block, 128-row / 128-token tile) that hold the shared-memory images of the tiles and
their tables (mmq_sb_ref.sb_operand): the weight from `repack_q4k_sb`, the tokens from
`sb_operand` (one launch from the activations), `sb_operand_rmsnorm` / `sb_operand_swiglu` (the
same with the rmsnorm or the swiglu before it, in the same launch; the engine's path) or
`sb_tokens` after a q8s split. Warp-specialized: one producer thread bulk-copies each stage
(two copies) into a 5-slot ring, two consumer warpgroups own 64 weight rows each of a 128 x 128
tile. Persistent with stream-K over super-blocks (minfer.cuda.ops.stream_k). sm_90 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.cuda.ops.mmq import launch_prepass
from minfer.cuda.ops.stream_k import build_define, launch_persistent
from minfer.errors import GPUError
from minfer.quants.mmq_sb_ref import SB_TOP, SB_WOP, pad_rows

Q4_K = 12
SB_BM, SB_BN = 128, 128


def sb_smem(stages: int = 5) -> int:
    """Dynamic smem of mmq_sb_q4k (SbSmem::BYTES): `stages` slots (SB_STAGES, default 5) of
    44 KB (a stage's pieces of the weight and token blocks: the tiles' images, 128 x 128 B
    each, and their tables' parts); + 1 KB alignment and two mbarriers a slot."""
    return stages * 44 * 1024 + 1024 + 16 * stages


def split_scratch_bytes(T: int, K: int) -> int:
    """Bytes of one q8s split activation [T, K] (Aq, then Ta at a 16-byte aligned offset)."""
    return T * K + (-(T * K)) % 16 + (K // 32) * pad_rows(T) * 8


def split_views(buf, M: int, K: int):
    """(aq uint8 [M, K], ta f32 [K/32, Mp, 2]) carved from a uint8 scratch buffer."""
    off = M * K + (-(M * K)) % 16
    need = off + (K // 32) * pad_rows(M) * 8
    if buf.nbytes < need:
        raise GPUError(f"q8s split scratch holds {buf.nbytes} B, [{M}, {K}] needs {need}")
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


def sb_token_bytes(M: int, K: int) -> int:
    """The q4_K kernel's token operand of an [M, K] activation (`sb_tokens`): one SB_TOP block
    per super-block and 128-token tile."""
    return K // 256 * (pad_rows(M) // 128) * SB_TOP


def sb_split_bytes(M: int, K: int) -> int:
    """Bytes of a q4_K SB operand [M, K] in one scratch (`sb_views`): the split, then the
    token operand at a 16-byte aligned offset."""
    n = split_scratch_bytes(M, K)
    return n + (-n) % 16 + sb_token_bytes(M, K)


def sb_views(buf, M: int, K: int):
    """(aq, ta, tt) of a q4_K SB operand [M, K] carved from a uint8 scratch buffer."""
    aq, ta = split_views(buf, M, K)
    n = split_scratch_bytes(M, K)
    off = n + (-n) % 16
    if buf.nbytes < off + sb_token_bytes(M, K):
        raise GPUError(f"q8s scratch holds {buf.nbytes} B, [{M}, {K}] needs "
                       f"{off + sb_token_bytes(M, K)}")
    tt = da.view(da.ptr(buf) + off, (K // 256, pad_rows(M) // 128, SB_TOP), np.uint8, base=buf)
    return aq, ta, tt


def sb_weight_bytes(N: int, K: int) -> int:
    """Device bytes of an SbQ4K [N, K]: one SB_WOP block per super-block and 128-row tile."""
    return K // 256 * (pad_rows(N) // 128) * SB_WOP


@dataclass
class SbQ4K(da.DeviceArrays):
    """A q4_K weight [N, K] as mmq_sb_q4k's operand: wb uint8 [K/256, Np/128, SB_WOP], per
    super-block and 128-row tile the nibbles' shared-memory images and the tables (chunk
    factors, bias, min-term operand; mmq_sb_ref.repack_q4k_sb_ref)."""
    wb: object
    N: int
    K: int
    qtype = Q4_K


def repack_q4k_sb(rt, w_raw, N: int, K: int, what: str = "weight") -> SbQ4K:
    """raw q4_K device bytes [N, K/256*144] (16-byte aligned) -> SbQ4K."""
    check_raw("repack_q4k_sb", w_raw, N, K, 144, 16)
    if sb_weight_bytes(N, K) >= 2**31:
        raise GPUError(f"repack_q4k_sb: [{N}, {K}] is too large for the kernel's 32-bit offsets")
    r = SbQ4K(zeroed(rt, (K // 256, pad_rows(N) // 128, SB_WOP), np.uint8, f"sb q4_K {what}"),
              N, K)
    fn = rt.function("mmq_repack", "repack_q4k_sb")
    n = N * (K // 256)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wb), np.int32(N),
                                               np.int32(K), np.int32(pad_rows(N))))
    return r


def sb_tokens(rt, aq, ta, tt=None):
    """A q8s split (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]) -> Tt uint8 [K/256, Mp/128, SB_TOP],
    mmq_sb_q4k's token operand: per super-block and 128-token tile the images of Aq's rows
    and the per-token tables (into tt if given)."""
    M, K = aq.shape
    Mp = ta.shape[1]
    da.check("sb_tokens aq", aq, (M, K), np.uint8, align=16)
    da.check("sb_tokens ta", ta, (K // 32, pad_rows(M), 2), np.float32, align=16)
    t_shape = (K // 256, Mp // 128, SB_TOP)
    tt = da.empty(rt, t_shape, np.uint8, "sb token operand") if tt is None else tt
    da.check("sb_tokens tt", tt, t_shape, np.uint8, align=16)
    rt.launch(rt.function("quantize_q8_1", "sb_token_tables"), ((K // 256) * (Mp // 128),),
              (256,), (da.arg(aq), da.arg(ta), da.arg(tt), np.int32(M), np.int32(K),
                       np.int32(Mp)))
    return tt


@dataclass(frozen=True)
class SbTokens:
    """mmq_sb_q4k's token operand of an activation [M, K]: tt uint8 [K/256, Mp/128, SB_TOP]
    (from `sb_operand` / `sb_operand_swiglu`, or `sb_tokens` on a q8s split)."""
    tt: object
    M: int
    K: int


def _operand_out(rt, what: str, M: int, K: int, tt):
    if K % 256 or M <= 0:
        raise GPUError(f"{what}: need M >= 1 and K a multiple of 256, got M={M} K={K}")
    if sb_token_bytes(M, K) >= 2**31:
        raise GPUError(f"{what}: [{M}, {K}] is too large for the kernels' 32-bit offsets")
    t_shape = (K // 256, pad_rows(M) // 128, SB_TOP)
    tt = da.empty(rt, t_shape, np.uint8, f"sb token operand ({what})") if tt is None else tt
    da.check(f"{what} tt", tt, t_shape, np.uint8, align=16)
    return tt


def _launch_operand(rt, entry: str, M: int, K: int, args: tuple) -> None:
    # one warp per (token, super-block), padding tokens included; 8 warps a CTA (the kernel's)
    warps = pad_rows(M) * (K // 256)
    rt.launch(rt.function("quantize_q8_1", entry), ((warps + 7) // 8,), (256,),
              (*args, np.int32(M), np.int32(K), np.int32(pad_rows(M))))


def sb_operand(rt, x, tt=None) -> SbTokens:
    """x f32 / f16 [M, K] (K % 256 == 0) -> SbTokens, the q4_K SB kernel's token operand, in one
    launch (quantize_q8_1.cu q8s_sb_operand): bit-identical to split_q8s then sb_tokens,
    without the split's Aq / Ta (into tt if given)."""
    what = "sb_operand"
    da.check(f"{what} x", x, (None, None), (np.float32, np.float16), require_contiguous=True)
    M, K = x.shape
    if da.ptr(x) % 16:
        raise GPUError(f"{what}: activations at a 16-byte unaligned address")
    tt = _operand_out(rt, what, M, K, tt)
    _launch_operand(rt, "q8s_sb_operand" + ("" if x.dtype == np.float32 else "_f16"), M, K,
                    (da.arg(x), da.arg(tt)))
    return SbTokens(tt, M, K)


def sb_operand_swiglu(rt, g, u=None, tt=None) -> SbTokens:
    """The token operand of x = f16(silu(g) * u) [M, F] in one launch (q8s_sb_operand_swiglu):
    bit-identical to layers.swiglu into f16, then sb_operand. g, u f32 [M, F]; or u None and g
    the fused gate|up output f32 [M, 2F]."""
    what = "sb_operand_swiglu"
    M, F, ldg, gp, up = gate_up(what, g, u)
    tt = _operand_out(rt, what, M, F, tt)
    _launch_operand(rt, "q8s_sb_operand_swiglu", M, F,
                    (np.uintp(gp), np.uintp(up), np.int64(ldg), da.arg(tt)))
    return SbTokens(tt, M, F)


SB_NORM_MAX_K = 8 * 256 * 4   # rmsnorm_sb_operand: 8 warps x SB_NORM_SBW (4) super-blocks


def sb_operand_rmsnorm(rt, x, w, eps: float, tt=None, h16=None) -> SbTokens:
    """The token operand of h = f16(rmsnorm(x) * w) in one launch (rmsnorm_sb_operand, a CTA
    per token): bit-identical to layers.rmsnorm into f16, then sb_operand. x f32 [M, K] (K % 256
    == 0, K <= SB_NORM_MAX_K), w f32 [K]; h16 f16 [M, K], when given, receives h too (the input
    of GEMMs on other routes); into tt if given."""
    what = "sb_operand_rmsnorm"
    da.check(f"{what} x", x, (None, None), np.float32, align=16, require_contiguous=True)
    M, K = x.shape
    if K > SB_NORM_MAX_K:
        raise GPUError(f"{what}: K={K} over the kernel's {SB_NORM_MAX_K} (8 warps x 4 "
                       "super-blocks); use layers.rmsnorm, then sb_operand")
    da.check(f"{what} w", w, (K,), np.float32, align=16)
    if h16 is not None:
        da.check(f"{what} h16", h16, (M, K), np.float16, align=16, require_contiguous=True)
    tt = _operand_out(rt, what, M, K, tt)
    rt.launch(rt.function("quantize_q8_1", "rmsnorm_sb_operand"), (pad_rows(M),), (256,),
              (da.arg(x), da.arg(w), np.float32(eps),
               np.uintp(0) if h16 is None else da.arg(h16), da.arg(tt), np.int32(M),
               np.int32(K), np.int32(pad_rows(M))))
    return SbTokens(tt, M, K)


def split_q8s(rt, x, aq=None, ta=None):
    """x f32 / f16 [M, K] (K % 256 == 0) -> (Aq uint8 [M, K] = q + 128, Ta f32 [K/32, Mp, 2]),
    the q8s split (into aq / ta if given; a fresh Ta is zeroed, so its padding rows are 0)."""
    what = "split_q8s"
    da.check(f"{what} x", x, (None, None), (np.float32, np.float16), require_contiguous=True)
    M, K = x.shape
    if K % 256 or M <= 0:
        raise GPUError(f"{what}: need M >= 1 and K a multiple of 256, got M={M} K={K}")
    t_shape = (K // 32, pad_rows(M), 2)
    aq = da.empty(rt, (M, K), np.uint8, f"q8s activations ({what})") if aq is None else aq
    ta = zeroed(rt, t_shape, np.float32, f"q8s tables ({what})") if ta is None else ta
    da.check(f"{what} aq", aq, (M, K), np.uint8, align=16)
    da.check(f"{what} ta", ta, t_shape, np.float32, align=16)
    launch_prepass(rt, "quantize_q8s_split", x,
                   (da.arg(aq), da.arg(ta), np.int32(M), np.int32(K), np.int32(t_shape[1])),
                   block=256)
    return aq, ta


def mmq_sb_linear(rt, x, w: SbQ4K, M: int, N: int, K: int, out, accumulate: bool = False,
                  build_opts: tuple = (), stream_k: bool = True, sms: int | None = None,
                  swiglu: bool = False) -> None:
    """out f32 [M, N] (= or +=) q8s(x) @ W.T. x f32 / f16 [M, K] (quantized here), its split
    (aq, ta), optionally with its token operand (aq, ta, tt), or its SbTokens. stream_k: split
    the ragged last waves' tiles by k (stream_k.schedule; tuning variant no-stream-k); sms: at
    most this many SMs; build_opts: nvcc -D options (kernel A/B builds; -DSB_STAGES=N).
    swiglu: W is a gate|up weight with its rows interleaved per 16 (quants.glu.glu_rows:
    8 gate rows, then their 8 up rows) and out is f16 [M, N/2] = f16(silu(gate) * up), written
    by the kernel's epilogue (the f32 [M, N] never exists); silu with fast exp and division
    (swiglu.cuh swiglu1_fast; build_opts ("-DSB_GLU_EXACT",): the swiglu layer's rounding)."""
    if not isinstance(w, SbQ4K) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_sb_linear: weight must be an SbQ4K of [{N}, {K}]")
    if swiglu and (accumulate or N % 16):
        raise GPUError(f"mmq_sb_linear: the swiglu epilogue needs a gate|up weight with N "
                       f"% 16 == 0 and C =, got N={N}{' +=' if accumulate else ''}")
    if M <= 0 or K % 256:
        raise GPUError(f"mmq_sb_linear: need M >= 1 and K % 256 == 0, got M={M} K={K}")
    if (M * K >= 2**31 or sb_weight_bytes(N, K) >= 2**31 or M * N >= 2**31 or
            sb_token_bytes(M, K) >= 2**31):
        raise GPUError(f"mmq_sb_linear: [{M}, {N}, {K}] is too large for the kernel's 32-bit "
                       "offsets (every operand and table under 2^31 bytes)")
    if swiglu:
        da.check("mmq_sb_linear out", out, (M, N // 2), np.float16)
    else:
        da.check("mmq_sb_linear out", out, (M, N), np.float32)
    if isinstance(x, SbTokens):
        if (x.M, x.K) != (M, K):
            raise GPUError(f"mmq_sb_linear: a token operand of [{x.M}, {x.K}] for "
                           f"[{M}, {N}, {K}]")
        tt = x.tt
    elif isinstance(x, tuple):
        aq, ta = x[:2]
        da.check("mmq_sb_linear aq", aq, (M, K), np.uint8, align=16)
        da.check("mmq_sb_linear ta", ta, (K // 32, pad_rows(M), 2), np.float32, align=16)
        tt = x[2] if len(x) > 2 else sb_tokens(rt, aq, ta)
    else:
        da.check("mmq_sb_linear x", x, (M, K), (np.float32, np.float16))
        tt = sb_operand(rt, x).tt
    da.check("mmq_sb_linear tt", tt, (K // 256, pad_rows(M) // 128, SB_TOP), np.uint8, align=16)
    tiles = -(-M // SB_BM) * -(-N // SB_BN)
    entry = "mmq_sb_q4k" + ("_acc" if accumulate else "_swiglu" if swiglu else "")
    smem = sb_smem(build_define(build_opts, "SB_STAGES", 5))
    launch_persistent(rt, entry, "mmq_sb_q4k", smem, tiles, K // 256,
                      (da.arg(tt), da.arg(w.wb), da.arg(out), np.int32(M), np.int32(N),
                       np.int32(K)), build_opts, stream_k, sms, block=384)


__all__ = ["SB_NORM_MAX_K", "SbQ4K", "SbTokens", "sb_operand", "sb_operand_rmsnorm",
           "sb_operand_swiglu", "repack_q4k_sb", "sb_tokens", "sb_smem", "sb_split_bytes",
           "sb_token_bytes", "sb_views", "sb_weight_bytes", "split_q8s", "mmq_sb_linear"]
