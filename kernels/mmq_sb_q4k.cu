// mmq_sb_q4k.cu: C[M, N] f32 = q8s(A)[M, K] x q4_K(W)[N, K]^T on Hopper int8 tensor cores with
// the integer sums carried over a whole 256-value super-block (wgmma m64n128k32 .s32.u8.u8,
// sm_90a only).
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// "SB" MMQ: the activations are quantized per 256 values (one scale per token and
// super-block, like llama.cpp's q8_K), so a super-block's 8 chunks share both the activation
// scale da and the weight scale d, and only the 6-bit sub-scale sc changes per 32-chunk. The
// weight is stored as two u8 planes with sc folded in: sc = 8 a + b (a, b in 0..7),
//   P0 = a * v, P1 = b * v  (v the q4_K nibble, so both <= 105),
// and two wgmmas per chunk accumulate on the tensor core, over all 8 chunks:
//   D_p = sum_k (qa + 128) * P_p = sum_c (S_pc + 128 V_pc)       (< 2^23: an f32 denormal)
// with sum_c sc_c S_c = 8 (D_0 - 128 V_0) + (D_1 - 128 V_1). Epilogue per C value and
// super-block (4 FFMA for 8 chunks, against 2 per chunk in mmq_wgmma_q4k.cu), one plane at a
// time so that D_0's runs under plane 1's wgmmas:
//   y = fma(fma(D_0, 8 d 2^74, B_0), da 2^75, y); y = fma(fma(D_1, d 2^74, B_1), da 2^75, y)
//   B_0 = f32(-1024 V_0) d 2^-75, B_1 = f32(-128 V_1) d 2^-75 (V_p: the plane's super-block
//   sum per row)
// The min term sum_c (da sa_c) (-dmin m_c) is the per-stage [64 x 4] x [4 x 128] product on tf32
// mma.sync m16n8k4 (3xTF32) straight into y, as in mmq_wgmma_q4k.cu.
// Operands (quantize_q8_1.cu's quantize_q8s_split and mmq_repack.cu's repack_q4k_sb write them;
// numpy twins in minfer.quants.mmq_sb_ref):
//   Aq  uint8 [M, K]        qa + 128, qa = the per-256 quantized activation
//   Ta  float2 [K/32, Mp]   (da * 2^75, da * sa_c) per token and chunk (da repeats over the 8
//                           chunks of a super-block); Mp = M rounded up to 128
//   Wp  uint8 [2, N, K]     the planes P0, P1
//   Tw  [Ts | Tm]           Ts float4 [K/256, Np] = (8 d 2^74, d 2^74, B_0, B_1) per row and
//                           super-block; Tm uint2 [K/32, Np] = -(dmin m_c) as tf32 (hi, lo)
// Block: 2 warpgroups (256 threads, 1 block per SM), tile 128 tokens x 128 weight rows;
// warpgroup w owns tokens 64w..64w+63 and all 128 rows (m64n128: D_0, D_1, y are 64 registers
// each). Stages of 128 k (half a super-block) in a 3-slot cp.async ring: stage kt's wgmmas are
// issued, then (wait_group 1 and a barrier: every warpgroup's stage kt-1 is done) stage kt-1's
// slot takes stage kt+2. Persistent over work items in super-block units (wgmma_common.cuh TileSched, then
// stream-K), like mmq_wgmma_q4k.cu. Dynamic smem SbSmem<3>::BYTES.
// Entries: mmq_sb_q4k (C =) and mmq_sb_q4k_acc (C +=, reductions), both (Aq, Ta, Wp, Tw, C, M,
// N, K, dp, ws, flags); K % 256 == 0; dp, ws (float4 [gridDim][16][256]), flags as in
// mmq_wgmma_q4k.cu; every buffer under 2^31 B.
#include "gemm_f16_common.cuh"
#include "mmq_common.cuh"   // tf32_split
#include "wgmma_common.cuh"

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

constexpr int BM = 128, BN = 128, BK = 128, KC = BK / 32, T = 256;   // tile, stage, chunks
constexpr int TPAD = 128;                                           // table row padding
constexpr int SB_STAGES = 3;

template <int STAGES>
struct SbSmem {
    static constexpr int A = BM * BK, P = BN * BK;                // swizzled tiles (A, P0, P1)
    static constexpr int TA = KC * BM * 8, TS = BN * 16, TM = 2 * 8 * BN * 4;   // TM: odd stages
    static constexpr int STAGE = A + 2 * P + TA + TS + TM;
    static constexpr int BYTES = STAGES * STAGE + 1024;           // + manual 1 KB alignment
};
static_assert(SbSmem<3>::STAGE == 63488 && SbSmem<3>::BYTES == 191488, "sb smem");
static_assert(SbSmem<3>::STAGE % 1024 == 0, "stages keep the swizzled tiles 1024-aligned");

