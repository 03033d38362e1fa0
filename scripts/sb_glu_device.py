"""The q4_K SB gate|up GEMM with and without the swiglu epilogue, kernel level (device run):
per M, the plain GEMM (f32 [M, 2F]) alone and followed by ffn_down's operand launch
(sb_operand_swiglu), against the epilogue GEMM (f16 [M, F]) alone and followed by sb_operand;
`SB_GLU_EXACT` (the swiglu layer's expf and IEEE division in the epilogue instead of the fast
intrinsics) for what the exact arithmetic costs. Interleaved, queued behind a spin, median of 7 (mmq_device).
Checks first that the SB_GLU_EXACT epilogue's output is the bits of GEMM + swiglu at a
whole-tile shape.

python3 scripts/sb_glu_device.py   (F = 14336, K = 4096; M = 512 and 2048; a table last)
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.layers import swiglu_fused
from minfer.cuda.mmq_sb import mmq_sb_linear, repack_sb, sb_operand, sb_operand_swiglu
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_sb_ref import glu_rows
from mmq_device import interleaved, print_table, rand_weights


def main() -> int:
    rt = get_runtime()
    rng = np.random.default_rng(0)
    F, K = 14336, 4096
    w = rand_weights(rng, 12, 2 * F, K)
    plain = repack_sb(rt, da.to_device(rt, w.reshape(-1)), 12, 2 * F, K)
    glu = repack_sb(rt, da.to_device(rt, w[glu_rows(F)].reshape(-1)), 12, 2 * F, K)
    rows, ok = [], True
    for M in (512, 2048):
        x = da.to_device(rt, (0.02 * rng.standard_normal((M, K))).astype(np.float32))
        tok = sb_operand(rt, x)
        gu = da.empty(rt, (M, 2 * F), np.float32)
        h = da.empty(rt, (M, F), np.float16)
        if M == 512:   # 512 x 28672: 896 tiles, stream-K splits the last ones: use 128 rows
            t1 = sb_operand(rt, da.to_device(rt, (0.02 * rng.standard_normal((128, K))).astype(
                np.float32)))
            g1, h1, want = (da.empty(rt, (128, 2 * F), np.float32), da.empty(rt, (128, F), np.float16),
                            da.empty(rt, (128, F), np.float16))
            mmq_sb_linear(rt, t1, plain, 128, 2 * F, K, g1, stream_k=False)
            swiglu_fused(rt, want, g1)
            mmq_sb_linear(rt, t1, glu, 128, 2 * F, K, h1, stream_k=False, swiglu=True,
                          build_opts=("-DSB_GLU_EXACT",))
            same = bool(np.array_equal(h1.get().view(np.uint16), want.get().view(np.uint16)))
            ok &= same
            print(f"epilogue bits == GEMM + swiglu (M=128, whole tiles): {same}")
        t_down = sb_operand(rt, h).tt   # (operand buffers made once: no allocation in the batches)
        runs = [
            ("plain GEMM", lambda i: mmq_sb_linear(rt, tok, plain, M, 2 * F, K, gu)),
            ("plain GEMM + swiglu operand", lambda i: (
                mmq_sb_linear(rt, tok, plain, M, 2 * F, K, gu), sb_operand_swiglu(rt, gu, tt=t_down))),
            ("epilogue GEMM", lambda i: mmq_sb_linear(rt, tok, glu, M, 2 * F, K, h, swiglu=True)),
            ("epilogue GEMM + operand", lambda i: (
                mmq_sb_linear(rt, tok, glu, M, 2 * F, K, h, swiglu=True), sb_operand(rt, h, tt=t_down))),
            ("epilogue GEMM, SB_GLU_EXACT", lambda i: mmq_sb_linear(
                rt, tok, glu, M, 2 * F, K, h, swiglu=True, build_opts=("-DSB_GLU_EXACT",))),
        ]
        for name, (us, spread) in interleaved(rt, runs, rounds=7, batch=5).items():
            rows.append((M, name, us, 100 * spread))
    print_table(["M:", "run", "µs:", "p90-p10 %:"], rows, ["d", "", ".1f", ".1f"])
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
