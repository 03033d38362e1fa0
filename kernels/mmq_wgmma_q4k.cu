// mmq_wgmma_q4k.cu: C[M, N] f32 = q8_1(A)[M, K] x q4_K(W)[N, K]^T on Hopper int8 tensor cores
// (wgmma m64nNk32 .s32.u8.u8, sm_90a only): the MMQ math of mmq_q4k.cu, re-laid for wgmma.
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
//
// Per 32-chunk c: y += da*(dsv*S) + dma*dmv with S = sum_k qa*v (minfer.quants.mmq_ref). The
// operands come in layouts a wgmma can read, made once per tensor / per prepass:
//   Aq  uint8 [M, K]          qa + 128 (so every product and sum is unsigned)
//   Ta  float2 [K/32, Mp]     (da * 2^75, dma = da*sa) per token and chunk, Mp = M rounded up to 128
//   Wq  uint8 [N, K]          the q4_K nibbles v, one per byte (natural k order)
//   Tw  [Tb | Tm]             the weight tables, one buffer: Tb float2 [K/32, Np] =
//                             (dsv * 2^74, -128*V*dsv * 2^-75), V = sum of the chunk's v; Tm
//                             uint2 [K/32, Np] = dmv = -(dmin*m) as tf32 (hi, lo); Np = N
//                             rounded up to 128
// (quantize_q8_1.cu's quantize_q8_1_split writes Aq/Ta; mmq_repack.cu's repack_q4k_wgmma
// writes Wq/Tw; numpy twins in minfer.quants.mmq_wgmma_ref.)
//
// Epilogue (2 FFMA per C value and chunk, no conversion): the wgmma result D = S + 128*V is
// >= 0 and < 2^23, so its bits read as the f32 denormal D * 2^-149 (FFMA keeps denormals:
// built without -ftz). t = fma(D*2^-149, dsv*2^74, -128*V*dsv*2^-75) = S*dsv*2^-75 (one
// rounding), then y = fma(t, da*2^75, y). The min term sum_c dma*dmv is a [128 x 4] x [4 x 64]
// product per warpgroup and stage, on tf32 mma.sync m16n8k4 (3xTF32: hi*hi + hi*lo + lo*hi)
// straight into y: a wgmma accumulator's per-warp fragment is the m16n8 C fragment.
//
// Block: 2 warpgroups (256 threads, 1 block per SM at ~254 registers), tile 128 tokens x 128
// weight rows; warpgroup w owns weight rows 64w..64w+63 and all 128 tokens as two m64 halves
// (mmq_wgmma_body); stages of BK = 128 k (4 chunks) filled by 16-byte cp.async STAGES-1 ahead,
// A and B in the 128-byte swizzle (wgmma_common.cuh). Per chunk and m64 half: wgmma, then the
// epilogue of the previous group while it runs (wait_group 1). Tiles in M-fastest order (the
// blocks sharing a weight tile run together); persistent: the launcher's grid is at most one
// block per SM, each block walks its work items (wgmma_common.cuh TileSched: whole waves of
// tiles round-robin, then the last 1-2 waves' tiles split by k-stages, stream-K, with the
// partial sums of a split tile added through the workspace `ws` / `flags`) and issues the next
// item's first stages before storing the current one. Dynamic smem WgSmem<BN, STAGES>::BYTES.
// Entries: mmq_wgmma_q4k / mmq_wgmma_q4k_acc(Aq, Ta, Wq, Tw, C, M, N, K, accumulate, dp, ws,
// flags), C = (or +=) with C += as a load-add-store / as reductions (the launcher: C = on the
// first, C += on the second; see their comment); K % 128 == 0,
// dp = the tiles run data-parallel (ntiles: no stream-K; ws / flags may then be null), ws
// float4 [gridDim][16][256], flags int32 [gridDim] zeroed once; every buffer under 2^31 B.
#include "gemm_f16_common.cuh"
#include "mmq_common.cuh"   // tf32_split
#include "wgmma_common.cuh"

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

constexpr int BM = 128, BK = 128, KC = BK / 32;  // tokens per block, k per stage, chunks per stage
constexpr int TPAD = 128;                         // table row padding (Mp, Np multiples of it)

template <int BN, int STAGES>
struct WgSmem {
    static constexpr int A = BM * BK, B = BN * BK;                // swizzled operand tiles
    static constexpr int TA = KC * BM * 8, TB = KC * BN * 8, TM = KC * BN * 8;
    static constexpr int STAGE = A + B + TA + TB + TM;
    static constexpr int BYTES = STAGES * STAGE + 1024;           // + manual 1 KB alignment
};
static_assert(WgSmem<128, 3>::STAGE == 45056 && WgSmem<128, 3>::BYTES == 136192, "wgmma smem");
static_assert(WgSmem<128, 3>::STAGE % 1024 == 0,
              "stages keep the 1024-byte alignment of the swizzled tiles");