// d[64] (s32) (= or +=, scale_d) A (64x32 u8, smem desc) * B (32x128 u8, smem desc)
__device__ __forceinline__ void igmma_m64n128k32(int (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
          "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
          "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]),
          "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]),
          "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]),
          "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]),
          "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]),
          "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]),
          "+r"(d[62]), "+r"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
}

// The block's cp.async copies of one stage by NT threads, pieces of 16 B: A 128 rows x 8, P0
// and P1 128 rows x 8 each (rows past M / N zero-filled), Ta 4 runs of 128 x 8 B, Ts one run
// of 128 x 16 B (threads 0..127), and on a super-block's second stage its Tm block (8 KB).
// Per-thread 32-bit offsets, advanced by the stage.
template <int NT>
struct SbCopier {
    using S = SbSmem<SB_STAGES>;
    static constexpr int RS = NT / 8, AI = BM / RS, PI = BN / RS;   // row step; pieces per tile
    static constexpr int TAI = 256 / NT, TMI = S::TM / 16 / NT;     // Ta, Tm pieces per thread
    uint32_t a, p, ta, tm, dst, mask;   // (the kernel sits at the register cap: the per-stage
                                        // steps come from the launch parameters)

    __device__ __forceinline__ SbCopier(int m0, int n0, int M, int N, int K, int Mp, int Np,
                                        int tid) {
        const int r = tid >> 3, c = tid & 7;
        dst = r * 128 + ((c ^ (r & 7)) << 4);
        a = (uint32_t)min(m0 + r, M - 1) * K + c * 16;
        p = (uint32_t)min(n0 + r, N - 1) * K + c * 16;
        mask = 0;
#pragma unroll
        for (int i = 0; i < AI; ++i) mask |= (m0 + r + RS * i < M ? 1u : 0u) << i;
#pragma unroll
        for (int i = 0; i < PI; ++i) mask |= (n0 + r + RS * i < N ? 1u : 0u) << (AI + i);
        ta = ((uint32_t)(tid >> 6) * Mp + m0) * 8 + (tid & 63) * 16;    // chunk tid/64, 128 x 8 B
        tm = (uint32_t)(K / 256) * Np * 16 + (uint32_t)(n0 / 128) * S::TM + tid * 16;
    }

    // stage kt of the tile at row n0 -> smem stage at sb (no commit)
    __device__ __forceinline__ void copy(uint32_t sb, int kt, const uint8_t* Aq, const uint8_t* Ta,
                                         const uint8_t* Wp, const uint8_t* Tw, int N, int K,
                                         int Mp, int Np, int n0, int tid) const {
        const uint32_t k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < AI; ++i)
            cp_async16(sb + dst + i * RS * 128, Aq + (a + i * RS * K + k0), (mask >> i) & 1);
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
            for (int i = 0; i < PI; ++i)
                cp_async16(sb + S::A + q * S::P + dst + i * RS * 128,
                           Wp + (q * (uint32_t)N * K + p + i * RS * K + k0), (mask >> (AI + i)) & 1);
#pragma unroll
        for (int i = 0; i < TAI; ++i)
            cp_async16(sb + S::A + 2 * S::P + (tid + NT * i) * 16,
                       Ta + (ta + (NT / 64) * i * Mp * 8 + kt * (uint32_t)(KC * Mp * 8)), true);
        if (kt & 1) {   // the super-block's Tm block (8 KB), with its second stage
            const uint32_t src = tm + (uint32_t)(kt >> 1) * (Np / 128) * S::TM;
#pragma unroll
            for (int i = 0; i < TMI; ++i)
                cp_async16(sb + S::A + 2 * S::P + S::TA + S::TS + (tid + NT * i) * 16,
                           Tw + (src + NT * i * 16), true);
        }
        if (tid < 128)
            cp_async16(sb + S::A + 2 * S::P + S::TA + tid * 16,
                       Tw + (((uint32_t)(kt >> 1) * Np + n0) * 16 + tid * 16), true);
    }
    __device__ __forceinline__ void issue(uint32_t sb, int kt, const uint8_t* Aq, const uint8_t* Ta,
                                          const uint8_t* Wp, const uint8_t* Tw, int N, int K,
                                          int Mp, int Np, int n0, int tid) const {
        copy(sb, kt, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
        gemm_f16::cp_async_commit();
    }
};

template <bool RED>
__device__ __forceinline__ void mmq_sb_body(const uint8_t* __restrict__ Aq,
                                            const uint8_t* __restrict__ Ta,
                                            const uint8_t* __restrict__ Wp,
                                            const uint8_t* __restrict__ Tw, float* C, int M,
                                            int N, int K, int dp, float4* ws, int* flags) {
    constexpr int NI = BN / 8;   // n8 fragments per thread row pair
    using S = SbSmem<SB_STAGES>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int mtiles = (M + BM - 1) / BM, ntiles = mtiles * ((N + BN - 1) / BN);
    const int Mp = (M + TPAD - 1) / TPAD * TPAD, Np = (N + TPAD - 1) / TPAD * TPAD;
    const int KS = K / 256;                          // super-blocks: the schedule's units
    const int rl = wg * 64 + (warp & 3) * 16 + g;    // this thread's first token row in the tile

    float y[NI * 4];
#pragma unroll
    for (int i = 0; i < NI * 4; ++i) y[i] = 0.f;
    int d0[NI * 4], d1[NI * 4];

    wgmma::TileSched sched{ntiles, dp, KS, 0};
    wgmma::Work w;
    if (!sched.next(w)) return;
    int m0 = (w.tile % mtiles) * BM, n0 = (w.tile / mtiles) * BN;
    SbCopier<T> cp(m0, n0, M, N, K, Mp, Np, tid);
    cp.issue(base + ((2 * w.k0) % SB_STAGES) * S::STAGE, 2 * w.k0, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
    cp.issue(base + ((2 * w.k0 + 1) % SB_STAGES) * S::STAGE, 2 * w.k0 + 1, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
    while (true) {
        for (int sbk = w.k0; sbk < w.k1; ++sbk)   // super-blocks; their two stages unrolled, so
#pragma unroll                                     // the loop edge sees no wgmma in flight
        for (int h = 0; h < 2; ++h) {
            const int kt = 2 * sbk + h;
            // stage kt landed (kt+1 may still be in flight): visible to the wgmmas
            gemm_f16::cp_async_wait<1>();
            wgmma::fence_proxy_async();
            __syncthreads();
            const uint32_t so = base + (kt % SB_STAGES) * S::STAGE;
            const uint32_t sa = so + wg * 64 * 128;
            const uint8_t* st = smem_raw + (so - raw);
            const float2* ta = reinterpret_cast<const float2*>(st + S::A + 2 * S::P);
            // On a super-block's second stage its min term, y[r][n] += sum_c dma[r][c] dmv[c][n]
            // over the 8 chunks (k = chunk: 0..3 in the previous stage's slot, 4..7 in this one),
            // joins the stage's wgmmas: 3 tf32 wgmmas into y (3xTF32: hi*hi + hi*lo + lo*hi),
            // A = dma (hi, lo) from registers, B = the Tm block's dmv hi / lo. The fold below waits
            // for them before touching y. (mma.sync for it, beside the wgmmas, cost 28%; issued
            // after the fold instead, ptxas serialized every wgmma: docs/perf.md.)
            uint32_t ah[4], al[4];
            if (h == 1) {   // (A operands set before the fence)
                const float2* tp = reinterpret_cast<const float2*>(
                    smem_raw + (base - raw) + ((kt - 1) % SB_STAGES) * S::STAGE + S::A + 2 * S::P);
                tf32_split(tp[t * BM + rl].y, ah[0], al[0]);
                tf32_split(tp[t * BM + rl + 8].y, ah[1], al[1]);
                tf32_split(ta[t * BM + rl].y, ah[2], al[2]);
                tf32_split(ta[t * BM + rl + 8].y, ah[3], al[3]);
            }
            wgmma::fence();
            if (h == 1) {
                const uint32_t tmh = so + S::A + 2 * S::P + S::TA + S::TS;
                wgmma::tgmma_m64n128k8(y, ah, wgmma::plain_desc(tmh, 128, 256));
                wgmma::tgmma_m64n128k8(y, ah, wgmma::plain_desc(tmh + S::TM / 2, 128, 256));
                wgmma::tgmma_m64n128k8(y, al, wgmma::plain_desc(tmh, 128, 256));
            }
            // two groups a stage, plane 0 then plane 1: the fold of D_0 runs under plane 1's
            // wgmmas (2-4% faster than one group and one fold, docs/perf.md)
#pragma unroll
            for (int c = 0; c < KC; ++c)
                igmma_m64n128k32(d0, wgmma::sw128_desc(sa + c * 32),
                                 wgmma::sw128_desc(so + S::A + c * 32), h | (c > 0));
            wgmma::commit();
#pragma unroll
            for (int c = 0; c < KC; ++c)
                igmma_m64n128k32(d1, wgmma::sw128_desc(sa + c * 32),
                                 wgmma::sw128_desc(so + S::A + S::P + c * 32), h | (c > 0));
            wgmma::commit();
            // while they run: once every warpgroup's stage kt-1 is done, its slot takes stage
            // kt+2 (one barrier more per stage than refilling it at the top, but the copy gets
            // two stages to land: 7-15% faster, docs/perf.md)
            wgmma::wait<2>();   // (two groups a stage)
            __syncthreads();
            if (kt + 2 < 2 * w.k1)
                cp.issue(base + ((kt + 2) % SB_STAGES) * S::STAGE, kt + 2, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
            else
                gemm_f16::cp_async_commit();
            if (h == 1) {   // the super-block's sums are complete: fold them into y
                const float4* ts = reinterpret_cast<const float4*>(st + S::A + 2 * S::P + S::TA);
                const float da0 = ta[rl].x, da8 = ta[rl + 8].x;
                wgmma::wait<1>();   // plane 0 (and the min term): y += da (8 d S_0)
                wgmma::fence_regs(d0);
                wgmma::fence_regs(y);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const float4 e0 = ts[i * 8 + 2 * t], e1 = ts[i * 8 + 2 * t + 1];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 e = (j & 1) ? e1 : e0;
                        y[4 * i + j] = fmaf(fmaf(__int_as_float(d0[4 * i + j]), e.x, e.z),
                                            (j & 2) ? da8 : da0, y[4 * i + j]);
                    }
                }
                wgmma::wait<0>();   // plane 1: y += da (d S_1)
                wgmma::fence_regs(d1);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const float4 e0 = ts[i * 8 + 2 * t], e1 = ts[i * 8 + 2 * t + 1];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 e = (j & 1) ? e1 : e0;
                        y[4 * i + j] = fmaf(fmaf(__int_as_float(d1[4 * i + j]), e.y, e.w),
                                            (j & 2) ? da8 : da0, y[4 * i + j]);
                    }
                }
            }
        }
        const wgmma::Work cur = w;
        const int sm0 = (cur.tile % mtiles) * BM, sn0 = (cur.tile / mtiles) * BN;   // (recomputed:
        // kept across the k-loop it spilled)
        const bool more = sched.next(w);
        __syncthreads();   // every warp is done with the stages
        if (more) {
            m0 = (w.tile % mtiles) * BM;
            n0 = (w.tile / mtiles) * BN;
            cp = SbCopier<T>(m0, n0, M, N, K, Mp, Np, tid);
            cp.issue(base + ((2 * w.k0) % SB_STAGES) * S::STAGE, 2 * w.k0, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
            cp.issue(base + ((2 * w.k0 + 1) % SB_STAGES) * S::STAGE, 2 * w.k0 + 1, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
        }
        // a stream-K tail publishes its sums, a head adds its tail's; then the stores
        wgmma::finish_item<NI, T, RED>(cur, KS, y, C, M, N, sm0 + rl, sn0 + 2 * t, ws, flags);
        if (!more) break;
#pragma unroll
        for (int i = 0; i < NI * 4; ++i) y[i] = 0.f;
    }
    gemm_f16::cp_async_wait<0>();
}

// The warp-specialized form (entries mmq_sb_q4k_ws / _ws_acc, 384 threads): warpgroup 0 copies
// (cp.async, completion on the slot's `full` mbarrier), warpgroups 1 and 2 are the two consumer
// warpgroups of mmq_sb_body, which release a slot on its `empty` mbarrier once their wgmmas on
// it are done. No block-wide barrier in the loop: the consumers run out of phase (one may fold
// while the other's wgmmas run) and issue no copies; setmaxnreg moves the producer's registers
// to them. Stage it (a running count over the block's work items) lives in slot it % 3.
constexpr int WS_CONSUMER_REGS = 232, WS_PRODUCER_REGS = 40;

template <bool RED>
__device__ __forceinline__ void mmq_sb_ws_body(const uint8_t* __restrict__ Aq,
                                               const uint8_t* __restrict__ Ta,
                                               const uint8_t* __restrict__ Wp,
                                               const uint8_t* __restrict__ Tw, float* C, int M,
                                               int N, int K, int dp, float4* ws, int* flags) {
    constexpr int NI = BN / 8;
    using S = SbSmem<SB_STAGES>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint32_t bars = base + SB_STAGES * S::STAGE;   // full[s] at 8s, empty[s] at 8(3 + s)
    const int mtiles = (M + BM - 1) / BM, ntiles = mtiles * ((N + BN - 1) / BN);
    const int Mp = (M + TPAD - 1) / TPAD * TPAD, Np = (N + TPAD - 1) / TPAD * TPAD;
    const int KS = K / 256;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SB_STAGES; ++s) {
            wgmma::mbar_init(bars + 8 * s, 128);                    // the producer's threads
            wgmma::mbar_init(bars + 8 * (SB_STAGES + s), T);        // the consumers' threads
        }
    }
    __syncthreads();
    wgmma::TileSched sched{ntiles, dp, KS, 0};
    wgmma::Work w;
    uint32_t it = 0;
    if (threadIdx.x < 128) {   // the producer warpgroup
        wgmma::setmaxnreg_dec<WS_PRODUCER_REGS>();
        const int tid = threadIdx.x;
        while (sched.next(w)) {
            const int m0 = (w.tile % mtiles) * BM, n0 = (w.tile / mtiles) * BN;
            const SbCopier<128> cp(m0, n0, M, N, K, Mp, Np, tid);
            for (int kt = 2 * w.k0; kt < 2 * w.k1; ++kt, ++it) {
                const uint32_t slot = it % SB_STAGES, ph = (it / SB_STAGES) & 1;
                wgmma::mbar_wait(bars + 8 * (SB_STAGES + slot), ph ^ 1);
                cp.copy(base + slot * S::STAGE, kt, Aq, Ta, Wp, Tw, N, K, Mp, Np, n0, tid);
                wgmma::mbar_arrive_cp_async(bars + 8 * slot);
            }
        }
        return;
    }
    wgmma::setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int tid = threadIdx.x - 128, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int rl = wg * 64 + (warp & 3) * 16 + g;    // this thread's first token row in the tile
    float y[NI * 4];
    int d0[NI * 4], d1[NI * 4];
#if MMQ_SB_WS_LAG
    bool lag = wg == 1;   // warpgroup 2 starts once warpgroup 1 has issued its first stage
#endif
    while (sched.next(w)) {
#pragma unroll
        for (int i = 0; i < NI * 4; ++i) y[i] = 0.f;
        for (int sbk = w.k0; sbk < w.k1; ++sbk)   // super-blocks; their two stages unrolled, so
#pragma unroll                                     // the loop edge sees no wgmma in flight
        for (int h = 0; h < 2; ++h) {
            const int kt = 2 * sbk + h;
#if MMQ_SB_WS_LAG
            if (lag) {
                asm volatile("bar.sync 2, 256;\n" ::: "memory");
                lag = false;
            }
#endif
            const uint32_t slot = it % SB_STAGES, prev = (it + SB_STAGES - 1) % SB_STAGES;
            wgmma::mbar_wait(bars + 8 * slot, (it / SB_STAGES) & 1);   // stage kt landed
            wgmma::fence_proxy_async();                                // ... visible to wgmma
            const uint32_t so = base + slot * S::STAGE;
            const uint32_t sa = so + wg * 64 * 128;
            const uint8_t* st = smem_raw + (so - raw);
            const float2* ta = reinterpret_cast<const float2*>(st + S::A + 2 * S::P);
            // On a super-block's second stage its min term, y[r][n] += sum_c dma[r][c] dmv[c][n]
            // over the 8 chunks (k = chunk: 0..3 in the previous stage's slot, 4..7 in this one),
            // joins the stage's wgmmas: 3 tf32 wgmmas into y (3xTF32: hi*hi + hi*lo + lo*hi),
            // A = dma (hi, lo) from registers, B = the Tm block's dmv hi / lo. The fold below waits
            // for them before touching y. (mma.sync for it, beside the wgmmas, cost 28%; issued
            // after the fold instead, ptxas serialized every wgmma: docs/perf.md.)
            uint32_t ah[4], al[4];
            if (h == 1) {   // (A operands set before the fence)
                const float2* tp = reinterpret_cast<const float2*>(
                    smem_raw + (base - raw) + prev * S::STAGE + S::A + 2 * S::P);
                tf32_split(tp[t * BM + rl].y, ah[0], al[0]);
                tf32_split(tp[t * BM + rl + 8].y, ah[1], al[1]);
                tf32_split(ta[t * BM + rl].y, ah[2], al[2]);
                tf32_split(ta[t * BM + rl + 8].y, ah[3], al[3]);
            }
            wgmma::fence();
            if (h == 1) {
                const uint32_t tmh = so + S::A + 2 * S::P + S::TA + S::TS;
                wgmma::tgmma_m64n128k8(y, ah, wgmma::plain_desc(tmh, 128, 256));
                wgmma::tgmma_m64n128k8(y, ah, wgmma::plain_desc(tmh + S::TM / 2, 128, 256));
                wgmma::tgmma_m64n128k8(y, al, wgmma::plain_desc(tmh, 128, 256));
            }
            // two groups a stage, plane 0 then plane 1: the fold of D_0 runs under plane 1's
            // wgmmas (2-4% faster than one group and one fold, docs/perf.md)
#pragma unroll
            for (int c = 0; c < KC; ++c)
                igmma_m64n128k32(d0, wgmma::sw128_desc(sa + c * 32),
                                 wgmma::sw128_desc(so + S::A + c * 32), h | (c > 0));
            wgmma::commit();
#pragma unroll
            for (int c = 0; c < KC; ++c)
                igmma_m64n128k32(d1, wgmma::sw128_desc(sa + c * 32),
                                 wgmma::sw128_desc(so + S::A + S::P + c * 32), h | (c > 0));
            wgmma::commit();
            // while they run: stage kt-1's wgmmas are done, its slot is free (the item's first
            // stage: the previous item released its last)
            wgmma::wait<2>();
            if (kt > 2 * w.k0) wgmma::mbar_arrive(bars + 8 * (SB_STAGES + prev));
#if MMQ_SB_WS_LAG
            if (it == MMQ_SB_WS_LAG - 1 && wg == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
#endif
            ++it;
            if (h == 1) {   // the super-block's sums are complete: fold them into y
                const float4* ts = reinterpret_cast<const float4*>(st + S::A + 2 * S::P + S::TA);
                const float da0 = ta[rl].x, da8 = ta[rl + 8].x;
                wgmma::wait<1>();   // plane 0 (and the min term): y += da (8 d S_0)
                wgmma::fence_regs(d0);
                wgmma::fence_regs(y);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const float4 e0 = ts[i * 8 + 2 * t], e1 = ts[i * 8 + 2 * t + 1];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 e = (j & 1) ? e1 : e0;
                        y[4 * i + j] = fmaf(fmaf(__int_as_float(d0[4 * i + j]), e.x, e.z),
                                            (j & 2) ? da8 : da0, y[4 * i + j]);
                    }
                }
                wgmma::wait<0>();   // plane 1: y += da (d S_1)
                wgmma::fence_regs(d1);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const float4 e0 = ts[i * 8 + 2 * t], e1 = ts[i * 8 + 2 * t + 1];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 e = (j & 1) ? e1 : e0;
                        y[4 * i + j] = fmaf(fmaf(__int_as_float(d1[4 * i + j]), e.y, e.w),
                                            (j & 2) ? da8 : da0, y[4 * i + j]);
                    }
                }
            }
        }
        // the item's last slot (its fold waited for every wgmma)
        wgmma::mbar_arrive(bars + 8 * (SB_STAGES + (it + SB_STAGES - 1) % SB_STAGES));
        const int sm0 = (w.tile % mtiles) * BM, sn0 = (w.tile / mtiles) * BN;
        // a stream-K tail publishes its sums, a head adds its tail's; then the stores
        wgmma::finish_item<NI, T, RED, 128>(w, KS, y, C, M, N, sm0 + rl, sn0 + 2 * t, ws, flags);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb_q4k(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
           const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Tw, float* C, int M, int N,
           int K, int dp, float4* ws, int* flags) {
    mmq_sb_body<false>(Aq, Ta, Wp, Tw, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb_q4k_acc(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
               const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Tw, float* C, int M,
               int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_body<true>(Aq, Ta, Wp, Tw, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(384, 1)
mmq_sb_q4k_ws(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
              const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Tw, float* C, int M,
              int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_ws_body<false>(Aq, Ta, Wp, Tw, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(384, 1)
mmq_sb_q4k_ws_acc(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
                  const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Tw, float* C, int M,
                  int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_ws_body<true>(Aq, Ta, Wp, Tw, C, M, N, K, dp, ws, flags);
}
