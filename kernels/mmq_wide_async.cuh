// mmq_wide_async.cuh: the pipelined wide MMQ kernel for q4_K (mmq_q4k.cu).
//
// Block = 8 warps (2 along M x 4 along N), block tile 64 tokens x 128 weight rows; warp tile
// 32 x 32 = 2 A-frags (f) x 4 B-frags (nb), 8 mma chains, <= 128 registers: 2 blocks (16 warps)
// per SM at KD=4 (the 64 x 32 warp tile needed 255 registers, 8 warps per SM, and stalled on
// dependencies). KD picks the stage: SB = KD/4 super-blocks.
//
// Pipeline: two stages of A (raw q8_1 rows of the block's 64 tokens) and B (raw q4_K blocks of
// the block's 128 weight rows), both filled by 16-byte cp.async (.cg) one stage ahead, so no
// load is waited on in the chunk loop and B needs no registers between uses (the earlier
// register-prefetched kernel sat at the 255-register cap, and ptxas sank its B loads to the end
// of each super-block, exposing their latency). Per stage the block copies 64 x 20*SB A pieces
// and 128 x 9*SB B pieces of 16 B (about 5*SB and 4.5*SB per thread), a warp-wide copy moving
// 512 contiguous bytes.
//
// A fragments: the q words sit 4 B into each 40 B block, so no 16-byte row of them is 16-byte
// aligned and ldmatrix cannot read them: four LDS.32 per fragment (2-way bank conflicts at the
// chosen pitch; no pitch does better). The k order inside a 32-chunk is permuted the same on A
// and B (mma k 4t+e <-> value 8t+e, k 16+4t+e <-> value 8t+4+e), so one LDS.64 of the weight's
// q bytes at 32j + 8t holds a thread's b0 and b1 for chunks 2j (low nibbles) and 2j+1 (high).
//
// Epilogue per C value and 32-chunk: 2 FFMA, s1 = dsv*S (de-biased from the 0x4B400000 seed,
// exact) and sum += da*s1. The min term sum_c dma_ic*dmv_jc is a [64 x 8] x [8 x 32] product per
// super-block and runs on the tensor core: three tf32 m16n8k8 mmas per fragment (3xTF32: hi*hi
// + hi*lo + lo*hi, ~21-bit operands, f32 accumulate) straight into `sum`.
//
// Shared memory (dynamic, bytes; WideAsyncSmem<KD>):
//   sA  [2][64][SB*320 + 16]     raw q8_1 blocks of a stage
//   sB  [2][128][B_PITCH]        raw q4_K blocks of a stage (pitch = 8 words mod 32: the
//                                fragment LDS.64 of a half-warp hit 16 distinct bank pairs)
//   sDS [SB*8][32] float4        (da_g, da_g8, dma_g, dma_g8) of the token pair (g, g+8) of
//                                A-frag f at [chunk][f*8+g], for the stage being computed
//   sSC [SB][8][128] float       dsv = d*sc of the stage [sb][chunk][row'], rows permuted so a
//                                thread's 8 columns (nb*8 + 2t + e) are contiguous; odd chunks
//                                hold dsv/16 (their B is fed as 16 * nibble)
//   sMV [SB][8][128] uint2       dmv = -(dmin*m) as tf32 (hi, lo): the min term's B operand
#pragma once
#include "mmq_common.cuh"

template <int KD>
struct WideAsyncSmem {
    static constexpr int SB = KD / 4;                   // super-blocks per stage
    static constexpr int A_PITCH = SB * 320 + 16;
    static constexpr int B_PITCH = SB == 1 ? 160 : 288;  // SB*144 (+16), = 8 words mod 32
    static constexpr int A_STAGE = 64 * A_PITCH, B_STAGE = 128 * B_PITCH;
    static constexpr int A_OFF = 0, B_OFF = 2 * A_STAGE, DS_OFF = B_OFF + 2 * B_STAGE;
    static constexpr int SC_OFF = DS_OFF + SB * 8 * 32 * 16, MV_OFF = SC_OFF + SB * 8 * 128 * 4;
    static constexpr int BYTES = MV_OFF + SB * 8 * 128 * 8;
};
static_assert(WideAsyncSmem<4>::BYTES == 100352, "wide KD=4 smem");
static_assert(WideAsyncSmem<8>::BYTES == 190464, "wide KD=8 smem");
static_assert(WideAsyncSmem<4>::B_PITCH / 4 % 32 == 8 && WideAsyncSmem<8>::B_PITCH / 4 % 32 == 8,
              "B pitch: conflict-free fragment loads");
