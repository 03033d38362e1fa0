"""Launchers for the raw int8 MMQ kernels (kernels/mmq_q4k.cu, mmq_q6k.cu, quantize_q8_1.cu).

    y[M, N] (f32) = x[M, K] @ W[N, K].T,  x quantized to q8_1 raw blocks by the prepass,
                                          W raw q4_K / q6_K GGUF bytes [N, K/256*bytes]
Kernel families (the seeds' exact q8_1 paths, docs/design.md): R1 word-level, narrow raw, wide raw
with KD = 4 or 8 super-blocks staged per pass. Which one runs is the chooser's answer
(minfer.cuda.paths: its smem guard included, a wide path over the device's opt-in shared
memory becomes narrow there); this launcher refuses a wide kernel over the cap rather than
choosing another. numpy twin: minfer.cuda.paths.q8_1.twin.mmq_linear_ref.
Device arrays are pycuda GPUArrays (minfer.cuda.runtime.devarray); nothing here reads the
environment.
"""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError, Unsupported

Q4_K, Q6_K = 12, 14
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}
_FILES = {Q4_K: "mmq_q4k", Q6_K: "mmq_q6k"}
_ENTRY = {  # (qtype, kind) -> entry
    (Q4_K, "r1"): "mmq_nt_kernel",
    (Q4_K, "narrow"): "mmq_raw_nt_kernel",
    (Q4_K, "wide"): "mmq_raw_wide_nt_kernel",
    (Q6_K, "r1"): "mmq_q6k_nt_kernel",
    (Q6_K, "narrow"): "mmq_q6k_raw_nt_kernel",
    (Q6_K, "wide"): "mmq_q6k_raw_wide_nt_kernel",
}
FAMILIES = ("r1", "narrow", "wide")  # the kernel families (entries per type: _ENTRY)
NARROW_TILE = (32, 64)  # (tokens, weight rows) per block, 128 threads
WIDE_TILE = (64, 128)


def wide_smem(kd: int, qtype: int = Q4_K) -> int:
    """Dynamic smem of the wide kernel, mirroring the kernels' static_asserts: q4_K
    (WideAsyncSmem<KD>: two cp.async stages of A and B, kd/4 super-blocks each, f32 (da, dma),
    per-warp scale tables); q6_K (WideSyncSmem<KD>: kd super-blocks of A, (d, s) pairs, scales)."""
    if int(qtype) == Q4_K:
        sb = kd // 4
        return 2 * 64 * (sb * 320 + 16) + 2 * 128 * (160 if sb == 1 else 288) + sb * 16384
    return 64 * (kd * 256 + 16) + kd * 8 * 32 * 8 + 4 * 8 * 32 * 8


def has_mmq(qtype: int) -> bool:
    return int(qtype) in BLOCK_BYTES


