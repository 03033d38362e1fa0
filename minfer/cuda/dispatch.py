"""pick_gemm: the one function that chooses a GEMM path for a weight.

"f16": dequantized once to f16 at load, tensor-core GEMM (the default; any weight type).
"mmq-r1" | "mmq-narrow" | "mmq-wide-kd4" | "mmq-wide-kd8": int8 mma on the raw q4_K / q6_K
bytes (minfer.cuda.mmq.mmq_linear), when cfg.mmq and the type has an MMQ kernel and K is a
multiple of 256; any other type falls back to f16. "mmq-wgmma": a q4_K weight of the wide
config (cfg.wgmma) on an sm_90 device (`rt.arch`): the Hopper wgmma kernel on the weight
repacked at load. With `rt` given, the smem guard applies: a wide config over the device's
opt-in shared-memory cap becomes "mmq-narrow" (mmq_linear prints the one-line notice when it
runs). cfg.q6k_f16 keeps q6_K weights on "f16" (their MMQ kernels are slower than f16 at prefill
on sm_90).
"""

from __future__ import annotations

from minfer.cuda.config import GemmConfig


def pick_gemm(qtype: int, M: int, N: int, K: int, cfg: GemmConfig, rt=None) -> str:
    """Path name for y[M, N] = x[M, K] @ W[N, K].T with W of GGUF type `qtype`."""
    if not cfg.mmq:
        return "f16"
    from minfer.cuda.mmq import Q6_K, has_mmq, pick_variant

    if not has_mmq(qtype) or K % 256 or (cfg.q6k_f16 and int(qtype) == Q6_K):
        return "f16"
    smem_optin = rt.smem_optin if rt is not None else 1 << 30
    return "mmq-" + pick_variant(cfg, smem_optin, qtype, getattr(rt, "arch", None)).label