static_assert(sizeof(float2) == 8 && sizeof(uint2) == 8 && sizeof(float4) == 16, "table entries");

// The block's cp.async copies of one stage (T threads), pieces of 16 B: A 128 rows x 8, B BN
// rows x 8 (rows past M / N zero-filled), Ta 4 runs of 128 x 8 B, Tb and Tm 4 runs of BN x 8 B
// each. Thread `tid` always takes the same piece column, so the sources are per-thread bases
// advanced by the stage's k (the rows of its A / B pieces are T/8 apart: same swizzle phase).
template <int BN, int STAGES, int T>
struct Copier {
    using S = WgSmem<BN, STAGES>;
    static constexpr int RS = T / 8, AI = BM / RS, BI = BN / RS;  // row step; A / B pieces
    static constexpr int TA = KC * BM * 8 / 16;                   // Ta pieces (256)
    static constexpr int PR = BN / 2, TI = 2 * KC * PR / T;       // per table run; per thread
    static_assert(2 * KC * PR % T == 0 && TA <= T && RS % 8 == 0, "whole passes of pieces");
    // 32-bit byte offsets from the kernel's pointer arguments (the launcher keeps every buffer
    // under 2^31 B), so the bases stay in the constant bank, not in registers
    uint32_t a, b, ta, t[TI], dst_ab, mask, ta_step, tb_step;

    __device__ __forceinline__ Copier(int m0, int n0, int M, int N, int K, int Mp, int Np,
                                      int KCT, int tid) {
        const int r = tid >> 3, c = tid & 7;
        dst_ab = r * 128 + ((c ^ (r & 7)) << 4);
        a = (uint32_t)min(m0 + r, M - 1) * K + c * 16;
        b = (uint32_t)min(n0 + r, N - 1) * K + c * 16;
        mask = 0;
#pragma unroll
        for (int i = 0; i < AI; ++i) mask |= (m0 + r + RS * i < M ? 1u : 0u) << i;
#pragma unroll
        for (int i = 0; i < BI; ++i) mask |= (n0 + r + RS * i < N ? 1u : 0u) << (AI + i);
        ta = ((uint32_t)((tid % TA) >> 6) * Mp + m0) * 8 + (tid & 63) * 16;
#pragma unroll
        for (int i = 0; i < TI; ++i) {   // Tw = [Tb | Tm], each [K/32][Np] entries of 8 B
            const int p = tid + i * T, m = p >= KC * PR, q = m ? p - KC * PR : p;
            t[i] = ((uint32_t)m * KCT * Np + (uint32_t)(q / PR) * Np + n0) * 8 + (q % PR) * 16;
        }
        ta_step = KC * Mp * 8;
        tb_step = KC * Np * 8;
    }

    // stage kt -> smem stage at sb, then commit
    __device__ __forceinline__ void issue(uint32_t sb, int kt, const uint8_t* Aq, const uint8_t* Ta,
                                          const uint8_t* Wq, const uint8_t* Tw, int K,
                                          int tid) const {
        const uint32_t k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < AI; ++i)
            cp_async16(sb + dst_ab + i * RS * 128, Aq + (a + i * RS * K + k0), (mask >> i) & 1);
#pragma unroll
        for (int i = 0; i < BI; ++i)
            cp_async16(sb + S::A + dst_ab + i * RS * 128, Wq + (b + i * RS * K + k0),
                       (mask >> (AI + i)) & 1);
        if (T == TA || tid < TA)
            cp_async16(sb + S::A + S::B + tid * 16, Ta + (ta + kt * ta_step), true);
#pragma unroll
        for (int i = 0; i < TI; ++i)
            cp_async16(sb + S::A + S::B + S::TA + (tid + i * T) * 16, Tw + (t[i] + kt * tb_step),
                       true);
        gemm_f16::cp_async_commit();
    }
};

