"""The row order of a gate|up weight whose GEMM writes the swiglu from its epilogue (the f16
GEMM's glu mode and the blk kernel's): per 16 rows, 8 gate rows then their 8 up rows, so a
thread's C values (rows r and r + 8) hold one feature's gate and up values."""

from __future__ import annotations

import numpy as np


def glu_rows(F: int) -> np.ndarray:
    """-> int64 [2F]: interleaved row i = plain row [gate; up][perm[i]]. F % 8 == 0."""
    if F % 8:
        raise ValueError(f"glu_rows: F={F} is not a multiple of 8")
    i = np.arange(2 * F)
    blk, j = i // 16, i % 16
    return np.where(j < 8, 8 * blk + j, F + 8 * blk + j - 8)
