// mmq_common.cuh: shared pieces of the int8 tensor-core MMQ kernels (mmq_q4k.cu, mmq_q6k.cu).
//
// C[M, N] (f32, row-major) = A[M, K] x W[N, K]^T with A = q8_1 raw activation blocks (40 B per
// 32 values: f16 d @+0, int8 q[32] @+4, int32 s @+36) and W = raw GGUF k-quant blocks. All
// products run on mma.sync m16n8k32 (m16n8k16 halves for q6_K) .s32.s8.s8.s32; the f32 rescale
// per 32-chunk happens in registers (docs/mmq.md has the math and the C-fragment row maps).
//
// The template kernels are instantiated by the .cu files with a weight-traits struct W:
//   mmq_narrow<W, LEGACY>  (here) no shared memory; 4 token rows per thread (rows g + 8*q);
//                          LEGACY=true is the R1 word-level path (I2F + pre-fold epilogue).
//   mmq_wide_async<KD>     (mmq_wide_async.cuh, q4_K) cp.async-pipelined A and B stages.
//   mmq_wide_sync<W, KD>   (mmq_wide_sync.cuh, q6_K) A staged synchronously, B from registers.
// Both wide kernels: 16-chain warp tile (4 A-frags x 4 B-frags = 64 tokens x 32 weight rows).
#pragma once
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

struct q8_1_raw_block {
    uint16_t d;       // f16 scale
    uint16_t pad;
    int8_t q[32];
    int32_t s;        // integer sum of q
};
static_assert(sizeof(q8_1_raw_block) == 40, "q8_1 raw block is 40 B");
static_assert(offsetof(q8_1_raw_block, q) == 4, "q8_1 raw: q at +4");
static_assert(offsetof(q8_1_raw_block, s) == 36, "q8_1 raw: s at +36");

// Accumulator seed: the float with bits 0x4B400000 is 1.5*2^23; adding an int |S| < 2^22 to
// those bits gives the float 1.5*2^23 + S exactly, so the s32 mma result reads as a float
// without an I2F (|S| <= 32*127*15 for q4_K, 16*127*32 for q6_K halves).
#define MMQ_MAGIC_I 0x4B400000
#define MMQ_MAGIC_F 12582912.0f

// x ~ hi + lo as two tf32 values (10 explicit mantissa bits each, by truncation: x - hi is exact
// in f32, then truncated in turn), ~21 bits of x in all: the 3xTF32 operands of the min term.
// Masks instead of cvt.rna.tf32.f32, which ptxas expands to a compare-and-add sequence.
__device__ __forceinline__ void tf32_split(float x, uint32_t& hi, uint32_t& lo) {
    hi = __float_as_uint(x) & 0xFFFFE000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xFFFFE000u;
}

__device__ __forceinline__ float mmq_h2f(uint32_t bits16) {
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFFu)));
}

__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// k16 half of an m16n8k32 fragment set: {a0, a1} x b0 (k 0..15) or {a2, a3} x b1 (k 16..31).
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b,
                                        int c) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 4 bytes from a 2-byte aligned address (q6_K blocks are 210 B, so odd blocks are 2-aligned).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
    const uint16_t* h = (const uint16_t*)p;
    return (uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16);
}

// 6-bit values v (0..63) in each byte -> s8 (v - 32), no cross-byte borrow.
__device__ __forceinline__ uint32_t q6_minus32(uint32_t v) {
    return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// get_scale_min_k4 for sub-block j of a q4_K block, from its 12 scale bytes as 3 words.
__device__ __forceinline__ void q4k_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2,
                                              int& sc, int& m) {
    // bytes: s0 = q[0..3], s1 = q[4..7], s2 = q[8..11]
    if (j < 4) {
        sc = (s0 >> (8 * j)) & 63;
        m = (s1 >> (8 * j)) & 63;
    } else {
        const int jj = j - 4;
        const uint32_t qj4 = (s2 >> (8 * jj)) & 0xFF;   // q[j+4]
        sc = (qj4 & 0xF) | (((s0 >> (8 * jj + 6)) & 3) << 4);
        m = (qj4 >> 4) | (((s1 >> (8 * jj + 6)) & 3) << 4);
    }
}

