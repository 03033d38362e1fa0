"""numpy twin of the MMQ kernels: q4_K / q6_K weights x q8_1 activations, the kernels' math.

y[M, N] = x[M, K] @ W[N, K].T with x quantized to q8_1 raw blocks (minfer.quants.q8_1) and W
kept as raw GGUF blocks. Per 32-value k-chunk c the kernels form integer dot products on the
tensor cores and rescale them in f32 (docs/mmq.md):

q4_K (weight = d*sc*v - dmin*m, v in 0..15 fed unsigned to the s8 mma):
    S_ij  = sum_k qa[i,k] * v[j,k]                      (int, |S| <= 32*127*15)
    y_ij += da_i * (dsv_j * S_ij) + dma_i * dmv_j       dsv = d*sc, dmv = -(dmin*m),
                                                        dma = da*sa (rank-1 fold, docs/design.md)
q6_K (weight = d*sc16*(q-32), one int8 scale per 16 values, q fed as signed q-32 in -32..31):
    S^h_ij = sum_{k in half h} qa[i,k] * (q[j,k]-32)    h = 0, 1 (two m16n8k16 mmas)
    y_ij  += da_i * (dsv^0_j * S^0_ij + dsv^1_j * S^1_ij)   dsv^h = d*sc16[2c+h]
    (Fed unsigned, half h would need the correction -32*da*dsv^h*s^h with s^h the A sum over
    that 16-half; q8_1 carries only the 32-sum s, so the kernels feed q-32 signed and the
    correction term vanishes.)
dsv, dmv and d*(sc0+sc1) are exact in f32 (f16 d times a <= 8-bit integer), which the kernels'
f32 epilogue relies on. `dtype` sets the accumulation precision here (float64 by default: the
oracle the kernels are gated against at rel err <= 1e-3).
"""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput
from minfer.quants.q8_1 import dequantize_q8_1_raw, quantize_q8_1_raw, unpack_q8_1_raw

Q4_K, Q6_K = 12, 14  # gguf.GGMLQuantizationType values
QK_K = 256
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}


