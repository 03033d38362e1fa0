"""Launchers for the super-block MMQ path (kernels/mmq_sb_q4k.cu, mmq_sb_q6k.cu, repack_q4k_sb /
repack_q6k_sb in mmq_repack.cu, the q8s split and sb_token_tables entries of quantize_q8_1.cu).

    y[M, N] (f32) = q8s(x)[M, K] @ W[N, K].T, W q4_K / q6_K, with the activations quantized per 256
    values (one scale per token and super-block) instead of q8_1's 32: the numpy oracle is
    minfer.quants.mmq_sb_ref.mmq_sb_linear_ref, the bit-exact operand twins live there too.

q4_K (kernels/mmq_sb_q4k.cu): one byte per weight value (the nibble) plus 72 B of tables per
row and 256 (1.28 B per value); per chunk the tensor core sums 32 products and one FFMA per C
value folds the sub-scale in, the activation scale once per super-block (per-token tables).
Both operands come as blocks per (super-block, 128-row / 128-token tile) that hold the
shared-memory images of the tiles and their tables (mmq_sb_ref.sb_operand): the weight from
`repack_q4k_sb`, the tokens from `sb_operand` (one launch from the activations),
`sb_operand_rmsnorm` / `sb_operand_swiglu` (the same with the rmsnorm or the swiglu before it, in
the same launch; the engine's path) or `sb_tokens` after a q8s split. Warp-specialized: one
producer thread bulk-copies each stage (two copies) into a 5-slot ring, two consumer
warpgroups own 64 weight rows each of a 128 x 128 tile. Persistent with stream-K over
super-blocks (minfer.cuda.stream_k). sm_90 only.

q6_K (kernels/mmq_sb_q6k.cu): the int8 sub-scale sc goes into three s8 planes a_i (q - 32),
sc = a0 + 7 a1 + 49 a2 (balanced base-7 digits), the activations as signed q8s bytes; no bias,
no min term. 3 bytes per value plus 16 B per 256. Tiles 128 tokens x 64 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq import launch_prepass
from minfer.cuda.mmq_wgmma import (check_raw, gate_up, launch_persistent, split_scratch_bytes,
                                   split_views, zeroed)
from minfer.errors import GPUError
from minfer.quants.mmq_sb_ref import SB_TOP, SB_WOP
from minfer.quants.mmq_wgmma_ref import pad_rows

Q4_K, Q6_K = 12, 14
SB_BM, SB_BN = 128, 128
SB6_BN = 64   # q6_K tiles: 128 tokens x 64 rows (three m64n64 accumulators per warpgroup)


def sb_smem(stages: int = 5) -> int:
    """Dynamic smem of mmq_sb_q4k (SbSmem::BYTES): `stages` slots (SB_STAGES, default 5) of
    44 KB (a stage's pieces of the weight and token blocks: the tiles' images, 128 x 128 B
    each, and their tables' parts); + 1 KB alignment and two mbarriers a slot."""
    return stages * 44 * 1024 + 1024 + 16 * stages


def _stages(build_opts: tuple) -> int:
    """The ring depth a build of mmq_sb_q4k has (-DSB_STAGES=N, an A/B option)."""
    for o in build_opts:
        if o.startswith("-DSB_STAGES="):
            return int(o.split("=", 1)[1])
    return 5


def sb6_smem() -> int:
    """Dynamic smem of mmq_sb_q6k (Sb6Smem::BYTES): 3 slots of A 128 x 128 B, the planes
    3 x 64 x 128 B, da 128 x 8 B, Ts 64 x 16 B; + 1 KB alignment."""
    return 3 * (SB_BM * 128 + 3 * SB6_BN * 128 + SB_BM * 8 + SB6_BN * 16) + 1024


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


def sb_weight_bytes(N: int, K: int, qtype: int = Q4_K) -> int:
    """Device bytes of an SbQ4K / SbQ6K [N, K]: q4_K one SB_WOP block per super-block and
    128-row tile, q6_K three planes and the tables."""
    if int(qtype) == Q6_K:
        return 3 * N * K + pad_rows(N) * (K // 256) * 16
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


@dataclass
class SbQ6K(da.DeviceArrays):
    """A q6_K weight [N, K] in the SB layout: planes wp uint8 [3, N, K] (int8 values), tables
    ts float32 [K/256, Np, 4]."""
    wp: object
    ts: object
    N: int
    K: int
    qtype = Q6_K


def repack_sb(rt, w_raw, qtype: int, N: int, K: int, what: str = "weight"):
    """raw q4_K / q6_K device bytes -> SbQ4K / SbQ6K."""
    if int(qtype) == Q6_K:
        check_raw("repack_q6k_sb", w_raw, N, K, 210, 1)
        r = SbQ6K(da.empty(rt, (3, N, K), np.uint8, f"sb q6_K planes {what}"),
                  zeroed(rt, (K // 256, pad_rows(N), 4), np.float32, f"sb q6_K tables {what}"),
                  N, K)
        fn = rt.function("mmq_repack", "repack_q6k_sb")
        n = N * (K // 16)
        rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wp), da.arg(r.ts),
                                                   np.int32(N), np.int32(K),
                                                   np.int32(pad_rows(N))))
        return r
    if int(qtype) == Q4_K:
        return repack_q4k_sb(rt, w_raw, N, K, what)
    raise GPUError(f"repack_sb: no SB layout for tensor type {qtype}")


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


def split_q8s(rt, x, aq=None, ta=None, signed: bool = False):
    """x f32 / f16 [M, K] (K % 256 == 0) -> (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]), the SB
    operand (into aq / ta if given; a fresh Ta is zeroed, so its padding rows are 0); signed:
    Aq holds q as int8 bytes (the q6_K kernel's operand), else q + 128 (q4_K's)."""
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
    launch_prepass(rt, "quantize_q8s_split" + ("_s8" if signed else ""), x,
                   (da.arg(aq), da.arg(ta), np.int32(M), np.int32(K), np.int32(t_shape[1])),
                   block=256)
    return aq, ta


def mmq_sb_linear(rt, x, w: SbQ4K, M: int, N: int, K: int, out, accumulate: bool = False,
                  build_opts: tuple = (), stream_k: bool = True, sms: int | None = None,
                  swiglu: bool = False) -> None:
    """out f32 [M, N] (= or +=) q8s(x) @ W.T. x f32 / f16 [M, K] (quantized here), its split
    (aq, ta), for q4_K optionally with its token operand (aq, ta, tt), or for q4_K its
    SbTokens. stream_k / sms / build_opts as in mmq_wgmma.mmq_wgmma_linear.
    swiglu (q4_K): W is a gate|up weight with its rows interleaved per 16 (mmq_sb_ref.glu_rows:
    8 gate rows, then their 8 up rows) and out is f16 [M, N/2] = f16(silu(gate) * up), written
    by the kernel's epilogue (the f32 [M, N] never exists); silu with fast exp and division
    (swiglu.cuh swiglu1_fast; build_opts ("-DSB_GLU_EXACT",): the swiglu layer's rounding)."""
    if not isinstance(w, (SbQ4K, SbQ6K)) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_sb_linear: weight must be an SbQ4K / SbQ6K of [{N}, {K}]")
    q6 = isinstance(w, SbQ6K)
    if swiglu and (q6 or accumulate or N % 16):
        raise GPUError(f"mmq_sb_linear: the swiglu epilogue needs a q4_K gate|up weight with N "
                       f"% 16 == 0 and C =, got {'q6_K' if q6 else 'q4_K'} N={N}"
                       f"{' +=' if accumulate else ''}")
    if M <= 0 or K % 256:
        raise GPUError(f"mmq_sb_linear: need M >= 1 and K % 256 == 0, got M={M} K={K}")
    if (M * K >= 2**31 or (3 * N * K if q6 else sb_weight_bytes(N, K)) >= 2**31 or
            M * N >= 2**31 or sb_token_bytes(M, K) >= 2**31):
        raise GPUError(f"mmq_sb_linear: [{M}, {N}, {K}] is too large for the kernels' 32-bit "
                       "offsets (every operand and table under 2^31 bytes)")
    if isinstance(x, SbTokens):
        if q6 or (x.M, x.K) != (M, K):
            raise GPUError(f"mmq_sb_linear: a q4_K token operand of [{x.M}, {x.K}] for "
                           f"{'q6_K' if q6 else 'q4_K'} [{M}, {N}, {K}]")
    elif isinstance(x, tuple):
        aq, ta = x[:2]
        da.check("mmq_sb_linear aq", aq, (M, K), np.uint8, align=16)
        da.check("mmq_sb_linear ta", ta, (K // 32, pad_rows(M), 2), np.float32, align=16)
    elif q6:
        da.check("mmq_sb_linear x", x, (M, K), (np.float32, np.float16))
        aq, ta = split_q8s(rt, x, signed=True)   # (a split passed in must match: q6_K signed)
    else:
        da.check("mmq_sb_linear x", x, (M, K), (np.float32, np.float16))
    if swiglu:
        da.check("mmq_sb_linear out", out, (M, N // 2), np.float16)
    else:
        da.check("mmq_sb_linear out", out, (M, N), np.float32)
    if not q6:   # the kernel reads the token operand (passed as x[2], or made here)
        if isinstance(x, SbTokens):
            tt = x.tt
        elif isinstance(x, tuple) and len(x) > 2:
            tt = x[2]
        elif isinstance(x, tuple):
            tt = sb_tokens(rt, aq, ta)
        else:
            tt = sb_operand(rt, x).tt
        da.check("mmq_sb_linear tt", tt, (K // 256, pad_rows(M) // 128, SB_TOP), np.uint8,
                 align=16)
        tiles = -(-M // SB_BM) * -(-N // SB_BN)
        entry = "mmq_sb_q4k" + ("_acc" if accumulate else "_swiglu" if swiglu else "")
        launch_persistent(rt, entry, "mmq_sb_q4k",
                          sb_smem(_stages(build_opts)), tiles, K // 256,
                          (da.arg(tt), da.arg(w.wb), da.arg(out), np.int32(M), np.int32(N),
                           np.int32(K)), build_opts, stream_k, sms, block=384)
        return
    tiles = -(-M // SB_BM) * -(-N // SB6_BN)
    launch_persistent(rt, "mmq_sb_q6k" + ("_acc" if accumulate else ""), "mmq_sb_q6k", sb6_smem(),
                      tiles, K // 256, (da.arg(aq), da.arg(ta), da.arg(w.wp), da.arg(w.ts),
                                        da.arg(out), np.int32(M), np.int32(N), np.int32(K)),
                      build_opts, stream_k, sms)


__all__ = ["SB_NORM_MAX_K", "SbQ4K", "SbQ6K", "SbTokens", "sb_operand", "sb_operand_rmsnorm",
           "sb_operand_swiglu", "repack_sb",
           "repack_q4k_sb", "sb_tokens", "sb_smem", "sb6_smem", "sb_split_bytes",
           "sb_token_bytes", "sb_views", "sb_weight_bytes", "split_q8s", "mmq_sb_linear"]