// --------------------------------------------------------------------------------------------
// Weight traits. Each provides:
//   BYTES                      bytes per 256-value super-block
//   TWO_HALVES                 q6_K: two k16 mmas per 32-chunk (one scale per 16 values)
//   chunk_scales(blk, c, &x, &y)   f32 pair per (row, chunk): q4_K (dsv, dmv); q6_K (dsv0, dsv1)
//   narrow B words:  b_natural(blk, c, t, &b0, &b1)  the s8 B fragment of chunk c, natural k
// --------------------------------------------------------------------------------------------
struct W_Q4K {
    static constexpr int BYTES = 144;
    static constexpr bool TWO_HALVES = false;
    static constexpr bool PERM = true;   // wide kernel: B read as one uint2 per chunk pair
    __device__ static __forceinline__ void chunk_scales(const uint8_t* blk, int c, float& x,
                                                        float& y) {
        const uint4 h = __ldg((const uint4*)blk);
        const float d = mmq_h2f(h.x), dmin = mmq_h2f(h.x >> 16);
        int sc, m;
        q4k_scale_min(c, h.y, h.z, h.w, sc, m);
        x = d * (float)sc;          // exact: 11-bit d times 6-bit sc
        y = -(dmin * (float)m);
    }
    __device__ static __forceinline__ void b_natural(const uint8_t* blk, int c, int t,
                                                     uint32_t& b0, uint32_t& b1) {
        const uint8_t* q = blk + 16 + 32 * (c >> 1) + 4 * t;
        const int sh = 4 * (c & 1);
        b0 = (__ldg((const uint32_t*)q) >> sh) & 0x0F0F0F0Fu;
        b1 = (__ldg((const uint32_t*)(q + 16)) >> sh) & 0x0F0F0F0Fu;
    }
};

struct W_Q6K {
    static constexpr int BYTES = 210;
    static constexpr bool TWO_HALVES = true;
    static constexpr bool PERM = false;  // k16 halves must stay in natural k order
    __device__ static __forceinline__ void chunk_scales(const uint8_t* blk, int c, float& x,
                                                        float& y) {
        const float d = mmq_h2f(__ldg((const uint16_t*)(blk + 208)));
        const uint32_t s = __ldg((const uint16_t*)(blk + 192 + 2 * c));   // sc[2c], sc[2c+1]
        x = d * (float)(int8_t)(s & 0xFF);
        y = d * (float)(int8_t)(s >> 8);
    }
    __device__ static __forceinline__ void b_natural(const uint8_t* blk, int c, int t,
                                                     uint32_t& b0, uint32_t& b1) {
        const int n = c >> 2, cc = c & 3;
        const uint8_t* ql = blk + 64 * n + 32 * (cc & 1) + 4 * t;
        const uint8_t* qh = blk + 128 + 32 * n + 4 * t;
        const int sl = 4 * (cc >> 1), sh = 2 * cc;
        b0 = q6_minus32(((ld_u32_a2(ql) >> sl) & 0x0F0F0F0Fu) |
                        (((ld_u32_a2(qh) >> sh) & 0x03030303u) << 4));
        b1 = q6_minus32(((ld_u32_a2(ql + 16) >> sl) & 0x0F0F0F0Fu) |
                        (((ld_u32_a2(qh + 16) >> sh) & 0x03030303u) << 4));
    }
};

// base + row * pitch (row, pitch < 2^32) as one mad.wide.u32 per use. The wide kernels form
// 64-bit row addresses from 32-bit row indices with this, inside their k loops, on a base that
// changes per iteration: as plain C, the loop-invariant row * pitch products are hoisted out of
// the k loop and held as 64-bit values (two registers each) across the chunk loop, which then
// spills at the 255-register cap (ptxas, sm_90). The asm takes the per-iteration base as the
// addend, so it cannot be hoisted; it costs one IMAD.WIDE.U32 per use.
__device__ __forceinline__ const uint8_t* row_ptr(const uint8_t* base, uint32_t row,
                                                  uint32_t pitch) {
    uint64_t r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(row), "r"(pitch), "l"(base));
    return (const uint8_t*)r;
}

__device__ __forceinline__ void mmq_store(float* C, int M, int N, int row, int col, float v,
                                          int accumulate) {
    if (row < M && col < N) {
        float* p = C + (size_t)row * N + col;
        *p = accumulate ? *p + v : v;
    }
}

