"""The f16 path's mixture-of-experts GEMMs (GemmPath.experts): every expert held as f16 [E, N, K]
(~2 B a weight, dequantized straight into its stack at load) and kernels/moe.cu's grouped GEMMs
(launchers and twins: minfer.cuda.ops.moe), the sort on their 64-row tiles. shared_ref: the twins
of qwen2moe's shared expert, which runs on the dense f16 GEMMs whichever path holds the experts
(minfer.cuda.load.moe)."""

from __future__ import annotations

import numpy as np

from minfer.cuda.ops import moe as M
from minfer.cuda.paths.base import ExpertGemms
from minfer.cuda.runtime import devarray as da


class F16Experts(ExpertGemms):
    name = label = "f16"
    bytes_per_weight = 2.0
    bm = M.BM

    def stack_bytes(self, E: int, N: int, K: int) -> int:
        return E * N * K * 2

    def ffn_ref(self, h16, wr, wg, wu, wd, k: int, norm_w: bool = True, w_scale: float = 0.0):
        return M.moe_ffn_ref(h16, wr, wg, wu, wd, k, norm_w, w_scale)

    def run(self, ml, rt, il: int, h16, P: int, act, ys, perm, op) -> None:
        k, fe, d, p = ml.k, ml.fe, ml.d, f"blk.{il}."
        with op("gemm:moe_gate_up", 2.0 * P * 2 * fe * d):
            da.poison(rt, act)
            w = ml.w[p + "ffn_gate_up_exps.weight"]
            M.grouped_gemm(rt, act, h16, w, ml.offs, ml.toff, True, perm, k, ml.kernel)
        with op("gemm:moe_down", 2.0 * P * d * fe):
            da.poison(rt, ys)
            w = ml.w[p + "ffn_down_exps.weight"]
            M.grouped_gemm(rt, ys, act, w, ml.offs, ml.toff, kernel=ml.kernel)


F16_EXPERTS = F16Experts()


def shared_ref(x, h16, g16, gu16, dn16):
    """x f32 [T, d] += the shared expert of h16 f16 [T, d] as MoeLayers runs it, in its twins:
    g16 [1, d] (the gate vector), gu16 [2F, d] (gate|up interleaved per 16), dn16 [d, F]."""
    from minfer.cuda.paths.f16.gemm import gemm_f16_nt_ref

    act = gemm_f16_nt_ref(h16, gu16, np.float16, glu=True)
    return M.shared_add_ref(x, gemm_f16_nt_ref(act, dn16), gemm_f16_nt_ref(h16, g16))