def _check(w_raw: np.ndarray, qtype: int, N: int, K: int) -> np.ndarray:
    if qtype not in BLOCK_BYTES:
        raise BadInput(f"mmq: no MMQ math for tensor type {qtype} (q4_K=12, q6_K=14 only)")
    if K % QK_K:
        raise BadInput(f"mmq: K={K} is not a multiple of {QK_K}")
    w = np.ascontiguousarray(w_raw, dtype=np.uint8)
    if w.shape != (N, K // QK_K * BLOCK_BYTES[qtype]):
        raise BadInput(
            f"mmq: weight bytes shape {w.shape}, expected ({N}, {K // QK_K * BLOCK_BYTES[qtype]})"
        )
    return w


def q4k_scales(w_raw: np.ndarray, N: int, K: int):
    """-> d, dmin f32 [N, K/256] and the 6-bit sc, m uint8 [N, K/256, 8] of raw q4_K rows."""
    w = _check(w_raw, Q4_K, N, K).reshape(N, K // QK_K, 144)
    d = w[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, KB]
    dmin = w[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    s = w[..., 4:16].astype(np.uint8)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=-1)  # get_scale_min_k4
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return d, dmin, sc, m


def q6k_scales(w_raw: np.ndarray, N: int, K: int):
    """-> d f32 [N, K/256] and the int8 sc [N, K/256, 16] of raw q6_K rows."""
    w = _check(w_raw, Q6_K, N, K).reshape(N, K // QK_K, 210)
    return w[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32), w[..., 192:208].view(
        np.int8
    )


def decode_q4k(w_raw: np.ndarray, N: int, K: int):
    """-> dsv f32 [N, K/32], dmv f32 [N, K/32], v uint8 [N, K] (nibbles in natural k order)."""
    w = _check(w_raw, Q4_K, N, K).reshape(N, K // QK_K, 144)
    d, dmin, sc, m = q4k_scales(w_raw, N, K)
    dsv = (d[..., None] * sc.astype(np.float32)).reshape(N, K // 32)
    dmv = -(dmin[..., None] * m.astype(np.float32)).reshape(N, K // 32)
    qs = w[..., 16:].reshape(N, K // QK_K, 4, 1, 32)
    v = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0xF  # [N,KB,4,2,32]
    return dsv, dmv, v.reshape(N, K)


def decode_q6k(w_raw: np.ndarray, N: int, K: int):
    """-> dsv16 f32 [N, K/16] (= d*sc), qm int8 [N, K] (= q - 32, natural k order)."""
    w = _check(w_raw, Q6_K, N, K).reshape(N, K // QK_K, 210)
    ql = w[..., 0:128].reshape(N, -1, 2, 1, 64)
    qh = w[..., 128:192].reshape(N, -1, 2, 1, 32)
    d, sc = q6k_scales(w_raw, N, K)  # [N, KB], [N, KB, 16]
    sc = sc.astype(np.float32)
    lo = ((ql >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0xF).reshape(N, -1, 2, 4, 32)
    hb = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 3).reshape(
        N, -1, 2, 4, 32
    )
    qm = ((lo | (hb << 4)).astype(np.int16) - 32).astype(np.int8).reshape(N, K)
    dsv16 = (d[..., None] * sc).reshape(N, K // 16)
    return dsv16, qm


def _as_q8(x: np.ndarray, M: int, K: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x
    if x.shape != (M, K):
        raise BadInput(f"mmq: activations shape {x.shape}, expected ({M}, {K})")
    return quantize_q8_1_raw(x.astype(np.float32))


def mmq_linear_ref(
    x: np.ndarray,
    w_raw: np.ndarray,
    qtype: int,
    M: int,
    N: int,
    K: int,
    out: np.ndarray | None = None,
    accumulate: bool = False,
    dtype=np.float64,
) -> np.ndarray:
    """Twin of minfer.cuda.paths.q8_1.launch.mmq_linear: x f32 [M, K] or q8_1 raw uint8 [M, K/32*40],
    w_raw uint8 [N, K/256*bytes]; returns f32 [M, N] (added to `out` when accumulate)."""
    a = _as_q8(x, M, K)
    da, qa, sa = unpack_q8_1_raw(a, K)
    if qa.shape[0] != M:
        raise BadInput(f"mmq: activations have {qa.shape[0]} rows, expected {M}")
    y = np.zeros((M, N), dtype=dtype)
    qa = qa.astype(dtype)
    if int(qtype) == Q4_K:
        dsv, dmv, v = decode_q4k(w_raw, N, K)
        v = v.astype(dtype)
        dma = da * sa.astype(np.float32)  # f32, like the kernels
        for c in range(K // 32):
            ks = slice(32 * c, 32 * c + 32)
            S = qa[:, ks] @ v[:, ks].T  # exact integers
            y += da[:, c, None].astype(dtype) * (dsv[None, :, c].astype(dtype) * S)
            y += dma[:, c, None].astype(dtype) * dmv[None, :, c].astype(dtype)
    elif int(qtype) == Q6_K:
        dsv16, qm = decode_q6k(w_raw, N, K)
        qm = qm.astype(dtype)
        for c in range(K // 32):
            acc = np.zeros((M, N), dtype=dtype)
            for h in range(2):
                ks = slice(32 * c + 16 * h, 32 * c + 16 * h + 16)
                acc += dsv16[None, :, 2 * c + h].astype(dtype) * (qa[:, ks] @ qm[:, ks].T)
            y += da[:, c, None].astype(dtype) * acc
    else:
        _check(w_raw, qtype, N, K)
    y = y.astype(np.float32)
    if accumulate:
        if out is None or out.shape != (M, N):
            raise BadInput("mmq: accumulate needs out f32 [M, N]")
        out += y
        return out
    if out is not None:
        out[...] = y
        return out
    return y


class Q8_1Grid:
    """The q8_1 paths' grid on the CPU reference (ReferenceBackend(grids=...)): the activation
    entering the weight rounded through minfer's q8_1 raw block (quantize_q8_1_raw, then
    dequantized), exactly the operand the MMQ kernels see; the weight is exact (its raw GGUF
    bytes are what the kernels read)."""

    name = "q8_1"

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return w

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        return dequantize_q8_1_raw(quantize_q8_1_raw(x.astype(np.float32)), x.shape[-1])
