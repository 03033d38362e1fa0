// mmq_sb1_q4k.cu: C[M, N] f32 = q8s(A)[M, K] x q4_K(W)[N, K]^T on Hopper int8 tensor cores, one
// byte plane, the sub-scale folded per 32-chunk (wgmma m64n64k32 .s32.u8.u8, sm_90a only).
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// "SB1": the activations are the SB path's q8s (one scale da per token and 256 values,
// mmq_sb_q4k.cu), the weight one byte per value, v = the q4_K nibble. mmq_sb_q4k.cu folds the
// 6-bit sub-scale into two planes (twice the tensor work of one); here the tensor core sums
// each 32-chunk, S_c = sum_k (qa + 128) v (< 2^17: an f32 denormal), and one FFMA per C value
// and chunk carries it into a per-super-block sum with the row's scale, which one more FFMA
// per super-block scales by the token's da:
//   acc = fma(S_c, mc, acc)  (acc starting at the row's bias b), y = fma(acc, da 2^75, y)
//   mc = d sc_c 2^74, b = f32(-128 sum_c sc_c V_c) d 2^-75 (V_c: the chunk's sum of v)
// Per C value and super-block that is 9 FFMA against the two-plane kernel's 4, but half the
// tensor work and half the weight bytes: the FFMAs of one half tile run under the other half's
// wgmma. The min term sum_c (da sa_c) (-dmin m_c) is 3 tf32 wgmmas into y per super-block
// (3xTF32, as in mmq_sb_q4k.cu).
// Operands (quantize_q8_1.cu's quantize_q8s_split and mmq_repack.cu's repack_q4k_sb1 write
// them; numpy twins in minfer.quants.mmq_sb_ref):
//   Aq  uint8 [M, K]        qa + 128
//   Ta  float2 [K/32, Mp]   (da 2^75, da sa_c) per token and chunk; Mp = M rounded up to 128
//   Wq  uint8 [N, K]        v
//   Tw  one TBLK-byte block per (super-block sb, 128-row tile nt), at (sb Np/128 + nt) TBLK:
//       [mc of chunks 0..3 | b | mc of chunks 4..7 | Tm], mc and b f32 [128] in the fold's
//       order (row 8i + 2t + e at 16 (i / 2) + 4t + 2 (i % 2) + e: thread t's values of an
//       n8 group pair are one float4), Tm = -(dmin m_c) as tf32 (hi, lo) in mmq_sb_q4k.cu's
//       8 KB block layout. A super-block's first stage copies the first 2560 bytes, its second
//       the rest.
// Block: 2 warpgroups (256 threads, 1 block per SM), tile 128 tokens x 128 weight rows;
// warpgroup w owns tokens 64w..64w+63, its C values are an m64n128 fragment (y, acc: 64
// registers each) computed as two m64n64 halves (D0, D1: 32 each): per chunk the half-0 wgmma
// is issued, the previous chunk's half 1 folded, the half-1 wgmma issued, half 0 folded.
// Stages of 128 k (half a super-block) in a SB1_STAGES-slot cp.async ring (>= 4: at the top of
// stage kt the slot of kt-2 takes stage kt+2; kt-1's is still read by the pending half-1 fold).
// Persistent over work items in super-block units (wgmma_common.cuh TileSched, then stream-K).
// Dynamic smem Sb1Smem::BYTES.
// Entries: mmq_sb1_q4k (C =) and mmq_sb1_q4k_acc (C +=, reductions), both (Aq, Ta, Wq, Tw, C,
// M, N, K, dp, ws, flags); K % 256 == 0; dp, ws (float4 [gridDim][16][256]), flags as in
// mmq_wgmma_q4k.cu; every buffer under 2^31 B.
#include "gemm_f16_common.cuh"
#include "mmq_common.cuh"   // tf32_split
#include "wgmma_common.cuh"

#ifndef SB1_STAGES
#define SB1_STAGES 4
#endif

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

constexpr int BM = 128, BN = 128, BK = 128, KC = BK / 32, T = 256;   // tile, stage, chunks
constexpr int TPAD = 128;                                           // table row padding
constexpr int STAGES = SB1_STAGES;
constexpr int TBLK = 12800, TH0 = 2560;   // table block; its first stage's bytes
static_assert(STAGES >= 4, "the ring refills the slot of stage kt-2");
static_assert(TBLK == 2 * 4 * 512 + 512 + 8192 && TH0 == 4 * 512 + 512, "table block");

