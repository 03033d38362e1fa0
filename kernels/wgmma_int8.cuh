// wgmma_int8.cuh: pieces of the Hopper int8 wgmma kernel (mmq_blk.cu):
// the register list of an m64n128 s32 accumulator and the epilogues that store a consumer
// thread's 64 C values (C =, C +=, the swiglu / geglu of interleaved gate|up rows). The wgmma's
// M side is the weight rows, its N side the tokens: a thread's value z[4i + j] is weight row
// r + 8 (j / 2) and token m + 8i + (j % 2) (r, m: the thread's first row and token, m = tile's
// first + 2t).
#pragma once
#include <cuda_fp16.h>

#include "swiglu.cuh"

// The 64 accumulator operands "+r"(d[0..63]) and their register list of an m64n128 wgmma
// (the int8 kernel's igmma)
#define WG_D64 "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), \
    "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), \
    "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), \
    "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), \
    "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), \
    "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), \
    "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), \
    "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), \
    "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), \
    "+r"(d[62]), "+r"(d[63])
#define WG_R64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "


// C[token][row] = (ACC: +=) y: z[4i + j] is token m + 8i + (j & 1) (m: the tile's first token
// + 2t) and row r + 8 (j >> 1) (r: the thread's first row); 32-byte runs of 8 rows per warp.
// C += loads all 64 values first, then stores the sums: one CTA writes each value (stream-K
// tails hand theirs to the head), and on the H200 this beat atomic adds by 7% on attn_output
// at M = 2048 (docs/perf.md); an L2 prefetch of C before the epilogue gained nothing.
template <bool ACC>
__device__ __forceinline__ void store_t(const float (&z)[64], float* C, int M, int N, int m,
                                        int r) {
    float c[64];
#pragma unroll
    for (int k = 0; k < 64; ++k) {
        const int tok = m + 8 * (k >> 2) + (k & 1), row = r + 8 * ((k >> 1) & 1);
        c[k] = (ACC && tok < M && row < N) ? C[(size_t)tok * N + row] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < 64; ++k) {
        const int tok = m + 8 * (k >> 2) + (k & 1), row = r + 8 * ((k >> 1) & 1);
        if (tok < M && row < N) C[(size_t)tok * N + row] = ACC ? c[k] + z[k] : z[k];
    }
}

// The glu epilogue (rows interleaved per 16: 8 gate rows, then their 8 up rows; quants.glu.
// glu_rows): the thread's rows r and r + 8 are the gate and the up row of feature (r / 16) 8 +
// r % 16, so H[token][feature] = f16(act(g) u) from z[4i + j] (gate, j < 2) and z[4i + j + 2]
// (up), no exchange; F = N / 2 features; ACT 0 silu (swiglu), 1 gemma's GELU (geglu). With the
// fast intrinsics (swiglu.cuh glu1_fast): the exact forms' expf / tanhf and division cost this
// GEMM 4-8%; -DWG_GLU_EXACT builds the layers' rounding (the tests prove the row map bitwise
// with it).
template <int ACT>
__device__ __forceinline__ void store_glu(const float (&z)[64], __half* H, int M, int F, int m,
                                          int r) {
    const int f = r / 16 * 8 + r % 16;
#pragma unroll
    for (int k = 0; k < 64; ++k) {
        if ((k >> 1) & 1) continue;   // (the up values, read with their gate values)
        const int tok = m + 8 * (k >> 2) + (k & 1);
#ifdef WG_GLU_EXACT   // the layers' rounding (tests: the row map, bitwise)
        const float y = glu1<ACT>(z[k], z[k + 2]);
#else
        const float y = glu1_fast<ACT>(z[k], z[k + 2]);
#endif
        if (tok < M && f < F) H[(size_t)tok * F + f] = __float2half_rn(y);
    }
}

