"""pick_gemm: the one function that chooses a GEMM path for a weight.

For now every weight takes the f16 path (dequantized once to f16 at load, tensor-core GEMM);
the MMQ paths (int8 mma on the quantized weights) are added here later, keyed on cfg and qtype.
"""

from __future__ import annotations

from minfer.cuda.config import GemmConfig


def pick_gemm(qtype: int, M: int, N: int, K: int, cfg: GemmConfig, rt=None) -> str:
    """Path name for y[M, N] = x[M, K] @ W[N, K].T with W of GGUF type `qtype`."""
    return "f16"