struct Sb1Smem {
    static constexpr int A = BM * BK, W = BN * BK, TA = KC * BM * 8;   // swizzled tiles, Ta
    static constexpr int TT = TBLK - TH0;      // tables: mc [4][128], then b or Tm
    static constexpr int TC = 4 * 512;         // offset of b / Tm in the tables
    static constexpr int STAGE = 48 * 1024;    // A + W + TA + TT = 47104, padded to 1 KB
    static constexpr int BYTES = STAGES * STAGE + 1024;   // + manual 1 KB alignment
};
static_assert(Sb1Smem::A + Sb1Smem::W + Sb1Smem::TA + Sb1Smem::TT <= Sb1Smem::STAGE, "stage");
static_assert(Sb1Smem::STAGE % 1024 == 0, "stages keep the swizzled tiles 1024-aligned");
static_assert(SB1_STAGES != 4 || Sb1Smem::BYTES == 197632, "sb1 smem");

// The block's cp.async copies of one stage, pieces of 16 B: A 128 rows x 8, Wq 128 rows x 8
// (rows past M / N zero-filled), Ta 4 runs of 128 x 8 B, and the stage's part of the table
// block (160 pieces on a super-block's first stage, 640 on its second). Per-thread 32-bit
// offsets.
struct Sb1Copier {
    using S = Sb1Smem;
    static constexpr int RS = T / 8, AI = BM / RS, WI = BN / RS;   // row step 32; 4 + 4 pieces
    uint32_t a, w, ta, tb, dst, mask;

    __device__ __forceinline__ Sb1Copier(int m0, int n0, int M, int N, int K, int Mp, int tid) {
        const int r = tid >> 3, c = tid & 7;
        dst = r * 128 + ((c ^ (r & 7)) << 4);
        a = (uint32_t)min(m0 + r, M - 1) * K + c * 16;
        w = (uint32_t)min(n0 + r, N - 1) * K + c * 16;
        mask = 0;
#pragma unroll
        for (int i = 0; i < AI; ++i) mask |= (m0 + r + RS * i < M ? 1u : 0u) << i;
#pragma unroll
        for (int i = 0; i < WI; ++i) mask |= (n0 + r + RS * i < N ? 1u : 0u) << (AI + i);
        ta = ((uint32_t)(tid >> 6) * Mp + m0) * 8 + (tid & 63) * 16;    // chunk tid/64, 128 x 8 B
        tb = (uint32_t)(n0 / 128) * TBLK + tid * 16;
    }

    // stage kt of the tile -> smem stage at sb, then commit
    __device__ __forceinline__ void issue(uint32_t sb, int kt, const uint8_t* Aq, const uint8_t* Ta,
                                          const uint8_t* Wq, const uint8_t* Tw, int K, int Mp,
                                          int Np, int tid) const {
        const uint32_t k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < AI; ++i)
            cp_async16(sb + dst + i * RS * 128, Aq + (a + i * RS * K + k0), (mask >> i) & 1);
#pragma unroll
        for (int i = 0; i < WI; ++i)
            cp_async16(sb + S::A + dst + i * RS * 128, Wq + (w + i * RS * K + k0),
                       (mask >> (AI + i)) & 1);
        cp_async16(sb + S::A + S::W + tid * 16, Ta + (ta + kt * (uint32_t)(KC * Mp * 8)), true);
        const uint32_t st = sb + S::A + S::W + S::TA + tid * 16;
        const uint8_t* src = Tw + (tb + (uint32_t)(kt >> 1) * (Np / 128) * TBLK);
        if (kt & 1) {   // bytes [TH0, TBLK): mc of chunks 4..7, Tm
#pragma unroll
            for (int i = 0; i < 2; ++i) cp_async16(st + i * T * 16, src + TH0 + i * T * 16, true);
            if (tid < (TBLK - TH0) / 16 - 2 * T)
                cp_async16(st + 2 * T * 16, src + TH0 + 2 * T * 16, true);
        } else if (tid < TH0 / 16) {   // bytes [0, TH0): mc of chunks 0..3, b
            cp_async16(st, src, true);
        }
        gemm_f16::cp_async_commit();
    }
};

// z[4i + j] (i the n8 group) += S (d: the chunk's m64n128 s32 fragment, read as f32
// denormals) * mc of its column; m: the thread's mc (`load_mc`, loaded before the wgmma wait
// so that the LDS latency hides under it)
__device__ __forceinline__ void load_mc(float4 (&m)[8], const float4* mc, int t) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {   // the n8 groups 2p, 2p+1
#ifdef SB1_NO_MC   // timing only: what the kernel costs without the multiplier loads
        m[p] = make_float4(1.f + t, 2.f, 3.f, 4.f + p);
#else
        m[p] = mc[p * 4 + t];
#endif
    }
}
__device__ __forceinline__ void fold(float (&z)[64], const int (&d)[64], const float4 (&m)[8]) {
#pragma unroll
    for (int p = 0; p < 8; ++p)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = 4 * (2 * p + e) + j;
                const float mv = e ? ((j & 1) ? m[p].w : m[p].z) : ((j & 1) ? m[p].y : m[p].x);
                z[k] = fmaf(__int_as_float(d[k]), mv, z[k]);
            }
}