// --------------------------------------------------------------------------------------------
// Narrow kernel (and R1 with LEGACY): block = 4 warps along N, block tile 32 tokens x 64 rows;
// warp tile 32 x 16 = 2 A-frags (h) x 2 B-frags (nb). Thread (g = lane>>2, t = lane&3) owns
// token rows m0 + g + 8*q, q = h*2 + (l>>1) in 0..3, and weight columns nb*8 + 2t + (l&1).
// --------------------------------------------------------------------------------------------
template <class W, bool LEGACY>
__device__ __forceinline__ void mmq_narrow(const uint8_t* __restrict__ A,
                                           const uint8_t* __restrict__ B, float* C, int M,
                                           int N, int K, int accumulate) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * 32, nw = blockIdx.x * 64 + warp * 16;
    const int KB = K / 256;
    const size_t arow = (size_t)(K / 32) * 40, brow = (size_t)KB * W::BYTES;
    const uint8_t* ap[4];
    #pragma unroll
    for (int q = 0; q < 4; q++) ap[q] = A + (size_t)min(m0 + g + 8 * q, M - 1) * arow;
    const uint8_t* bp[2];      // B fragment rows (col g of each n8 tile)
    const uint8_t* sp[2][2];   // scale rows: the thread's C columns 2t, 2t+1
    #pragma unroll
    for (int nb = 0; nb < 2; nb++) {
        bp[nb] = B + (size_t)min(nw + nb * 8 + g, N - 1) * brow;
        #pragma unroll
        for (int e = 0; e < 2; e++) sp[nb][e] = B + (size_t)min(nw + nb * 8 + 2 * t + e, N - 1) * brow;
    }
    float sum[2][2][4] = {};
    for (int kb = 0; kb < KB; kb++) {
        #pragma unroll 2
        for (int c = 0; c < 8; c++) {
            const int ch = kb * 8 + c;
            float da[4], dma[4];
            int sa[4];
            uint32_t a[2][4];
            #pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint8_t* at = ap[q] + (size_t)ch * 40;
                da[q] = mmq_h2f(__ldg((const uint16_t*)at));        // f16 d @ +0
                sa[q] = __ldg((const int*)(at + 36));               // int s @ +36
                dma[q] = da[q] * (float)sa[q];                      // r16 fold, per row
                // a0/a1: rows g, g+8 of A-frag h at k 4t..; a2/a3: k 16+4t..
                a[q >> 1][(q & 1)] = __ldg((const uint32_t*)(at + 4 + 4 * t));
                a[q >> 1][2 + (q & 1)] = __ldg((const uint32_t*)(at + 20 + 4 * t));
            }
            float sx[2][2], sy[2][2];
            uint32_t b[2][2];
            #pragma unroll
            for (int nb = 0; nb < 2; nb++) {
                W::b_natural(bp[nb] + (size_t)kb * W::BYTES, c, t, b[nb][0], b[nb][1]);
                #pragma unroll
                for (int e = 0; e < 2; e++)
                    W::chunk_scales(sp[nb][e] + (size_t)kb * W::BYTES, c, sx[nb][e], sy[nb][e]);
            }
            #pragma unroll
            for (int h = 0; h < 2; h++)
                #pragma unroll
                for (int nb = 0; nb < 2; nb++) {
                    if constexpr (!W::TWO_HALVES) {
                        int acc[4];
                        mma_k32(acc, a[h], b[nb][0], b[nb][1], LEGACY ? 0 : MMQ_MAGIC_I);
                        #pragma unroll
                        for (int l = 0; l < 4; l++) {
                            const int q = h * 2 + (l >> 1);   // row g + 8q
                            const float dsv = sx[nb][l & 1], dmv = sy[nb][l & 1];
                            if constexpr (LEGACY) {        // R1: pre-fold epilogue, I2F
                                sum[h][nb][l] += da[q] * dsv * (float)acc[l];
                                sum[h][nb][l] += da[q] * dmv * (float)sa[q];
                            } else {
                                const float s1 = fmaf(dsv, __int_as_float(acc[l]), -MMQ_MAGIC_F * dsv);
                                sum[h][nb][l] = fmaf(da[q], s1, sum[h][nb][l]);
                                sum[h][nb][l] = fmaf(dma[q], dmv, sum[h][nb][l]);
                            }
                        }
                    } else {
                        int lo[4], hi[4];
                        mma_k16(lo, a[h][0], a[h][1], b[nb][0], LEGACY ? 0 : MMQ_MAGIC_I);
                        mma_k16(hi, a[h][2], a[h][3], b[nb][1], LEGACY ? 0 : MMQ_MAGIC_I);
                        #pragma unroll
                        for (int l = 0; l < 4; l++) {
                            const int q = h * 2 + (l >> 1);
                            const float d0 = sx[nb][l & 1], d1 = sy[nb][l & 1];
                            if constexpr (LEGACY) {
                                sum[h][nb][l] += da[q] * (d0 * (float)lo[l] + d1 * (float)hi[l]);
                            } else {
                                const float s1 = fmaf(d0, __int_as_float(lo[l]), -MMQ_MAGIC_F * d0) +
                                                 fmaf(d1, __int_as_float(hi[l]), -MMQ_MAGIC_F * d1);
                                sum[h][nb][l] = fmaf(da[q], s1, sum[h][nb][l]);
                            }
                        }
                    }
                }
        }
    }
    #pragma unroll
    for (int h = 0; h < 2; h++)
        #pragma unroll
        for (int nb = 0; nb < 2; nb++)
            #pragma unroll
            for (int l = 0; l < 4; l++)
                mmq_store(C, M, N, m0 + g + 8 * (h * 2 + (l >> 1)), nw + nb * 8 + 2 * t + (l & 1),
                          sum[h][nb][l], accumulate);
}
