// mmq_wide_sync.cuh: the synchronous wide MMQ kernel, used for q6_K (mmq_q6k.cu).
// q6_K blocks are 210 B, so a weight row's blocks are only 2-byte aligned: cp.async (4/8/16 B)
// cannot stage them, and B comes from global memory into registers (16-bit loads). A is staged
// per pass of KD super-blocks through registers, between two __syncthreads.
#pragma once
#include "mmq_common.cuh"

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
template <int KD>
struct WideSyncSmem {
    static constexpr int PITCH = KD * 256 + 16;
    static constexpr int A_BYTES = 64 * PITCH;
    static constexpr int DS_BYTES = KD * 8 * 32 * 8;
    static constexpr int SC_BYTES = 4 * 8 * 32 * 8;
    static constexpr int BYTES = A_BYTES + DS_BYTES + SC_BYTES;
};
static_assert(WideSyncSmem<4>::BYTES == 82944, "wide KD=4 smem");
static_assert(WideSyncSmem<8>::BYTES == 156672, "wide KD=8 smem");
static_assert(WideSyncSmem<4>::PITCH % 128 == 16 && WideSyncSmem<8>::PITCH % 128 == 16, "ldmatrix pitch");

template <class W, int KD>
__device__ __forceinline__ void mmq_wide_sync(const uint8_t* __restrict__ A,
                                         const uint8_t* __restrict__ B, float* C, int M, int N,
                                         int K, int accumulate) {
    using S = WideSyncSmem<KD>;
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