// Block tile 128 tokens x BN = 128 weight rows; warpgroup w owns weight rows 64w..64w+63 and
// all 128 tokens as two m64 halves h (so each scale it loads serves 4 token rows per thread, and
// the two halves pipeline: the epilogue of one overlaps the other's wgmma). (4 warpgroups of
// 32 weight rows, 16 warps at <= 128 registers, measured 4-6% slower: docs/perf.md.)
// C = or, when `accumulate`, C += (RED: as reductions, else as a load-add-store per pair)
template <int STAGES, bool RED>
__device__ __forceinline__ void mmq_wgmma_body(const uint8_t* __restrict__ Aq,
                                               const uint8_t* __restrict__ Ta,
                                               const uint8_t* __restrict__ Wq,
                                               const uint8_t* __restrict__ Tw, float* C, int M,
                                               int N, int K, int accumulate, int dp, float4* ws,
                                               int* flags) {
    constexpr int BN = 128, WN = 64, NI = WN / 8, T = 256;   // block / warpgroup weight rows
    using S = WgSmem<BN, STAGES>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sgen = smem_raw + (base - raw);   // generic pointer of the aligned base

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int mtiles = (M + BM - 1) / BM, ntiles = mtiles * ((N + BN - 1) / BN);
    const int Mp = (M + TPAD - 1) / TPAD * TPAD, Np = (N + TPAD - 1) / TPAD * TPAD;
    const int KT = K / BK;
    const int rl = (warp & 3) * 16 + g;   // this thread's first token row in each m64 half
    const int cw = wg * WN;               // the warpgroup's first weight row in the tile
    const bool vec = (N & 1) == 0;        // float2 stores: col < N implies col + 1 < N

    float acc[2][NI][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < NI; ++i) acc[h][i][0] = acc[h][i][1] = acc[h][i][2] = acc[h][i][3] = 0.f;
    int d[2][WN / 2];

    // Work items (wgmma_common.cuh TileSched; tiles M-fastest, so the blocks sharing a weight
    // tile run together): each block walks its items, issuing the next item's first stages
    // before it stores the current one (the store burst and the pipeline fill overlap).
    wgmma::TileSched sched{ntiles, dp, KT, 0};
    wgmma::Work w;
    if (!sched.next(w)) return;
    int m0 = (w.tile % mtiles) * BM, n0 = (w.tile / mtiles) * BN;
    Copier<BN, STAGES, T> cp(m0, n0, M, N, K, Mp, Np, K / 32, tid);
    wgmma::ring_prologue<STAGES, S::STAGE>(cp, base, w.k0, w.k1, Aq, Ta, Wq, Tw, K, tid);
    while (true) {
        for (int kt = w.k0; kt < w.k1; ++kt) {
            wgmma::ring_next<STAGES, S::STAGE>(cp, base, kt, w.k1, Aq, Ta, Wq, Tw, K, tid);
            const int so = (kt % STAGES) * S::STAGE;
            const uint32_t sa = base + so, sbw = base + so + S::A + cw * 128;
            const float2* ta = reinterpret_cast<const float2*>(sgen + so + S::A + S::B);
            const float4* tb = reinterpret_cast<const float4*>(sgen + so + S::A + S::B + S::TA);
            const uint2* tm = reinterpret_cast<const uint2*>(sgen + so + S::A + S::B + S::TA + S::TB);
            auto issue = [&](int c, int h) {
                wgmma::fence();
                wgmma::igmma_m64n64k32(d[h], wgmma::sw128_desc(sa + h * 64 * 128 + c * 32),
                          wgmma::sw128_desc(sbw + c * 32));
                wgmma::commit();
            };
            issue(0, 0);
            issue(0, 1);
            float4 es[NI];   // (dsvs, nbs) of the thread's 2 columns per n8 frag, both halves
#pragma unroll
            for (int i = 0; i < NI; ++i) es[i] = tb[(cw + i * 8 + 2 * t) >> 1];
#pragma unroll
            for (int c = 0; c < KC; ++c) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float da0 = ta[c * BM + h * 64 + rl].x, da8 = ta[c * BM + h * 64 + rl + 8].x;
                    if (c == KC - 1 && h == 1) wgmma::wait<0>();
                    else wgmma::wait<1>();   // (c, h) done; the next group may still run
                    wgmma::fence_regs(d[h]);
#pragma unroll
                    for (int i = 0; i < NI; ++i) {
                        const float4 e = es[i];
                        float(&y)[4] = acc[h][i];
                        y[0] = fmaf(fmaf(__int_as_float(d[h][4 * i + 0]), e.x, e.y), da0, y[0]);
                        y[1] = fmaf(fmaf(__int_as_float(d[h][4 * i + 1]), e.z, e.w), da0, y[1]);
                        y[2] = fmaf(fmaf(__int_as_float(d[h][4 * i + 2]), e.x, e.y), da8, y[2]);
                        y[3] = fmaf(fmaf(__int_as_float(d[h][4 * i + 3]), e.z, e.w), da8, y[3]);
                        // es[i] is dead after half 1: load chunk c+1's in its place (ptxas
                        // schedules it ~37 instructions before use at this register count)
                        if (h == 1 && c + 1 < KC) es[i] = tb[((c + 1) * BN + cw + i * 8 + 2 * t) >> 1];
                    }
                    if (c + 1 < KC) issue(c + 1, h);
                }
            }
            // min term of the stage: y[r][n] += sum_c dma[r][c] * dmv[c][n], k = c = t
            uint32_t b[NI][2];
#pragma unroll
            for (int i = 0; i < NI; ++i) {
                const uint2 v = tm[t * BN + cw + i * 8 + g];
                b[i][0] = v.x;
                b[i][1] = v.y;
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t ah0, al0, ah8, al8;
                tf32_split(ta[t * BM + h * 64 + rl].y, ah0, al0);
                tf32_split(ta[t * BM + h * 64 + rl + 8].y, ah8, al8);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    wgmma::mma_tf32_k4(acc[h][i], ah0, ah8, b[i][0]);
                    wgmma::mma_tf32_k4(acc[h][i], ah0, ah8, b[i][1]);
                    wgmma::mma_tf32_k4(acc[h][i], al0, al8, b[i][0]);
                }
            }
        }
        const int sm0 = m0, sn0 = n0;
        const wgmma::Work cur = w;
        const bool more = sched.next(w);
        __syncthreads();   // every warp is done with the stages (the min term read the last)
        if (more) {
            m0 = (w.tile % mtiles) * BM;
            n0 = (w.tile / mtiles) * BN;
            cp = Copier<BN, STAGES, T>(m0, n0, M, N, K, Mp, Np, K / 32, tid);
            wgmma::ring_prologue<STAGES, S::STAGE>(cp, base, w.k0, w.k1, Aq, Ta, Wq, Tw, K, tid);
        }
        float* flat = &acc[0][0][0];
        if (cur.k0 > 0) {   // a stream-K tail: its sums go to the block with the head
            wgmma::sk_put<2 * NI * 4, T>(ws, flags, flat);
        } else {
            if (cur.k1 < KT) wgmma::sk_add<2 * NI * 4, T>(ws, flags, flat);
            // each (C pointer, float2 of acc) of the thread
            auto each = [&](auto&& f) {
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        const int r = sm0 + h * 64 + rl + 8 * u;
                        if (r >= M) continue;
#pragma unroll
                        for (int i = 0; i < NI; ++i) {
                            const int col = sn0 + cw + i * 8 + 2 * t;
                            if (col < N)
                                f(C + (size_t)r * N + col, acc[h][i][2 * u], acc[h][i][2 * u + 1],
                                  col + 1 < N);
                        }
                    }
            };
            const auto store = [&](float* p, float& y0, float& y1, bool second) {
                wgmma::store_c2(p, make_float2(y0, y1), vec, second);
            };
            if (!accumulate) {
                each(store);
            } else if constexpr (RED) {
                each([&](float* p, float& y0, float& y1, bool second) {
                    wgmma::red_c2(p, make_float2(y0, y1), vec, second);
                });
            } else {
                each([&](float* p, float& y0, float& y1, bool second) {
                    const float2 o = wgmma::load_c2(p, vec, second);
                    store(p, y0 += o.x, y1 += o.y, second);
                });
            }
        }
        if (!more) break;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < NI; ++i)
                acc[h][i][0] = acc[h][i][1] = acc[h][i][2] = acc[h][i][3] = 0.f;
    }
    gemm_f16::cp_async_wait<0>();
}

}  // namespace

