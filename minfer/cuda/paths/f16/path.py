"""The f16 path: every GGUF type dequantized to f16 on the GPU at load, the tensor-core GEMM
(gemm_f16_nt: mma.sync, or wgmma on sm_90a; a GEMV at M == 1) on the f16 activation. Exact
(no activation grid); epilogues: the swiglu of a fused gate|up GEMM, and the rope of a fused
q|k|v GEMM writing q16 and the KV cache (minfer.cuda.ops.layers.QkvRope). Tuning variants
no-glu, no-rope. Twin: the f16-rounded operands in float64."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths.base import GemmPath, LinearRoute
from minfer.cuda.paths.f16.moe import F16_EXPERTS
from minfer.cuda.runtime import devarray as da


class F16Route(LinearRoute):
    """gemm_f16_nt on the dequantized f16 weight; glu at M == 1: the GEMV's f32 into the
    scratch's gate|up buffer, then the interleaved swiglu / geglu launch (the GEMV has no
    epilogue)."""

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt

        if mode == "acc":
            gemm_f16_nt(x, w, np.float32, accumulate=C, rt=rt)
            return
        da.poison(rt, C)  # debug / poison mode: NaN unless the GEMM really writes C
        gemm_f16_nt(x, w, np.float16 if mode == "f16" else np.float32, out=C, rt=rt)

    def run_glu(self, rt, scratch, C, x, w, act: str = "silu") -> None:
        from minfer.cuda.ops import gemma_layers as G
        from minfer.cuda.ops import layers as L
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt

        M = x.shape[0]
        da.poison(rt, C)
        if M > 1:
            gemm_f16_nt(x, w, np.float16, out=C, rt=rt, glu=act)
            return
        gu = da.reshape(da.rows(scratch.gu32, 0, 2 * C.shape[1]), (M, 2 * C.shape[1]))
        gemm_f16_nt(x, w, np.float32, out=gu, rt=rt)
        (G.geglu_interleaved if act == "gelu" else L.swiglu_interleaved)(rt, C, gu)

    def rope_pays(self, rt, M: int, N: int) -> bool:
        from minfer.cuda.paths.f16.gemm import rope_epilogue_pays

        return rope_epilogue_pays(M, N, rt.sm_count, rt.arch)

    def run_rope(self, rt, scratch, x, w, rope, hi: int) -> None:
        from minfer.cuda.paths.f16.gemm import gemm_f16_nt

        gemm_f16_nt(x, w, rt=rt, rope=rope, hi=hi)


@dataclass(frozen=True)
class F16Path(GemmPath):
    via_f16 = True
    glu = True
    rope = True
    weight_parts = ("f16 weights",)

    def route(self, qtype: int, choice, name: str = "") -> F16Route:
        return F16Route(self, qtype, choice, name)

    def dest(self, rt, rows: int, K: int, row_bytes: int, name: str):
        from minfer.cuda.paths.f16 import upload

        return upload.dest(rt, rows, K, f"fused f16 weight {name}")

    def upload(self, rt, up, parts, name: str, dst=None, glu: bool = False):
        from minfer.cuda.paths.f16 import upload

        return upload.upload(rt, up, parts, name, dst, glu)

    def twin(self, x, w_raw, qtype: int, M: int, N: int, K: int, name: str = ""):
        from minfer.cuda.ops.dequant import dequant_f16_ref

        a = np.asarray(x, np.float32).reshape(M, K).astype(np.float16).astype(np.float64)
        return a @ dequant_f16_ref(w_raw, qtype, N, K).astype(np.float64).T


F16 = F16Path(
    "f16", "gemm_f16_nt", None, None, 8, {None: 2.0}, variants=("glu", "rope"), experts=F16_EXPERTS
)
