"""Launchers of kernels/blk_split.cu (numpy twins: outliers.blk_split_cols_ref, col_sumsq_ref):
the column gather / zeroing that splits ffn_down's operands for blk-split, and the column sums
of squares its calibration takes on the GPU. Any sm_80+ GPU (plain loads and stores)."""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

KERNEL = "blk_split"  # kernels/blk_split.cu


def _rows(what: str, A) -> tuple[int, int, int]:
    """(M, K, row stride in elements) of an f16 [M, K] device array whose rows may be a view
    of wider ones."""
    da.check(what, A, (None, None), np.float16)
    M, K = (int(s) for s in A.shape)
    ld = int(A.strides[0]) // 2 if M > 1 else K
    if M <= 0 or K <= 0 or ld < K or int(A.strides[1]) != 2:
        raise GPUError(f"{what}: need rows >= 1 of unit-stride f16, got {A.shape} {A.strides}")
    return M, K, ld


def blk_split_cols(rt, A, cols, out) -> None:
    """out f16 [M, n] = A[:, cols], then A[:, cols] = 0 (A f16 [M, K], cols int32 [n] on the
    device: distinct, ascending, < K; outliers.check_cols checks them where they are made)."""
    M, K, ld = _rows("blk_split_cols A", A)
    da.check("blk_split_cols cols", cols, (None,), np.int32)
    n = int(cols.shape[0])
    if not 0 < n <= K:
        raise GPUError(f"blk_split_cols: need 1 <= n <= K={K} columns, got {n}")
    da.check("blk_split_cols out", out, (M, n), np.float16, require_contiguous=True)
    if M * n >= 2**31:
        raise GPUError(f"blk_split_cols: [{M}, {n}] is too large for one launch")
    rt.launch(
        rt.function(KERNEL, "blk_split_cols"),
        ((M * n + 255) // 256,),
        (256,),
        (da.arg(A), np.int64(ld), np.int32(M), da.arg(cols), np.int32(n), da.arg(out)),
    )


def col_sumsq_f16(rt, A, acc) -> None:
    """acc f32 [K] += the column sums of squares of A f16 [M, K] (f32, rows in order)."""
    M, K, ld = _rows("col_sumsq_f16 A", A)
    da.check("col_sumsq_f16 acc", acc, (K,), np.float32)
    rt.launch(
        rt.function(KERNEL, "col_sumsq_f16"),
        ((K + 255) // 256,),
        (256,),
        (da.arg(A), np.int64(ld), np.int32(M), np.int32(K), da.arg(acc)),
    )


__all__ = ["KERNEL", "blk_split_cols", "col_sumsq_f16"]