// One block per SM: 8 warps of 2 x (32 D + 32 accumulator) registers per thread. Two entries
// of one signature; the launcher runs C = on mmq_wgmma_q4k (accumulate = 0) and C += on
// mmq_wgmma_q4k_acc (accumulate = 1, reductions). Each keeps both paths compiled in: ptxas
// schedules the k-loop 3-7% faster that way than in a store-only or a reductions-only build,
// and the load-add-store path gives the C = entry the fastest k-loop (measured in one call,
// 28672 x 4096: 437 / 450 / 470 us with that / the reductions / no accumulate path; the C +=
// entry 224 us at 4096 x 14336 against 236 for reductions only; docs/perf.md).
extern "C" __global__ void __launch_bounds__(256, 1)
mmq_wgmma_q4k(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
              const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M,
              int N, int K, int accumulate, int dp, float4* ws, int* flags) {
    mmq_wgmma_body<MMQ_WG_STAGES, false>(Aq, Ta, Wq, Tw, C, M, N, K, accumulate, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_wgmma_q4k_acc(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
                  const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M,
                  int N, int K, int accumulate, int dp, float4* ws, int* flags) {
    mmq_wgmma_body<MMQ_WG_STAGES, true>(Aq, Ta, Wq, Tw, C, M, N, K, accumulate, dp, ws, flags);
}
