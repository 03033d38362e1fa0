// blk_split.cu: the column pieces of blk-split (ffn_down on blk's int8 grid with each weight's
// busiest input channels kept on f16; minfer/cuda/paths/blk/split.py, docs/blk.md). Launchers
// and numpy twins: minfer/cuda/paths/blk/split.py (twins in minfer/cuda/paths/blk/outliers.py).
//
// Entries (row-major, row stride `ld` in elements):
//   blk_split_cols   A f16 [M, ld], cols int32 [n] (distinct, ascending), out f16 [M, n]:
//                    out[m, j] = A[m, cols[j]], then A[m, cols[j]] = 0. One thread per
//                    (m, j): each element of A read and zeroed by exactly one thread, so the
//                    gather and the zeroing need no ordering. Serves the activation (before
//                    blk's operand prepass) and the dequantized weight (before its requant).
//   col_sumsq_f16    acc f32 [K] += sum over m of A[m, k]^2 (f32, rows in order): a thread per
//                    column walking the rows, so the sum's order is fixed (the twin's) and a
//                    warp reads 32 consecutive halves per row. The calibration's statistic.

#include <cuda_fp16.h>

extern "C" __global__ void __launch_bounds__(256)
blk_split_cols(__half* __restrict__ A, long long ld, int M, const int* __restrict__ cols, int n,
               __half* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<long long>(M) * n) return;
    const long long m = i / n;
    const int j = static_cast<int>(i - m * n);
    __half* a = A + m * ld + cols[j];
    out[i] = *a;
    *a = __float2half(0.f);
}

extern "C" __global__ void __launch_bounds__(256)
col_sumsq_f16(const __half* __restrict__ A, long long ld, int M, int K, float* __restrict__ acc) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K) return;
    float s = 0.f;
    for (int m = 0; m < M; ++m) {
        const float v = __half2float(A[m * ld + k]);
        s = __fadd_rn(s, __fmul_rn(v, v));   // (no FMA contraction: the twin's f32 rounding)
    }
    acc[k] = __fadd_rn(acc[k], s);
}