static_assert(WideAsyncSmem<8>::B_PITCH >= 2 * 144 && WideAsyncSmem<4>::A_PITCH % 16 == 0, "pitch");

// d (f32 [4]) += A (16x8 tf32, row) x B (8x8 tf32, col); fragments as in PTX's m16n8k8 .tf32.
__device__ __forceinline__ void mma_tf32_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The four A words of a fragment (rows g and g+8 at +0 and +4). MMQ_AVOL=1 (default) issues
// them as volatile asm, so ptxas keeps them in program order among the other volatile asm
// (no hoisting chunks ahead); 0: plain loads (for A/B runs).
#ifndef MMQ_AVOL
#define MMQ_AVOL 1
#endif
__device__ __forceinline__ void lds_afrag(uint32_t (&a)[4], const uint8_t* p, int row8) {
#if MMQ_AVOL
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ld.shared.b32 %0, [%4];\n\tld.shared.b32 %1, [%5];\n\t"
                 "ld.shared.b32 %2, [%4+4];\n\tld.shared.b32 %3, [%5+4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(s), "r"(s + row8));
#else
    a[0] = *(const uint32_t*)p;
    a[1] = *(const uint32_t*)(p + row8);
    a[2] = *(const uint32_t*)(p + 4);
    a[3] = *(const uint32_t*)(p + row8 + 4);
#endif
}

// m16n8k32 with A signed (q8_1 values) and B unsigned: the q4_K nibble bytes as 0..15 (low,
// masked 0x0F) or 16 * (0..15) (high, masked 0xF0: no shift; the table scale of an odd chunk is
// dsv/16, exact). |S| <= 32*127*240 < 2^22: the 0x4B400000 seed still reads as a float.
__device__ __forceinline__ void mma_k32_su8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

__device__ __forceinline__ void cp_async16(uint32_t smem_addr, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(gmem));
}

// Issue the copies of super-blocks kb .. kb+nsb-1 (nsb <= SB) into stage st: A rows m0.. (rows
// past M copy row M-1: computed, never stored), B rows n0.. (past N: row N-1), then commit.
// Consecutive threads take consecutive 16-byte pieces (a warp-wide copy: 512 contiguous bytes
// of one or two rows). Measured: one row per thread with strided pieces (fewer address
// instructions, a warp-wide copy spread over 8 rows) made the kernel 7-9% slower.
template <int KD>
__device__ __forceinline__ void wide_async_issue(const uint8_t* A, const uint8_t* B,
                                                 uint32_t sbase, int st, int m0, int M, int n0,
                                                 int N, size_t arow, size_t brow, int kb,
                                                 int nsb, int tid) {
    using S = WideAsyncSmem<KD>;
    constexpr int AP = S::SB * 20, BP = S::SB * 9;   // 16-byte pieces per row stretch
    const uint32_t sa = sbase + S::A_OFF + st * S::A_STAGE, sb = sbase + S::B_OFF + st * S::B_STAGE;
    const uint8_t* Ak = A + (size_t)kb * 320;   // row addresses via row_ptr on these per-stage
    const uint8_t* Bk = B + (size_t)kb * 144;   // bases: never hoisted out of the k loop
    #pragma unroll 1
    for (int i = 0; i < AP / 4; i++) {   // 64 rows x AP pieces over 256 threads
        const int q = tid + 256 * i, r = q / AP, pc = q - r * AP;
        if (pc < nsb * 20)
            cp_async16(sa + r * S::A_PITCH + pc * 16,
                       row_ptr(Ak, min(m0 + r, M - 1), (uint32_t)arow) + pc * 16);
    }
    #pragma unroll 1
    for (int i = 0; i < (BP + 1) / 2; i++) {   // 128 rows x BP pieces over 256 threads
        const int q = tid + 256 * i, r = q / BP, pc = q - r * BP;
        if (q < 128 * BP && pc < nsb * 9)
            cp_async16(sb + r * S::B_PITCH + pc * 16,
                       row_ptr(Bk, min(n0 + r, N - 1), (uint32_t)brow) + pc * 16);
    }
    asm volatile("cp.async.commit_group;");
}