// a new super-block for half H: z = z * r + b (r: the token row's da ratio, b: the column's bias)
template <int H>
__device__ __forceinline__ void rescale(float (&z)[64], const float4* b, float r0, float r8, int t) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const float4 v = b[(4 * H + p) * 4 + t];
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = 32 * H + 4 * (2 * p + e) + j;
                const float bv = e ? ((j & 1) ? v.w : v.z) : ((j & 1) ? v.y : v.x);
                z[k] = fmaf(z[k], (j & 2) ? r8 : r0, bv);
            }
    }
}

template <bool RED>
__device__ __forceinline__ void mmq_sb1_body(const uint8_t* __restrict__ Aq,
                                             const uint8_t* __restrict__ Ta,
                                             const uint8_t* __restrict__ Wq,
                                             const uint8_t* __restrict__ Tw, float* C, int M,
                                             int N, int K, int dp, float4* ws, int* flags) {
    constexpr int NI = BN / 8;   // n8 fragments per thread row pair
    using S = Sb1Smem;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sbase = smem_raw + (base - raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int mtiles = (M + BM - 1) / BM, ntiles = mtiles * ((N + BN - 1) / BN);
    const int Mp = (M + TPAD - 1) / TPAD * TPAD, Np = (N + TPAD - 1) / TPAD * TPAD;
    const int KS = K / 256;                          // super-blocks: the schedule's units
    const int rl = wg * 64 + (warp & 3) * 16 + g;    // this thread's first token row in the tile

    // z: the C values in units of the current super-block's da 2^75 of their token row (dc0,
    // dc8), so that a chunk's fold needs only the column's factor: y = z * dc at the end
    float z[NI * 4];
    int da[NI * 4] = {}, db[NI * 4] = {};

    wgmma::TileSched sched{ntiles, dp, KS, 0};
    wgmma::Work w;
    if (!sched.next(w)) return;
    int m0 = (w.tile % mtiles) * BM, n0 = (w.tile / mtiles) * BN;
    Sb1Copier cp(m0, n0, M, N, K, Mp, tid);
    cp.issue(base + ((2 * w.k0) % STAGES) * S::STAGE, 2 * w.k0, Aq, Ta, Wq, Tw, K, Mp, Np, tid);
    cp.issue(base + ((2 * w.k0 + 1) % STAGES) * S::STAGE, 2 * w.k0 + 1, Aq, Ta, Wq, Tw, K, Mp, Np, tid);
    while (true) {
#pragma unroll
        for (int i = 0; i < NI * 4; ++i) z[i] = 0.f;
        float dc0 = 1.f, dc8 = 1.f;
        for (int sbk = w.k0; sbk < w.k1; ++sbk)   // super-blocks; their two stages unrolled
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int kt = 2 * sbk + h;
            // stage kt landed (kt+1 may be in flight) and is visible to the wgmmas; every warp
            // is past stage kt-2, so its slot takes stage kt+2
            gemm_f16::cp_async_wait<1>();
            wgmma::fence_proxy_async();
            __syncthreads();
            if (kt + 2 < 2 * w.k1)
                cp.issue(base + ((kt + 2) % STAGES) * S::STAGE, kt + 2, Aq, Ta, Wq, Tw, K, Mp, Np, tid);
            else
                gemm_f16::cp_async_commit();
            const uint32_t so = base + (kt % STAGES) * S::STAGE;
            const uint32_t sa = so + wg * 64 * 128, sw = so + S::A;
            const uint8_t* st = sbase + (kt % STAGES) * S::STAGE;
            const uint8_t* stp = sbase + ((kt + STAGES - 1) % STAGES) * S::STAGE;   // stage kt-1
            const float2* ta = reinterpret_cast<const float2*>(st + S::A + S::W);
            const float4* mc = reinterpret_cast<const float4*>(st + S::A + S::W + S::TA);
            const float4* mcp = reinterpret_cast<const float4*>(stp + S::A + S::W + S::TA);
            const uint32_t tm = so + S::A + S::W + S::TA + S::TC;   // (second stage: Tm)
            float r0 = 1.f, r8 = 1.f;
            if (h == 0) {   // the super-block's da: z's new unit (an all-zero block keeps the old)
                const float n0 = ta[rl].x, n8 = ta[rl + 8].x;
                if (n0 != 0.f) { r0 = dc0 / n0; dc0 = n0; }
                if (n8 != 0.f) { r8 = dc8 / n8; dc8 = n8; }
            }
            // On a super-block's second stage its min term, z[r][n] += sum_c (sa_c 2^-75)[r]
            // dmv[c][n] over the 8 chunks (0..3 in stage kt-1's Ta, 4..7 in this one), A from
            // registers (Ta's da sa_c over z's unit), B = the Tm block: each half's tf32 wgmmas
            // join the group of chunk 0's wgmma of the same half, whose wait precedes the next
            // fold of that half (the other half's fold runs meanwhile).
            uint32_t ah[4], al[4];
            if (h == 1) {
                const float2* tp = reinterpret_cast<const float2*>(stp + S::A + S::W);
                const float i0 = 1.f / dc0, i8 = 1.f / dc8;
                tf32_split(tp[t * BM + rl].y * i0, ah[0], al[0]);
                tf32_split(tp[t * BM + rl + 8].y * i8, ah[1], al[1]);
                tf32_split(ta[t * BM + rl].y * i0, ah[2], al[2]);
                tf32_split(ta[t * BM + rl + 8].y * i8, ah[3], al[3]);
            }
            // chunk q's sums go to buffer q % 2; the schedule keeps the next chunk's wgmma in
            // flight under each fold: stage 0 issues chunks 0..3 and folds 0..2, stage 1
            // issues 4..7 and folds 3..7 (chunk 3 from stage kt-1's slot)
            if (h == 0) {
                rescale<1>(z, mc + S::TC / 16, r0, r8, t);
                rescale<0>(z, mc + S::TC / 16, r0, r8, t);
                wgmma::fence();
                wgmma::igmma_m64n128k32(da, wgmma::sw128_desc(sa), wgmma::sw128_desc(sw), 0);
                wgmma::commit();
            }
#pragma unroll
            for (int c = h == 0 ? 1 : 0; c < KC; ++c) {
                const int q = 4 * h + c;   // the chunk issued (its super-block index)
                wgmma::fence();
                wgmma::igmma_m64n128k32(q & 1 ? db : da, wgmma::sw128_desc(sa + c * 32),
                                        wgmma::sw128_desc(sw + c * 32), 0);
                wgmma::commit();
                float4 m[8];
                load_mc(m, c == 0 ? mcp + 3 * 32 : mc + (c - 1) * 32, t);
                wgmma::wait<1>();   // chunk q-1
                if (q & 1) {
                    wgmma::fence_regs(da);
                    fold(z, da, m);
                } else {
                    wgmma::fence_regs(db);
                    fold(z, db, m);
                }
            }
            if (h == 1) {   // the min term, then chunk 7: nothing in flight across the loop edge
                            // (ptxas would serialize every wgmma)
                wgmma::fence();
                wgmma::tgmma_m64n128k8(z, ah, wgmma::plain_desc(tm, 128, 256));
                wgmma::tgmma_m64n128k8(z, ah, wgmma::plain_desc(tm + 4096, 128, 256));
                wgmma::tgmma_m64n128k8(z, al, wgmma::plain_desc(tm, 128, 256));
                wgmma::commit();
                float4 m[8];
                load_mc(m, mc + 3 * 32, t);
                wgmma::wait<0>();
                wgmma::fence_regs(db);
                wgmma::fence_regs(z);
                fold(z, db, m);
            }
        }
        // y = z * dc
#pragma unroll
        for (int k = 0; k < NI * 4; ++k) z[k] *= (k & 2) ? dc8 : dc0;
        const wgmma::Work cur = w;
        const int sm0 = (cur.tile % mtiles) * BM, sn0 = (cur.tile / mtiles) * BN;
        const bool more = sched.next(w);
        __syncthreads();   // every warp is done with the stages
        if (more) {
            m0 = (w.tile % mtiles) * BM;
            n0 = (w.tile / mtiles) * BN;
            cp = Sb1Copier(m0, n0, M, N, K, Mp, tid);
            cp.issue(base + ((2 * w.k0) % STAGES) * S::STAGE, 2 * w.k0, Aq, Ta, Wq, Tw, K, Mp, Np, tid);
            cp.issue(base + ((2 * w.k0 + 1) % STAGES) * S::STAGE, 2 * w.k0 + 1, Aq, Ta, Wq, Tw, K, Mp, Np, tid);
        }
        // a stream-K tail publishes its sums, a head adds its tail's; then the stores
        wgmma::finish_item<NI, T, RED>(cur, KS, z, C, M, N, sm0 + rl, sn0 + 2 * t, ws, flags);
        if (!more) break;
    }
    gemm_f16::cp_async_wait<0>();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb1_q4k(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
            const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M, int N,
            int K, int dp, float4* ws, int* flags) {
    mmq_sb1_body<false>(Aq, Ta, Wq, Tw, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb1_q4k_acc(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
                const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M,
                int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb1_body<true>(Aq, Ta, Wq, Tw, C, M, N, K, dp, ws, flags);
}
