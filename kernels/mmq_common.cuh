// mmq_common.cuh: shared pieces of the int8 tensor-core MMQ kernels (mmq_q4k.cu, mmq_q6k.cu).
//
// C[M, N] (f32, row-major) = A[M, K] x W[N, K]^T with A = q8_1 raw activation blocks (40 B per
// 32 values: f16 d @+0, int8 q[32] @+4, int32 s @+36) and W = raw GGUF k-quant blocks. All
// products run on mma.sync m16n8k32 (m16n8k16 halves for q6_K) .s32.s8.s8.s32; the f32 rescale
// per 32-chunk happens in registers (docs/mmq.md has the math and the C-fragment row maps).
//
// The template kernels here are instantiated by the .cu files with a weight-traits struct W:
//   mmq_narrow<W, LEGACY>  no shared memory; 4 token rows per thread (rows g + 8*q, q = 0..3);
//                          LEGACY=true is the R1 word-level path (I2F + pre-fold epilogue).
//   mmq_wide<W, KD>        A staged in shared memory (KD super-blocks of 256 per pass),
//                          ldmatrix.x4 A fragments, (d, s) token pairs as uint2, 16-chain warp
//                          tile (4 A-frags x 4 B-frags = 64 tokens x 32 weight rows per warp).
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

// --------------------------------------------------------------------------------------------
// Wide kernel: block = 4 warps along N, block tile 64 tokens x 128 weight rows; warp tile
// 64 x 32 = 4 A-frags (f) x 4 B-frags (nb), 16 independent mma chains.
// Shared memory (dynamic, bytes):
//   sA  [64][KD*256 + 16] int8   q of KD super-blocks (row pitch = 16 mod 128: ldmatrix rows
//                                land in 8 distinct 16-B bank groups)
//   sDS [KD*8][32] uint2         (d, s) of the token pair (g, g+8) of A-frag f at [kc][f*8+g]
//   sSC [4 warps][8][32] float2  per-warp scales of the current super-block [chunk][row]
// B fragments are read straight from global memory by the warp that uses them (no sharing).
// With W::PERM the k order inside a 32-chunk is permuted (the same on A and B): mma k 4t+e <->
// value 8t+e, k 16+4t+e <-> value 8t+4+e, so one uint2 load at qs + 32j + 8t holds a thread's
// b0 and b1 for both chunks 2j (low nibbles) and 2j+1 (high nibbles).
// --------------------------------------------------------------------------------------------
// base + row * pitch (row, pitch < 2^32) as one mad.wide.u32 per use. The wide kernel keeps its
// B rows as 32-bit indices and forms the 64-bit row addresses per super-block with this: as
// plain C, the loop-invariant row * pitch would be hoisted out of the k loop and held as five
// 64-bit values (10 registers) across the 16-chain chunk loop, which then spills at the
// 255-register cap (ptxas, sm_90). The asm takes the per-super-block base as the addend, so
// it cannot be hoisted; it costs one IMAD.WIDE.U32 per row and super-block.
__device__ __forceinline__ const uint8_t* row_ptr(const uint8_t* base, uint32_t row,
                                                  uint32_t pitch) {
    uint64_t r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(row), "r"(pitch), "l"(base));
    return (const uint8_t*)r;
}

template <int KD>
struct WideSmem {
    static constexpr int PITCH = KD * 256 + 16;
    static constexpr int A_BYTES = 64 * PITCH;
    static constexpr int DS_BYTES = KD * 8 * 32 * 8;
    static constexpr int SC_BYTES = 4 * 8 * 32 * 8;
    static constexpr int BYTES = A_BYTES + DS_BYTES + SC_BYTES;
};
static_assert(WideSmem<4>::BYTES == 82944, "wide KD=4 smem");
static_assert(WideSmem<8>::BYTES == 156672, "wide KD=8 smem");
static_assert(WideSmem<4>::PITCH % 128 == 16 && WideSmem<8>::PITCH % 128 == 16, "ldmatrix pitch");

