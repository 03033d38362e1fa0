"""Launchers for the Hopper wgmma MMQ path (kernels/mmq_wgmma_q4k.cu, mmq_repack.cu and the
split entries of quantize_q8_1.cu).

    y[M, N] (f32) = x[M, K] @ W[N, K].T, W q4_K: the math of minfer.cuda.mmq (its numpy twin
    minfer.quants.mmq_ref.mmq_linear_ref is this path's parity oracle too)

The operands live in layouts a wgmma reads from shared memory (minfer.quants.mmq_wgmma_ref
has the bit-exact twins): `repack_q4k` turns a raw q4_K weight into a `WgmmaQ4K` once, at load
(1 byte per weight plus 16 B of tables per 32 weights: 1.5 B/weight against q4_K's 0.5625);
`split_q8_1` is the per-GEMM activation prepass. Geometry is owned here: block tile 128 tokens
x 128 weight rows (2 warpgroups of 128 x 64, 1 block per SM), stages of 128 k, `WG_STAGES` deep;
mirrored by the kernel's static_asserts (tests/test_mmq_wgmma.py).
sm_90 only (wgmma); minfer.cuda.mmq.pick_variant decides when this path runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda import devarray as da
from minfer.errors import GPUError
from minfer.quants.mmq_wgmma_ref import TPAD, pad_rows

WG_BN, WG_STAGES, WG_BM, WG_BK = 128, 3, 128, 128
WG_PERSIST = True    # the kernel's MMQ_WG_PERSIST default (its tile loop, one block per SM)
_OPTS = ("-arch=sm_90a",)   # last -arch wins in nvcc: wgmma needs the sm_90a target


def wgmma_smem(bn: int = WG_BN, stages: int = WG_STAGES) -> int:
    """Dynamic smem of mmq_wgmma_q4k (WgSmem<BN, STAGES>::BYTES): per stage A 128 x 128 B,
    B bn x 128 B, the token table 4 x 128 x 8 B and two weight tables 4 x bn x 8 B; + 1 KB
    for the manual 1024-byte alignment of the swizzled tiles."""
    return stages * (WG_BM * WG_BK + bn * WG_BK + 4 * WG_BM * 8 + 2 * 4 * bn * 8) + 1024


@dataclass
class WgmmaQ4K:
    """A q4_K weight [N, K] in the wgmma layout (device arrays)."""
    wq: object     # uint8 [N, K]
    tw: object     # uint32 [2, K/32, Np, 2]: the scale table Tb (f32 bits) and the min table Tm
    N: int
    K: int

    @property
    def nbytes(self) -> int:
        return int(self.wq.nbytes + self.tw.nbytes)

    def free(self) -> None:
        for a in (self.wq, self.tw):
            a.gpudata.free()


def wgmma_weight_bytes(N: int, K: int) -> int:
    """Device bytes of a repacked [N, K] q4_K weight (WgmmaQ4K.nbytes)."""
    return N * K + 2 * (K // 32) * pad_rows(N) * 8


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


def _zeroed(rt, shape, dtype, what):
    a = da.empty(rt, shape, dtype, what)
    if a.size:
        rt.drv.memset_d8(da.ptr(a), 0, int(a.nbytes))
    return a


def repack_q4k(rt, w_raw, N: int, K: int, what: str = "weight") -> WgmmaQ4K:
    """raw q4_K device bytes [N, K/256*144] (any shape, 16-byte aligned) -> WgmmaQ4K."""
    if K % 256 or K <= 0 or N <= 0:
        raise GPUError(f"repack_q4k: need N >= 1 and K a multiple of 256, got N={N} K={K}")
    nbytes = N * (K // 256) * 144
    if not hasattr(w_raw, "gpudata") or w_raw.dtype != np.uint8 or w_raw.nbytes != nbytes:
        raise GPUError(f"repack_q4k: weight must be uint8 device bytes, {nbytes} B for [{N}, {K}]")
    if da.ptr(w_raw) % 16:
        raise GPUError("repack_q4k: weight bytes not 16-byte aligned")
    Np = pad_rows(N)
    if N * K >= 2**31:
        raise GPUError(f"repack_q4k: [{N}, {K}] is over the kernel's 2^31-byte buffers")
    r = WgmmaQ4K(da.empty(rt, (N, K), np.uint8, f"wgmma nibbles {what}"),
                 _zeroed(rt, (2, K // 32, Np, 2), np.uint32, f"wgmma tables {what}"), N, K)
    fn = rt.function("mmq_repack", "repack_q4k_wgmma")
    n = N * (K // 32)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(w_raw), da.arg(r.wq), da.arg(r.tw),
                                               np.int32(N), np.int32(K), np.int32(Np)))
    return r


def split_q8_1(rt, x, aq=None, ta=None):
    """x f32 / f16 [M, K] -> (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]) (into aq / ta if given;
    a fresh Ta is zeroed, so its padding rows are 0)."""
    da.check("split_q8_1 x", x, (None, None), (np.float32, np.float16), require_contiguous=True)
    M, K = x.shape
    if K % 32 or M <= 0:
        raise GPUError(f"split_q8_1: need M >= 1 and K a multiple of 32, got M={M} K={K}")
    Mp = pad_rows(M)
    if aq is None:
        aq = da.empty(rt, (M, K), np.uint8, "q8_1 activations (wgmma)")
    if ta is None:
        ta = _zeroed(rt, (K // 32, Mp, 2), np.float32, "q8_1 scales (wgmma)")
    da.check("split_q8_1 aq", aq, (M, K), np.uint8, align=16)
    da.check("split_q8_1 ta", ta, (K // 32, Mp, 2), np.float32, align=16)
    entry = "quantize_q8_1_split" if x.dtype == np.float32 else "quantize_q8_1_split_f16"
    fn = rt.function("quantize_q8_1", entry)
    nblk = M * (K // 32)
    rt.launch(fn, ((nblk + 7) // 8,), (256,), (da.arg(x), da.arg(aq), da.arg(ta), np.int32(M),
                                              np.int32(K), np.int32(Mp)))
    return aq, ta


def mmq_wgmma_linear(rt, x, w: WgmmaQ4K, M: int, N: int, K: int, out, accumulate: bool = False,
                     split=None, build_opts: tuple = ()) -> None:
    """out f32 [M, N] (= or +=) x @ W.T. x f32 / f16 [M, K] (split here, into `split` =
    (aq, ta) when given) or already-split (aq, ta) passed as x. build_opts: extra nvcc -D
    options (kernel A/B runs; the engine passes none)."""
    if not isinstance(w, WgmmaQ4K) or (w.N, w.K) != (N, K):
        raise GPUError(f"mmq_wgmma_linear: weight must be a WgmmaQ4K of [{N}, {K}]")
    if M <= 0 or K % WG_BK:
        raise GPUError(f"mmq_wgmma_linear: need M >= 1 and K % {WG_BK} == 0, got M={M} K={K}")
    if M * K >= 2**31 or M * N >= 2**31:
        raise GPUError("mmq_wgmma_linear: problem too large (32-bit offsets)")
    if isinstance(x, tuple):
        aq, ta = x
        da.check("mmq_wgmma_linear aq", aq, (M, K), np.uint8, align=16)
        da.check("mmq_wgmma_linear ta", ta, (K // 32, pad_rows(M), 2), np.float32, align=16)
    else:
        da.check("mmq_wgmma_linear x", x, (M, K), (np.float32, np.float16))
        aq, ta = split_q8_1(rt, x, *(split or (None, None)))
    da.check("mmq_wgmma_linear out", out, (M, N), np.float32)
    bn, stages, persist = WG_BN, WG_STAGES, WG_PERSIST
    for o in build_opts:   # kernel A/B builds (scripts/mmq_wgmma_device.py) change the geometry
        key, _, val = o.partition("=")
        if key == "-DMMQ_WG_STAGES":
            stages = int(val)
        elif key == "-DMMQ_WG_PERSIST":
            persist = bool(int(val))
    smem = wgmma_smem(bn, stages)
    if smem > rt.smem_optin:
        raise GPUError(f"mmq_wgmma_linear: {smem} B of shared memory needed, over this GPU's "
                       f"opt-in cap of {rt.smem_optin} B")
    fn = rt.function("mmq_wgmma_q4k", "mmq_wgmma_q4k", (*_OPTS, *build_opts), dyn_smem=smem)
    tiles = (M + WG_BM - 1) // WG_BM * ((N + bn - 1) // bn)
    grid = (min(tiles, rt.sm_count) if persist else tiles,)   # persistent: <= 1 block per SM
    rt.launch(fn, grid, (256,), (da.arg(aq), da.arg(ta), da.arg(w.wq), da.arg(w.tw),
                                 da.arg(out), np.int32(M), np.int32(N),
                                 np.int32(K), np.int32(1 if accumulate else 0)), smem)


__all__ = ["WgmmaQ4K", "repack_q4k", "split_q8_1", "mmq_wgmma_linear", "wgmma_smem",
           "wgmma_weight_bytes", "split_scratch_bytes", "split_views", "TPAD"]
