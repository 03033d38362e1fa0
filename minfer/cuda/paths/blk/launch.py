"""Launchers for the block-scaled int8 path (kernels/mmq_blk.cu; numpy twins in
minfer.cuda.paths.blk.twin):

    y[M, N] (f32) = blk(x)[M, K] @ blk(W)[N, K].T

x and W are rotated by a 128-point Walsh-Hadamard transform per 128 of K and quantized to int8
with one f32 scale per (token, 128 of K) and per (weight row, 256 of K: a pair of blocks) (1.03
B per weight on the GPU), or, for a token operand made `per_token`, one scale per token (the
GEMM's fold is shorter and runs once per pair: mmq_blk_tok). `blk_weight`
requantizes an f16 weight on the GPU at load, `blk_operand` the f16 activations before each
GEMM (one launch: the same kernel; `blk_operand_rmsnorm` makes it from the residual in the
rmsnorm's launch), `mmq_blk_linear` runs the GEMM: wgmma s8,
the int32 sums folded into f32 once per 128 of K, persistent with stream-K over 128-K stages
(minfer.cuda.paths.blk.stream_k). sm_90 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths.blk.stream_k import build_define, launch_persistent
from minfer.cuda.paths.blk.twin import WPAIR, blk_bytes, blk_shape, kblocks, pad128
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError
from minfer.quants.glu import glu_act

BM = BN = 128
_OPTS = ("-arch=sm_90a",)


def blk_smem(stages: int = 6) -> int:
    """Dynamic smem of mmq_blk (BlkSmem::BYTES): `stages` slots of 34 KB (a weight image and a
    token block), + 1 KB alignment and two mbarriers a slot."""
    return stages * 34 * 1024 + 1024 + 16 * stages


def _check_f16(what: str, x):
    da.check(what, x, (None, None), np.float16, align=16)
    R, K = x.shape
    if R <= 0 or K <= 0 or K % 8:
        raise GPUError(f"{what}: need rows >= 1 and K a multiple of 8, got [{R}, {K}]")
    return R, K


@dataclass
class BlkWeight(da.DeviceArrays):
    """A weight [N, K] as mmq_blk's operand: wb uint8 [KB, Np/128, BLK_OP], per (128-K block,
    128-row tile) the rotated int8 image and the rows' f32 scales (with the rotation's 1/128)."""

    wb: object
    N: int
    K: int


@dataclass(frozen=True)
class BlkTokens:
    """mmq_blk's token operand of an activation [M, K]: tt uint8 [KB, Mp/128, BLK_OP];
    per_token: one scale per token (in every block's slot), read by the mmq_blk_tok entries."""

    tt: object
    M: int
    K: int
    per_token: bool = False


def blk_weight(rt, w16, what: str = "weight", out=None) -> BlkWeight:
    """f16 [N, K] on the device -> BlkWeight (blk_operand_f16, scales times 1/128, one per
    (row, pair of blocks): blk_ref.WPAIR); into out (uint8 [KB, Np/128, BLK_OP]) if given (a
    slot of a stack: the MoE experts')."""
    N, K = _check_f16("blk_weight", w16)
    if blk_bytes(N, K) >= 2**31:
        raise GPUError(f"blk_weight: [{N}, {K}] is too large for the kernel's 32-bit offsets")
    if out is not None:
        da.check("blk_weight out", out, blk_shape(N, K), np.uint8, align=16)
    wb = da.empty(rt, blk_shape(N, K), np.uint8, f"blk int8 {what}") if out is None else out
    _launch_operand(rt, w16, N, K, wb, 1 / 128, pair=WPAIR)
    return BlkWeight(wb, N, K)


def _launch_operand(
    rt, x16, R: int, K: int, out, smul: float, per_token: bool = False, pair: int = 1
) -> None:
    args = (da.arg(x16), np.int64(K), np.int32(R), np.int32(K), np.int32(pad128(R)), da.arg(out))
    if per_token:  # a warp per row
        rt.launch(
            rt.function("mmq_blk", "blk_operand_f16_tok", _OPTS), (pad128(R) // 8,), (256,), args
        )
        return
    quads = pad128(R) * -(-kblocks(K) // pair)  # four lanes per (row, block or pair)
    rt.launch(
        rt.function("mmq_blk", "blk_operand_f16", _OPTS),
        ((quads + 63) // 64,),
        (256,),
        (*args, np.float32(smul), np.int32(pair)),
    )


def _token_out(rt, what: str, M: int, K: int, tt):
    """The token operand array of [M, K]: tt checked, or a new one."""
    if blk_bytes(M, K) >= 2**31:
        raise GPUError(f"{what}: [{M}, {K}] is too large for the kernels' 32-bit offsets")
    tt = da.empty(rt, blk_shape(M, K), np.uint8, "blk token operand") if tt is None else tt
    da.check(f"{what} tt", tt, blk_shape(M, K), np.uint8, align=16)
    return tt


def blk_operand(rt, x16, tt=None, per_token: bool = False) -> BlkTokens:
    """x f16 [M, K] -> BlkTokens (into tt, uint8 [KB, Mp/128, BLK_OP], if given); per_token:
    one scale per token (blk_operand_f16_tok)."""
    M, K = _check_f16("blk_operand", x16)
    tt = _token_out(rt, "blk_operand", M, K, tt)
    _launch_operand(rt, x16, M, K, tt, 1.0, per_token)
    return BlkTokens(tt, M, K, per_token)


NORM_MAX_K = 8 * 4 * 256  # rmsnorm_blk_operand: 8 warps x NORM_CH (4) chunks of 256


def blk_operand_rmsnorm(
    rt, x, w, eps: float, tt=None, h16=None, per_token: bool = False, t=None
) -> BlkTokens:
    """The token operand of h = f16(rmsnorm(x) * w) in one launch (rmsnorm_blk_operand, a CTA
    per token): bit-identical to layers.rmsnorm into f16, then blk_operand. x f32 [M, K] (K % 8
    == 0, K <= NORM_MAX_K), w f32 [K]; h16 f16 [M, K], when given, receives h too (the input of
    GEMMs on other routes); into tt (uint8 [KB, Mp/128, BLK_OP]) if given; per_token: one
    scale per token (as blk_operand's). A family without pre-norms (olmo2): w None, h = f16(x)
    (layers.to_f16's bits); t f32 [M, K] (a post-norm's input), x += rmsnorm(t) * w first, in
    place (gemma_layers.rmsnorm_add's bits), h = f16(x)."""
    what = "blk_operand_rmsnorm"
    da.check(f"{what} x", x, (None, None), np.float32, align=16, require_contiguous=True)
    M, K = x.shape
    if M <= 0 or K % 8 or K > NORM_MAX_K:
        raise GPUError(
            f"{what}: need M >= 1 and K a multiple of 8 up to {NORM_MAX_K} (8 warps "
            f"x 4 chunks of 256), got [{M}, {K}]; use layers.rmsnorm, then blk_operand"
        )
    if w is not None:
        da.check(f"{what} w", w, (K,), np.float32, align=16)
    if t is not None:
        if w is None:
            raise GPUError(f"{what}: t (a post-norm's input) needs its norm weight w")
        da.check(f"{what} t", t, (M, K), np.float32, align=16, require_contiguous=True)
    if h16 is not None:
        da.check(f"{what} h16", h16, (M, K), np.float16, align=16, require_contiguous=True)
    tt = _token_out(rt, what, M, K, tt)
    rt.launch(
        rt.function("mmq_blk", "rmsnorm_blk_operand", _OPTS),
        (pad128(M),),
        (256,),
        (
            da.arg(x),
            np.uintp(0) if w is None else da.arg(w),
            np.float32(eps),
            np.uintp(0) if h16 is None else da.arg(h16),
            da.arg(tt),
            np.int32(M),
            np.int32(K),
            np.int32(pad128(M)),
            np.int32(per_token),
            np.uintp(0) if t is None else da.arg(t),
        ),
    )
    return BlkTokens(tt, M, K, per_token)


def mmq_blk_linear(
    rt,
    x,
    w: BlkWeight,
    M: int,
    N: int,
    K: int,
    out,
    accumulate: bool = False,
    build_opts: tuple = (),
    stream_k: bool = True,
    sms: int | None = None,
    glu: bool | str = False,
    per_token: bool = False,
) -> None:
    """out f32 [M, N] (= or +=) blk(x) @ blk(W).T; x: BlkTokens (its per_token picks the
    mmq_blk_tok entries: C = and glu only) or f16 [M, K] (its operand made here, per_token
    as blk_operand's). glu (True or "silu", "gelu": quants.glu.glu_act): W's rows interleaved
    per 16 (quants.glu.glu_rows) and out f16 [M, N/2] = f16(act(gate) * up) from the epilogue.
    stream_k: split the ragged last waves' tiles by k (tuning variant no-stream-k); sms: at
    most this many SMs; build_opts: nvcc -D options (-DBLK_FOLD=1, -DBLK_GROUP=N,
    -DBLK_STAGES=N, -DBLK_GROUP_M=N: the tile order's group)."""
    if not isinstance(w, BlkWeight) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_blk_linear: weight must be a BlkWeight of [{N}, {K}]")
    try:
        act = glu_act(glu)
    except ValueError as e:
        raise GPUError(f"mmq_blk_linear: {e}") from None
    if act and (accumulate or N % 16):
        raise GPUError(
            f"mmq_blk_linear: the glu epilogue needs N % 16 == 0 and C =, got "
            f"N={N}{' +=' if accumulate else ''}"
        )
    if M <= 0:
        raise GPUError(f"mmq_blk_linear: need M >= 1, got M={M}")
    if M * N >= 2**31 or blk_bytes(M, K) >= 2**31 or blk_bytes(N, K) >= 2**31:
        raise GPUError(
            f"mmq_blk_linear: [{M}, {N}, {K}] is too large for the kernel's 32-bit offsets"
        )
    da.check(
        "mmq_blk_linear out", out, (M, N // 2) if act else (M, N), np.float16 if act else np.float32
    )
    if isinstance(x, BlkTokens):
        if (x.M, x.K) != (M, K):
            raise GPUError(f"mmq_blk_linear: a token operand of [{x.M}, {x.K}] for [{M}, {N}, {K}]")
    else:
        da.check("mmq_blk_linear x", x, (M, K), np.float16)
        x = blk_operand(rt, x, per_token=per_token)
    if x.per_token and accumulate:  # (no GEMM after a norm adds to C: no such entry)
        raise GPUError("mmq_blk_linear: a per-token operand has no C += entry")
    tt = x.tt
    da.check("mmq_blk_linear tt", tt, blk_shape(M, K), np.uint8, align=16)
    tiles = -(-M // BM) * -(-N // BN)
    entry = ("mmq_blk_tok" if x.per_token else "mmq_blk") + (
        "_acc" if accumulate else {"silu": "_swiglu", "gelu": "_geglu"}.get(act, "")
    )
    smem = blk_smem(build_define(build_opts, "BLK_STAGES", 6))
    launch_persistent(
        rt,
        entry,
        "mmq_blk",
        smem,
        tiles,
        kblocks(K),
        (da.arg(tt), da.arg(w.wb), da.arg(out), np.int32(M), np.int32(N), np.int32(K)),
        build_opts,
        stream_k,
        sms,
        block=384,
    )


__all__ = [
    "BlkTokens",
    "BlkWeight",
    "blk_operand",
    "blk_operand_rmsnorm",
    "blk_smem",
    "blk_weight",
    "mmq_blk_linear",
]