def quantize_q8_1(rt, x, out=None):
    """x f32 or f16 [M, K] (K % 32 == 0) -> q8_1 raw uint8 [M, K/32*40] (out if given)."""
    da.check("quantize_q8_1 x", x, (None, None), (np.float32, np.float16))
    M, K = x.shape
    if K % 32:
        raise GPUError(f"quantize_q8_1: K={K} is not a multiple of 32")
    if out is None:
        out = da.empty(rt, (M, K // 32 * 40), np.uint8, "q8_1 activations")
    da.check("quantize_q8_1 out", out, (M, K // 32 * 40), np.uint8, align=8)
    launch_prepass(rt, "quantize_q8_1_raw", x, (da.arg(out), np.int32(M), np.int32(K)))
    return out


def launch_prepass(rt, entry: str, x, args: tuple) -> None:
    """One launch of a quantize_q8_1.cu entry on x f32 / f16 [M, K] (the `_f16` entry for f16):
    vector loads of 4 values per lane (8 lanes per q8_1 block, 32 blocks per 256-thread CTA),
    so x must be 16-byte (f32) / 8-byte (f16) aligned."""
    M, K = x.shape
    need = 16 if x.dtype == np.float32 else 8
    if da.ptr(x) % need:
        raise GPUError(f"{entry}: activations at a {need}-byte unaligned address")
    fn = rt.function("quantize_q8_1", entry if x.dtype == np.float32 else entry + "_f16")
    launch_prepass_fn(rt, fn, M, K, (da.arg(x), *args))


def launch_prepass_fn(rt, fn, M: int, K: int, args: tuple) -> None:
    """The geometry of every quantize_q8_1.cu entry over [M, K]: 8 lanes per 32-value block,
    32 blocks per 256-thread CTA."""
    nblk = M * (K // 32)
    rt.launch(fn, ((nblk + 31) // 32,), (256,), args)


def mmq_linear(
    rt,
    x,
    w_raw,
    qtype: int,
    M: int,
    N: int,
    K: int,
    family: str,
    kd: int,
    out,
    accumulate: bool = False,
    q8_scratch=None,
    build_opts: tuple = (),
) -> None:
    """out f32 [M, N] (= or +=) x @ W.T on the kernel `family` (r1, narrow, or wide at KD =
    kd 4 or 8: the q8_1 paths of minfer.cuda.paths.q8_1). x: f32/f16 [M, K] (quantized here,
    into q8_scratch when given) or q8_1 raw uint8 [M, K/32*40]; w_raw: uint8 raw blocks (any
    shape, N*K/256*bytes in all). build_opts: extra nvcc -D options for the wide kernel (kernel
    A/B runs; the engine never passes any)."""
    if family not in FAMILIES or (family == "wide") != (kd in (4, 8)):
        raise GPUError(
            f"mmq_linear: kernel family {family!r} at KD {kd}: expected r1, narrow "
            "or wide at KD 4 / 8"
        )
    kind, name_ = family, family + (f" KD={kd}" if kd else "")
    qtype = int(qtype)
    if not has_mmq(qtype):
        raise Unsupported(
            f"mmq_linear: no MMQ kernel for tensor type {qtype} "
            "(q4_K and q6_K only; choose_path routes others to f16)"
        )
    if K % 256 or K <= 0 or M <= 0 or N <= 0:
        raise GPUError(f"mmq_linear: need M, N >= 1 and K a multiple of 256, got M={M} N={N} K={K}")
    if M * (K // 32) * 40 >= 2**31 or N * (K // 256) * BLOCK_BYTES[qtype] >= 2**40:
        raise GPUError("mmq_linear: problem too large")
    if x.dtype == np.uint8:
        da.check("mmq_linear x (q8_1)", x, (M, K // 32 * 40), np.uint8, align=8)
        a = x
    else:
        da.check("mmq_linear x", x, (M, K), (np.float32, np.float16))
        a = quantize_q8_1(rt, x, q8_scratch)
    wbytes = N * (K // 256) * BLOCK_BYTES[qtype]
    if not hasattr(w_raw, "gpudata") or w_raw.dtype != np.uint8 or w_raw.nbytes != wbytes:
        raise GPUError(
            f"mmq_linear: weight must be uint8 device bytes, {wbytes} B for "
            f"[{N}, {K}] of type {qtype}"
        )
    if da.ptr(w_raw) % 16:
        raise GPUError("mmq_linear: weight bytes not 16-byte aligned")
    da.check("mmq_linear out", out, (M, N), np.float32)
    name = _FILES[qtype]
    entry = _ENTRY[(qtype, kind)]
    # da.arg: row views carry a plain int pointer, which pycuda does not take as an argument
    args = (
        da.arg(a),
        da.arg(w_raw),
        da.arg(out),
        np.int32(M),
        np.int32(N),
        np.int32(K),
        np.int32(1 if accumulate else 0),
    )
    if kind == "wide":
        smem = wide_smem(kd, qtype)
        if smem > rt.smem_optin:  # choose_path's guard runs the narrow kernel instead
            raise GPUError(
                f"mmq_linear: {name_} needs {smem} B of shared memory, over this "
                f"GPU's opt-in cap of {rt.smem_optin} B (choose_path picks narrow)"
            )
        fn = rt.function(name, entry, (f"-DMMQ_KD={kd}", *build_opts), dyn_smem=smem)
        bm, bn = WIDE_TILE
        threads = 256 if qtype == Q4_K else 128  # q4_K: 8 warps of 32 x 32; q6_K: 4 of 64 x 32
        rt.launch(fn, ((N + bn - 1) // bn, (M + bm - 1) // bm), (threads,), args, smem)
    else:
        fn = rt.function(name, entry)
        bm, bn = NARROW_TILE
        rt.launch(fn, ((N + bn - 1) // bn, (M + bm - 1) // bm), (128,), args)
