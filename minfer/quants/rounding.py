"""ggml's float rounding primitives in numpy, shared by the quantizers (quantize, quantize_k)."""

from __future__ import annotations

import numpy as np

F32 = np.float32
_MAGIC = F32(12582912.0)  # 1.5 * 2^23


def nearest_int(f: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: int32 of (f + 1.5*2^23) bit pattern; round-half-even for |f| < 2^22."""
    f = np.asarray(f, dtype=F32)
    bits = (f + _MAGIC).view(np.int32)
    return (bits & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def seqsum_loop(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in order a[0] + a[1] + ... (float32, one rounding per add), like a C loop."""
    s = a[0].copy()
    for k in range(1, a.shape[0]):
        s += a[k]
    return s


def seqsum(a: np.ndarray) -> np.ndarray:
    """seqsum_loop in one call where numpy guarantees the same order.

    numpy reduces axis 0 of a C-contiguous [n, m >= 2] array row after row (the inner loop runs
    over m); only a reduction along the contiguous axis is pairwise (m == 1 here). The test suite
    checks this against seqsum_loop, so a numpy that changes it fails loudly, never silently.
    """
    if a.ndim == 2 and a.shape[1] >= 2 and a.flags.c_contiguous:
        return np.add.reduce(a, axis=0)
    return seqsum_loop(a)


def fp16_bytes(v: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 (round to nearest even) -> [..., 2] little-endian bytes."""
    return (
        np.ascontiguousarray(np.asarray(v, dtype=F32).astype(np.float16))
        .view(np.uint8)
        .reshape(*np.shape(v), 2)
    )


def fp16_round(v: np.ndarray) -> np.ndarray:
    """GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))."""
    return np.asarray(v, dtype=F32).astype(np.float16).astype(F32)
