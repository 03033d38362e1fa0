// mmq_q4k.cu: C[M, N] f32 = q8_1(A)[M, K] x q4_K(W)[N, K]^T on int8 tensor cores
// (mma.sync m16n8k32 s8, B = unsigned nibbles 0..15; per 32-chunk
//  sum += da*dsv*S + dma*dmv, dsv = d*sc, dmv = -dmin*m, dma = da*s: see mmq_common.cuh and
//  docs/mmq.md). C is written, or added to when `accumulate` != 0 (residual epilogue).
// Entries (all: A q8_1 raw [M][K/32*40] B, W raw [N][K/256*144] B, C, M, N, K, accumulate):
//   mmq_nt_kernel            R1 word-level legacy path: I2F + pre-fold epilogue, no smem.
//                            grid (ceil(N/64), ceil(M/32)), block 128.
//   mmq_raw_nt_kernel        narrow: raw 40 B chunk reads, 4 token rows per thread, folded
//                            epilogue, no smem. Same grid/block as R1.
//   mmq_raw_wide_nt_kernel   wide (mmq_wide_async.cuh): cp.async-pipelined A and B stages of
//                            KD/4 super-blocks (-DMMQ_KD=4 or 8), 8 warps of 32 x 32, min term
//                            on tf32 mma. grid (ceil(N/128), ceil(M/64)), block 256, dynamic
//                            smem WideAsyncSmem<KD>::BYTES (100,352 B / 190,464 B).
// K must be a multiple of 256 (the launcher checks); ragged M and N are handled.
#include "mmq_wide_async.cuh"

#ifndef MMQ_KD
#define MMQ_KD 4
#endif
static_assert(MMQ_KD == 4 || MMQ_KD == 8, "MMQ_KD must be 4 or 8");
static_assert(W_Q4K::BYTES == 144, "q4_K block is 144 B");

extern "C" __global__ void __launch_bounds__(128)
mmq_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K, int accumulate) {
    mmq_narrow<W_Q4K, true>(A, W, C, M, N, K, accumulate);
}

extern "C" __global__ void __launch_bounds__(128)
mmq_raw_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K,
                  int accumulate) {
    mmq_narrow<W_Q4K, false>(A, W, C, M, N, K, accumulate);
}

// 2 blocks per SM where two fit: KD=4 on sm_90 (2 x 104 KB of its 228 KB); sm_80's 164 KB
// holds one, and there the kernel may use up to 255 registers.
#if MMQ_KD == 4 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define MMQ_WIDE_MIN_BLOCKS 2
#else
#define MMQ_WIDE_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(256, MMQ_WIDE_MIN_BLOCKS)
mmq_raw_wide_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K,
                       int accumulate) {
    mmq_wide_async<MMQ_KD>(A, W, C, M, N, K, accumulate);
}