// One stage: wait for its copies, start the other stage's, derive (da, dma) and compute
// super-blocks kb0 .. kb0+nsb-1. ST is a template parameter so that the shared-memory addresses
// of the chunk loop are immediate offsets.
template <int KD, int ST>
__device__ __forceinline__ void wide_async_stage(const uint8_t* __restrict__ A,
                                                 const uint8_t* __restrict__ B, uint8_t* smem,
                                                 int kb0, int KB, int m0, int M, int n0, int N,
                                                 size_t arow, size_t brow,
                                                 float (&sum)[2][4][4]) {
    using S = WideAsyncSmem<KD>;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsb = min(S::SB, KB - kb0);
    asm volatile("cp.async.wait_group 0;" ::: "memory");   // this stage's copies (this thread)
    __syncthreads();   // ... and everyone's; the other stage is no longer read by anyone
    if (kb0 + S::SB < KB)
        wide_async_issue<KD>(A, B, (uint32_t)__cvta_generic_to_shared(smem), ST ^ 1, m0, M, n0, N,
                             arow, brow, kb0 + S::SB, min(S::SB, KB - kb0 - S::SB), tid);
    const uint8_t* sA = smem + S::A_OFF + ST * S::A_STAGE;
    const uint8_t* sB = smem + S::B_OFF + ST * S::B_STAGE;
    float* sDS = (float*)(smem + S::DS_OFF);
    float* sSC = (float*)(smem + S::SC_OFF);
    uint2* sMV = (uint2*)(smem + S::MV_OFF);
    {   // (d, s) of this thread's (row, chunk) items -> (da, dma) at [chunk][f*8+g][pair]
        const int r = tid & 63, slot = (r >> 4) * 8 + (r & 7), half = (r >> 3) & 1;
        for (int kc = tid >> 6; kc < nsb * 8; kc += 4) {
            const uint8_t* blk = sA + r * S::A_PITCH + kc * 40;
            const float d = mmq_h2f(*(const uint16_t*)blk);
            float* p = sDS + (kc * 32 + slot) * 4 + half;
            p[0] = d;
            p[2] = d * (float)*(const int*)(blk + 36);   // exact: 11-bit d x |s| <= 4064
        }
    }
    {   // weight row tid & 127, chunks 4*(tid >> 7) ..+3 of each super-block -> the tables
        const int row = tid & 127, c0 = 4 * (tid >> 7);
        for (int kbi = 0; kbi < nsb; kbi++) {
            const uint4 h = *(const uint4*)(sB + row * S::B_PITCH + kbi * 144);
            const float d = mmq_h2f(h.x), dmin = mmq_h2f(h.x >> 16);
            #pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                const int c = c0 + cc;
                int sc, m;
                q4k_scale_min(c, h.y, h.z, h.w, sc, m);
                // exact: 11-bit d times 6-bit sc; / 16 for odd chunks (B fed as 16 * nibble)
                const float dsv = d * (float)sc * ((c & 1) ? 0.0625f : 1.0f);
                // row wn*32 + nb*8 + 2t + e -> [wn][t][nb][e]: a thread's 8 columns contiguous
                sSC[(kbi * 8 + c) * 128 + (row & ~31) + ((row >> 1) & 3) * 8 +
                    ((row >> 3) & 3) * 2 + (row & 1)] = dsv;
                uint32_t hi, lo;
                tf32_split(-(dmin * (float)m), hi, lo);
                sMV[(kbi * 8 + c) * 128 + row] = make_uint2(hi, lo);
            }
        }
    }
    __syncthreads();
    const int wm = warp >> 2, wn = warp & 3;   // warp's tokens wm*32.., weight rows wn*32..
    const uint8_t* aw = sA + (wm * 32 + g) * S::A_PITCH + 4 + 8 * t;   // a0 of f 0 (permuted k)
    const uint8_t* bw = sB + (wn * 32 + g) * S::B_PITCH + 16 + 8 * t;   // b of nb 0, pair 0
    const float* scw = sSC + wn * 32 + t * 8;   // + (kbi*8 + c)*128 + nb*2: columns nb*8+2t, +1
    for (int kbi = 0; kbi < nsb; kbi++) {
        #pragma unroll
        for (int j = 0; j < 4; j++) {   // chunk pairs: one LDS.64 of B per nb serves both
            uint2 bw2[4];
            #pragma unroll
            for (int nb = 0; nb < 4; nb++)
                bw2[nb] = *(const uint2*)(bw + nb * 8 * S::B_PITCH + kbi * 144 + 32 * j);
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = 2 * j + h, kc = kbi * 8 + c;
                float sx[4][2], sy[4][2];   // (dsv, -1.5*2^23*dsv) of columns nb*8 + 2t, +1
                uint32_t b[4][2];
                #pragma unroll
                for (int nb = 0; nb < 4; nb++) {
                    const float2 v = *(const float2*)(scw + (kbi * 8 + c) * 128 + nb * 2);
                    sx[nb][0] = v.x; sx[nb][1] = v.y;
                    // the de-bias term by FMUL: 8 per chunk, half the table's smem wavefronts
                    sy[nb][0] = -MMQ_MAGIC_F * v.x; sy[nb][1] = -MMQ_MAGIC_F * v.y;
                    b[nb][0] = bw2[nb].x & (h ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
                    b[nb][1] = bw2[nb].y & (h ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
                }
                uint32_t a[2][4];   // both A fragments first: their loads overlap
                #pragma unroll
                for (int f = 0; f < 2; f++) lds_afrag(a[f], aw + f * 16 * S::A_PITCH + kc * 40, 8 * S::A_PITCH);
                #pragma unroll
                for (int f = 0; f < 2; f++) {
                    const float2 da = *(const float2*)(sDS + (kc * 32 + (wm * 2 + f) * 8 + g) * 4);
                    #pragma unroll
                    for (int nb = 0; nb < 4; nb++) {
                        int acc[4];
                        mma_k32_su8(acc, a[f], b[nb][0], b[nb][1], MMQ_MAGIC_I);
                        #pragma unroll
                        for (int l = 0; l < 4; l++) {   // C row f*16+g+8*(l>>1), col nb*8+2t+(l&1)
                            const float s1 = fmaf(sx[nb][l & 1], __int_as_float(acc[l]), sy[nb][l & 1]);
                            sum[f][nb][l] = fmaf((l >> 1) ? da.y : da.x, s1, sum[f][nb][l]);
                        }
                    }
                }
            }
        }
        // min term of this super-block: 3xTF32, A = dma [token][chunk], B = dmv [chunk][row]
        uint2 bm[4][2];   // B[k = chunk t, t+4][n = row nb*8+g]: (hi, lo)
        #pragma unroll
        for (int nb = 0; nb < 4; nb++) {
            bm[nb][0] = sMV[(kbi * 8 + t) * 128 + wn * 32 + nb * 8 + g];
            bm[nb][1] = sMV[(kbi * 8 + t + 4) * 128 + wn * 32 + nb * 8 + g];
        }
        #pragma unroll
        for (int f = 0; f < 2; f++) {
            const int slot = (wm * 2 + f) * 8 + g;
            const float4 p = *(const float4*)(sDS + ((kbi * 8 + t) * 32 + slot) * 4);
            const float4 q = *(const float4*)(sDS + ((kbi * 8 + t + 4) * 32 + slot) * 4);
            const float am[4] = {p.z, p.w, q.z, q.w};   // a0..a3: (g,t) (g+8,t) (g,t+4) (g+8,t+4)
            uint32_t ah[4], al[4];
            #pragma unroll
            for (int e = 0; e < 4; e++) tf32_split(am[e], ah[e], al[e]);
            #pragma unroll
            for (int nb = 0; nb < 4; nb++) {
                mma_tf32_k8(sum[f][nb], al[0], al[1], al[2], al[3], bm[nb][0].x, bm[nb][1].x);
                mma_tf32_k8(sum[f][nb], ah[0], ah[1], ah[2], ah[3], bm[nb][0].y, bm[nb][1].y);
                mma_tf32_k8(sum[f][nb], ah[0], ah[1], ah[2], ah[3], bm[nb][0].x, bm[nb][1].x);
            }
        }
    }
}