template <class W, int KD>
__device__ __forceinline__ void mmq_wide(const uint8_t* __restrict__ A,
                                         const uint8_t* __restrict__ B, float* C, int M, int N,
                                         int K, int accumulate) {
    using S = WideSmem<KD>;
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* sA = smem;
    uint2* sDS = (uint2*)(smem + S::A_BYTES);
    float2* sSC = (float2*)(smem + S::A_BYTES + S::DS_BYTES) + (threadIdx.x >> 5) * 256;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * 64, nw = blockIdx.x * 128 + warp * 32;
    const int KB = K / 256;
    const size_t arow = (size_t)(K / 32) * 40, brow = (size_t)KB * W::BYTES;
    // B rows as 32-bit indices (addresses via row_ptr per super-block: register cap)
    const uint32_t bpitch = (uint32_t)brow;   // K < 2^31, so K/256 * 210 < 2^32
    uint32_t brw[4];                          // B fragment rows (col g of each n8 tile)
    #pragma unroll
    for (int nb = 0; nb < 4; nb++) brw[nb] = min(nw + nb * 8 + g, N - 1);
    const uint32_t srw = min(nw + lane, N - 1);   // this lane's scale row

    float sum[4][4][4] = {};
    for (int kb0 = 0; kb0 < KB; kb0 += KD) {
        const int nkb = min(KD, KB - kb0), nch = nkb * 8;
        __syncthreads();   // previous pass done with sA/sDS
        for (int idx = tid; idx < 64 * nch; idx += 128) {
            const int r = idx / nch, kc = idx - r * nch;
            uint2 w[5] = {};
            if (m0 + r < M) {
                const uint2* src = (const uint2*)(A + (size_t)(m0 + r) * arow + (size_t)(kb0 * 8 + kc) * 40);
                #pragma unroll
                for (int i = 0; i < 5; i++) w[i] = __ldg(src + i);
            }
            // 40 B as words: w0 = d|pad, w1..w8 = q words 0..7, w9 = s
            const uint32_t qw[8] = {w[0].y, w[1].x, w[1].y, w[2].x, w[2].y, w[3].x, w[3].y, w[4].x};
            uint4* dst = (uint4*)(sA + r * S::PITCH + kc * 32);
            if constexpr (W::PERM) {
                dst[0] = make_uint4(qw[0], qw[2], qw[4], qw[6]);
                dst[1] = make_uint4(qw[1], qw[3], qw[5], qw[7]);
            } else {
                dst[0] = make_uint4(qw[0], qw[1], qw[2], qw[3]);
                dst[1] = make_uint4(qw[4], qw[5], qw[6], qw[7]);
            }
            // |s| <= 32*127 = 4064: fits the int16 half
            const uint32_t ds = (w[0].x & 0xFFFFu) | ((uint32_t)w[4].y << 16);
            ((uint32_t*)sDS)[2 * (kc * 32 + (r >> 4) * 8 + (r & 7)) + ((r >> 3) & 1)] = ds;
        }
        __syncthreads();
        for (int kbi = 0; kbi < nkb; kbi++) {
            const int kb = kb0 + kbi;
            const uint8_t* Bk = B + (size_t)kb * W::BYTES;   // super-block kb of row 0
            const uint8_t* scp = row_ptr(Bk, srw, bpitch);
            // B fragments of this super-block, straight from global memory
            uint32_t bq[4][W::PERM ? 8 : 12];
            #pragma unroll
            for (int nb = 0; nb < 4; nb++) {
                const uint8_t* blk = row_ptr(Bk, brw[nb], bpitch);
                if constexpr (W::PERM) {
                    // one uint2 per chunk pair j: b0, b1 of chunks 2j (low) and 2j+1 (high)
                    #pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint2 v = __ldg((const uint2*)(blk + 16 + 32 * j + 8 * t));
                        bq[nb][2 * j] = v.x;
                        bq[nb][2 * j + 1] = v.y;
                    }
                } else {   // q6_K: ql words [n][odd][hi16], qh words [n][hi16]
                    #pragma unroll
                    for (int n = 0; n < 2; n++) {
                        #pragma unroll
                        for (int o = 0; o < 2; o++)
                            #pragma unroll
                            for (int h = 0; h < 2; h++)
                                bq[nb][n * 4 + o * 2 + h] = ld_u32_a2(blk + 64 * n + 32 * o + 16 * h + 4 * t);
                        #pragma unroll
                        for (int h = 0; h < 2; h++)
                            bq[nb][8 + n * 2 + h] = ld_u32_a2(blk + 128 + 32 * n + 16 * h + 4 * t);
                    }
                }
            }
            // this lane's row scales for the 8 chunks -> sSC[c][lane]
            __syncwarp();
            #pragma unroll
            for (int c = 0; c < 8; c++) {
                float x, y;
                W::chunk_scales(scp, c, x, y);
                sSC[c * 32 + lane] = make_float2(x, y);
            }
            __syncwarp();
            #pragma unroll   // full: c indexes the B register arrays
            for (int c = 0; c < 8; c++) {
                const int kc = kbi * 8 + c;
                float da[4][2], dma[4][2];
                #pragma unroll
                for (int f = 0; f < 4; f++) {
                    const uint2 pk = sDS[kc * 32 + f * 8 + g];   // rows f*16+g, f*16+g+8
                    da[f][0] = mmq_h2f(pk.x);
                    da[f][1] = mmq_h2f(pk.y);
                    dma[f][0] = da[f][0] * (float)(int)(short)(pk.x >> 16);   // r15 fold
                    dma[f][1] = da[f][1] * (float)(int)(short)(pk.y >> 16);
                }
                float sx[4][2], sy[4][2];
                #pragma unroll
                for (int nb = 0; nb < 4; nb++) {
                    const float4 v = *(const float4*)(sSC + c * 32 + nb * 8 + 2 * t);
                    sx[nb][0] = v.x; sy[nb][0] = v.y; sx[nb][1] = v.z; sy[nb][1] = v.w;
                }
                uint32_t b[4][2];
                #pragma unroll
                for (int nb = 0; nb < 4; nb++) {
                    if constexpr (W::PERM) {
                        const int sh = 4 * (c & 1);
                        b[nb][0] = (bq[nb][2 * (c >> 1)] >> sh) & 0x0F0F0F0Fu;
                        b[nb][1] = (bq[nb][2 * (c >> 1) + 1] >> sh) & 0x0F0F0F0Fu;
                    } else {
                        const int n = c >> 2, cc = c & 3, sl = 4 * (cc >> 1), shh = 2 * cc;
                        #pragma unroll
                        for (int h = 0; h < 2; h++)
                            b[nb][h] = q6_minus32(((bq[nb][n * 4 + (cc & 1) * 2 + h] >> sl) & 0x0F0F0F0Fu) |
                                                  (((bq[nb][8 + n * 2 + h] >> shh) & 0x03030303u) << 4));
                    }
                }
                #pragma unroll
                for (int f = 0; f < 4; f++) {
                    uint32_t a[4];
                    ldmatrix_x4(a, sA + (f * 16 + (lane & 15)) * S::PITCH + kc * 32 + (lane >> 4) * 16);
                    #pragma unroll
                    for (int nb = 0; nb < 4; nb++) {
                        if constexpr (!W::TWO_HALVES) {
                            int acc[4];
                            mma_k32(acc, a, b[nb][0], b[nb][1], MMQ_MAGIC_I);
                            #pragma unroll
                            for (int l = 0; l < 4; l++) {   // C row f*16 + g + 8*(l>>1), col nb*8 + 2t + (l&1)
                                const float dsv = sx[nb][l & 1];
                                const float s1 = fmaf(dsv, __int_as_float(acc[l]), -MMQ_MAGIC_F * dsv);
                                sum[f][nb][l] = fmaf(da[f][l >> 1], s1, sum[f][nb][l]);
                                sum[f][nb][l] = fmaf(dma[f][l >> 1], sy[nb][l & 1], sum[f][nb][l]);
                            }
                        } else {
                            int lo[4], hi[4];
                            mma_k16(lo, a[0], a[1], b[nb][0], MMQ_MAGIC_I);
                            mma_k16(hi, a[2], a[3], b[nb][1], MMQ_MAGIC_I);
                            #pragma unroll
                            for (int l = 0; l < 4; l++) {
                                const float d0 = sx[nb][l & 1], d1 = sy[nb][l & 1];
                                const float s1 = fmaf(d0, __int_as_float(lo[l]), -MMQ_MAGIC_F * d0) +
                                                 fmaf(d1, __int_as_float(hi[l]), -MMQ_MAGIC_F * d1);
                                sum[f][nb][l] = fmaf(da[f][l >> 1], s1, sum[f][nb][l]);
                            }
                        }
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int f = 0; f < 4; f++)
        #pragma unroll
        for (int nb = 0; nb < 4; nb++)
            #pragma unroll
            for (int l = 0; l < 4; l++)
                mmq_store(C, M, N, m0 + f * 16 + g + 8 * (l >> 1), nw + nb * 8 + 2 * t + (l & 1),
                          sum[f][nb][l], accumulate);
}
