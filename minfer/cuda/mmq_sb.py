"""Launchers for the super-block MMQ path (kernels/mmq_sb_q4k.cu, mmq_sb_q6k.cu, repack_q4k_sb /
repack_q6k_sb in mmq_repack.cu, the q8s split entries of quantize_q8_1.cu).

    y[M, N] (f32) = q8s(x)[M, K] @ W[N, K].T, W q4_K / q6_K, with the activations quantized per 256
    values (one scale per token and super-block) instead of q8_1's 32: the numpy oracle is
    minfer.quants.mmq_sb_ref.mmq_sb_linear_ref, the bit-exact operand twins live there too.

Why: with one activation scale per super-block, the tensor core sums all 8 chunks of a q4_K
super-block in integers (two u8 weight planes carry the sub-scale: sc = 8a + b, P0 = a v,
P1 = b v), so the epilogue is 4 FFMA per C value per 256 k instead of 2 per 32 k. Weight:
2 bytes per value (the planes) plus 80 B of tables per 256, 2.3 B per value (more than the
f16 path's 2: the price of reading ready planes; making them in shared memory from the
nibbles measured slower, docs/perf.md).
Block tile 128 tokens x 128 weight rows, 2 warpgroups of 64 x 128, stages of 128 k in a
3-slot ring, persistent with stream-K over super-blocks (minfer.cuda.stream_k). sm_90 only.

q6_K (kernels/mmq_sb_q6k.cu): the int8 sub-scale sc goes into three s8 planes a_i (q - 32),
sc = a0 + 7 a1 + 49 a2 (balanced base-7 digits), the activations as signed q8s bytes; no bias,
no min term. 3 bytes per value plus 16 B per 256. Tiles 128 tokens x 64 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.mmq import launch_prepass
from minfer.cuda.mmq_wgmma import check_raw, launch_persistent, zeroed
from minfer.errors import GPUError
from minfer.quants.mmq_sb1_ref import SB1_TBLK, SB1_WBLK
from minfer.quants.mmq_wgmma_ref import pad_rows

Q4_K, Q6_K = 12, 14
SB_BM, SB_BN, SB_BK, SB_STAGES = 128, 128, 128, 3
SB6_BN = 64   # q6_K tiles: 128 tokens x 64 rows (three m64n64 accumulators per warpgroup)


def sb_smem(stages: int = SB_STAGES) -> int:
    """Dynamic smem of mmq_sb_q4k (SbSmem<STAGES>::BYTES): per stage A 128 x 128 B, the planes
    2 x 128 x 128 B, Ta 4 x 128 x 8 B, Ts 128 x 16 B, a Tm block of 8 x 128 x 8 B (filled on
    a super-block's second stage); + 1 KB alignment."""
    return stages * (SB_BM * SB_BK + 2 * SB_BN * SB_BK + 4 * SB_BM * 8 + SB_BN * 16
                     + 8 * SB_BN * 8) + 1024


def sb6_smem() -> int:
    """Dynamic smem of mmq_sb_q6k (Sb6Smem::BYTES): 3 slots of A 128 x 128 B, the planes
    3 x 64 x 128 B, da 128 x 8 B, Ts 64 x 16 B; + 1 KB alignment."""
    return 3 * (SB_BM * SB_BK + 3 * SB6_BN * SB_BK + SB_BM * 8 + SB6_BN * 16) + 1024


def sb1_smem() -> int:
    """Dynamic smem of mmq_sb1_q4k (Sb1Smem::BYTES): 4 slots of 51 KB (the weight and token
    tiles 128 x 128 B each, the stage's parts of the two table blocks); + 1 KB alignment and
    8 mbarriers."""
    return 4 * 51 * 1024 + 1024 + 64


def sb_table_bytes(N: int, K: int) -> int:
    """Ts (16 B per row and super-block) then Tm (8 B per row and chunk), rows padded."""
    return pad_rows(N) * (K // 256 * 16 + K // 32 * 8)


def sb_weight_bytes(N: int, K: int, qtype: int = Q4_K) -> int:
    """Device bytes of an SbQ4K / SbQ6K [N, K]: the planes and the tables."""
    if int(qtype) == Q6_K:
        return 3 * N * K + pad_rows(N) * (K // 256) * 16
    return 2 * N * K + sb_table_bytes(N, K)


@dataclass
class SbQ4K:
    """A q4_K weight [N, K] in the SB layout: planes wp uint8 [2, N, K], tables tw uint8."""
    wp: object
    tw: object
    N: int
    K: int
    qtype = Q4_K

    @property
    def nbytes(self) -> int:
        return int(self.wp.nbytes + self.tw.nbytes)

    def free(self) -> None:
        for a in (self.wp, self.tw):
            a.gpudata.free()


@dataclass
class SbQ4K1:
    """A q4_K weight [N, K] in mmq_sb1_q4k's one-plane layout: wq uint8 [N, K] (the nibbles),
    tw uint8 [K/256, Np/128, SB1_WBLK] (chunk factors, bias, min-term operand per super-block
    and 128-row tile)."""
    wq: object
    tw: object
    N: int
    K: int
    qtype = Q4_K

    @property
    def nbytes(self) -> int:
        return int(self.wq.nbytes + self.tw.nbytes)

    def free(self) -> None:
        for a in (self.wq, self.tw):
            a.gpudata.free()


@dataclass
class SbQ6K:
    """A q6_K weight [N, K] in the SB layout: planes wp uint8 [3, N, K] (int8 values), tables
    ts float32 [K/256, Np, 4]."""
    wp: object
    ts: object
    N: int
    K: int
    qtype = Q6_K

    @property
    def nbytes(self) -> int:
        return int(self.wp.nbytes + self.ts.nbytes)

    def free(self) -> None:
        for a in (self.wp, self.ts):
            a.gpudata.free()


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
    """raw q4_K device bytes [N, K/256*144] (any shape, 16-byte aligned) -> SbQ4K."""
    check_raw("repack_q4k_sb", w_raw, N, K, 144, 16)
    r = SbQ4K(da.empty(rt, (2, N, K), np.uint8, f"sb planes {what}"),
              zeroed(rt, (sb_table_bytes(N, K),), np.uint8, f"sb tables {what}"), N, K)
    fn = rt.function("mmq_repack", "repack_q4k_sb")
    n = N * (K // 256)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wp), da.arg(r.tw),
                                               np.int32(N), np.int32(K), np.int32(pad_rows(N))))
    return r


def repack_q4k_sb1(rt, w_raw, N: int, K: int, what: str = "weight") -> SbQ4K1:
    """raw q4_K device bytes [N, K/256*144] (16-byte aligned) -> SbQ4K1."""
    check_raw("repack_q4k_sb1", w_raw, N, K, 144, 16)
    r = SbQ4K1(da.empty(rt, (N, K), np.uint8, f"sb1 nibbles {what}"),
               zeroed(rt, (K // 256, pad_rows(N) // 128, SB1_WBLK), np.uint8,
                      f"sb1 tables {what}"), N, K)
    fn = rt.function("mmq_repack", "repack_q4k_sb1")
    n = N * (K // 256)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wq), da.arg(r.tw),
                                               np.int32(N), np.int32(K), np.int32(pad_rows(N))))
    return r


def sb1_tokens(rt, ta, K: int, tt=None):
    """Ta f32 [K/32, Mp, 2] (a q8s split) -> Tt uint8 [K/256, Mp/128, SB1_TBLK], the per-token
    tables of mmq_sb1_q4k (into tt if given)."""
    Mp = ta.shape[1]
    t_shape = (K // 256, Mp // 128, SB1_TBLK)
    tt = da.empty(rt, t_shape, np.uint8, "sb1 token tables") if tt is None else tt
    da.check("sb1_tokens tt", tt, t_shape, np.uint8, align=16)
    n = (K // 256) * Mp
    rt.launch(rt.function("quantize_q8_1", "sb1_token_tables"), ((n + 255) // 256,), (256,),
              (da.arg(ta), da.arg(tt), np.int32(K), np.int32(Mp)))
    return tt


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
                  build_opts: tuple = (), stream_k: bool = True, sms: int | None = None) -> None:
    """out f32 [M, N] (= or +=) q8s(x) @ W.T. x f32 / f16 [M, K] (split here) or its split
    (aq, ta). stream_k / sms / build_opts as in mmq_wgmma.mmq_wgmma_linear."""
    if not isinstance(w, (SbQ4K, SbQ4K1, SbQ6K)) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_sb_linear: weight must be an SbQ4K / SbQ4K1 / SbQ6K of [{N}, {K}]")
    q6 = isinstance(w, SbQ6K)
    if M <= 0 or K % 256:
        raise GPUError(f"mmq_sb_linear: need M >= 1 and K % 256 == 0, got M={M} K={K}")
    if M * K >= 2**31 or 2 * N * K >= 2**31 or M * N >= 2**31:
        raise GPUError("mmq_sb_linear: problem too large (32-bit offsets)")
    if isinstance(x, tuple):
        aq, ta = x[:2]
        da.check("mmq_sb_linear aq", aq, (M, K), np.uint8, align=16)
        da.check("mmq_sb_linear ta", ta, (K // 32, pad_rows(M), 2), np.float32, align=16)
    else:
        da.check("mmq_sb_linear x", x, (M, K), (np.float32, np.float16))
        aq, ta = split_q8s(rt, x, signed=q6)   # (a split passed in must match: q6_K signed)
    da.check("mmq_sb_linear out", out, (M, N), np.float32)
    if isinstance(w, SbQ4K1):   # + the per-token tables (passed as x[2], or made here)
        tt = x[2] if isinstance(x, tuple) and len(x) > 2 else sb1_tokens(rt, ta, K)
        tiles = -(-M // SB_BM) * -(-N // SB_BN)
        launch_persistent(rt, "mmq_sb1_q4k" + ("_acc" if accumulate else ""), "mmq_sb1_q4k",
                          sb1_smem(), tiles, K // 256,
                          (da.arg(aq), da.arg(tt), da.arg(w.wq), da.arg(w.tw), da.arg(out),
                           np.int32(M), np.int32(N), np.int32(K)), build_opts, stream_k, sms,
                          block=384)
        return
    bn, name, smem, tab = ((SB6_BN, "mmq_sb_q6k", sb6_smem(), w.ts) if q6 else
                           (SB_BN, "mmq_sb_q4k", sb_smem(), w.tw))
    ws = not q6 and "-DMMQ_SB_WS=1" in build_opts
    tiles = -(-M // SB_BM) * -(-N // bn)
    launch_persistent(rt, name + ("_ws" if ws else "") + ("_acc" if accumulate else ""), name,
                      smem + (64 if ws else 0), tiles, K // 256,
                      (da.arg(aq), da.arg(ta), da.arg(w.wp), da.arg(tab), da.arg(out), np.int32(M),
                       np.int32(N), np.int32(K)), build_opts, stream_k, sms,
                      block=384 if ws else 256)


__all__ = ["SbQ4K", "SbQ4K1", "SbQ6K", "repack_sb", "repack_q4k_sb", "repack_q4k_sb1",
           "sb1_smem", "sb1_tokens", "sb6_smem", "split_q8s", "mmq_sb_linear", "sb_smem", "sb_table_bytes",
           "sb_weight_bytes"]