template <int KD>
__device__ __forceinline__ void mmq_wide_async(const uint8_t* __restrict__ A,
                                               const uint8_t* __restrict__ B, float* C, int M,
                                               int N, int K, int accumulate) {
    using S = WideAsyncSmem<KD>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 128;
    const int KB = K / 256;
    const size_t arow = (size_t)(K / 32) * 40, brow = (size_t)KB * 144;
    float sum[2][4][4] = {};
    wide_async_issue<KD>(A, B, (uint32_t)__cvta_generic_to_shared(smem), 0, m0, M, n0, N, arow,
                         brow, 0, min(S::SB, KB), tid);
    for (int kb0 = 0; kb0 < KB; kb0 += 2 * S::SB) {
        wide_async_stage<KD, 0>(A, B, smem, kb0, KB, m0, M, n0, N, arow, brow, sum);
        if (kb0 + S::SB < KB)
            wide_async_stage<KD, 1>(A, B, smem, kb0 + S::SB, KB, m0, M, n0, N, arow, brow, sum);
    }
    const int mw = m0 + (warp >> 2) * 32, nw = n0 + (warp & 3) * 32;
    #pragma unroll
    for (int f = 0; f < 2; f++)
        #pragma unroll
        for (int nb = 0; nb < 4; nb++)
            #pragma unroll
            for (int l = 0; l < 4; l++)
                mmq_store(C, M, N, mw + f * 16 + g + 8 * (l >> 1), nw + nb * 8 + 2 * t + (l & 1),
                          sum[f][nb][l], accumulate);
}
