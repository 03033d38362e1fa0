// mmq_q6k.cu: C[M, N] f32 = q8_1(A)[M, K] x q6_K(W)[N, K]^T on int8 tensor cores.
// q6_K has one int8 scale per 16 values, so each 32-chunk is two m16n8k16 s8 mmas (the k16
// halves of the m16n8k32 fragments: {a0,a1} x b0 and {a2,a3} x b1); B is fed signed (q - 32,
// in -32..31), so there is no min term: sum += da * (d*sc[2c]*S0 + d*sc[2c+1]*S1).
// Same structure, geometry and arguments as mmq_q4k.cu (W raw [N][K/256*210] B):
//   mmq_q6k_nt_kernel            R1-style legacy path (I2F epilogue), no smem.
//   mmq_q6k_raw_nt_kernel        narrow, no smem.
//   mmq_q6k_raw_wide_nt_kernel   wide (mmq_wide_sync.cuh), KD = MMQ_KD (4 or 8) super-blocks
//                                staged per pass, dynamic smem WideSyncSmem<KD>::BYTES.
#include "mmq_wide_sync.cuh"

#ifndef MMQ_KD
#define MMQ_KD 4
#endif
static_assert(MMQ_KD == 4 || MMQ_KD == 8, "MMQ_KD must be 4 or 8");
static_assert(W_Q6K::BYTES == 210, "q6_K block is 210 B");

extern "C" __global__ void __launch_bounds__(128)
mmq_q6k_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K,
                  int accumulate) {
    mmq_narrow<W_Q6K, true>(A, W, C, M, N, K, accumulate);
}

extern "C" __global__ void __launch_bounds__(128)
mmq_q6k_raw_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K,
                      int accumulate) {
    mmq_narrow<W_Q6K, false>(A, W, C, M, N, K, accumulate);
}

extern "C" __global__ void __launch_bounds__(128, (MMQ_KD == 4 ? 2 : 1))
mmq_q6k_raw_wide_nt_kernel(const uint8_t* A, const uint8_t* W, float* C, int M, int N, int K,
                           int accumulate) {
    mmq_wide_sync<W_Q6K, MMQ_KD>(A, W, C, M, N, K, accumulate);
}
