"""The glu epilogue's contract (the f16 GEMM's glu modes and the blk kernel's): the row order of
a gate|up weight whose GEMM writes act(gate) * up from its epilogue (per 16 rows, 8 gate rows
then their 8 up rows, so a thread's C values (rows r and r + 8) hold one feature's gate and up
values), and the activations it takes (`glu_act`)."""

from __future__ import annotations

import numpy as np


def glu_rows(F: int) -> np.ndarray:
    """-> int64 [2F]: interleaved row i = plain row [gate; up][perm[i]]. F % 8 == 0."""
    if F % 8:
        raise ValueError(f"glu_rows: F={F} is not a multiple of 8")
    i = np.arange(2 * F)
    blk, j = i // 16, i % 16
    return np.where(j < 8, 8 * blk + j, F + 8 * blk + j - 8)


# the epilogues' activations: silu (SwiGLU: llama, qwen, phi3) and ggml's tanh GELU (GeGLU: gemma;
# kernels/swiglu.cuh glu1<ACT>, ACT = the index here)
GLU_ACTS = ("silu", "gelu")


def glu_act(glu) -> str | None:
    """A launcher's `glu` argument -> None (no glu epilogue) or its activation: False / None ->
    None, True -> "silu", "silu" / "gelu" -> itself; anything else is a ValueError."""
    if glu is None or glu is False:
        return None
    if glu is True:
        return "silu"
    if isinstance(glu, str) and glu in GLU_ACTS:
        return glu
    raise ValueError(f"glu: {glu!r} is not one of True, False, {', '.join(GLU_ACTS)}")
