// mmq_sb_q6k.cu: C[M, N] f32 = q8s(A)[M, K] x q6_K(W)[N, K]^T on Hopper int8 tensor cores with
// the integer sums carried over a whole 256-value super-block (wgmma m64n64k32 .s32.s8.s8,
// sm_90a only): the q6_K member of the super-block ("SB") MMQ family of mmq_sb_q4k.cu.
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// q6_K: w = d * sc_j * (q - 32), one int8 scale sc_j per 16 values, q in 0..63. With the
// activations quantized per 256 values (q8s, one scale da per token and super-block, signed
// bytes qa here), a super-block's product is d * da * sum_j sc_j S_j, S_j = sum_{k in j} qa (q-32).
// The sub-scale goes into the weight as three s8 planes: sc = a0 + 7 a1 + 49 a2 with balanced
// base-7 digits a_i in -3..3 (every int8 sc has one), P_i = a_i (q - 32) in -96..96, and three
// wgmmas per chunk accumulate over all 8 chunks:
//   D_i = sum_k qa P_i,  |D_i| <= 256 * 127 * 96 < 2^22,  sum_j sc_j S_j = D_0 + 7 D_1 + 49 D_2
// Epilogue per C value and super-block (against 3 FFMA per 32-chunk in mmq_wgmma_q6k.cu): each
// D_i to f32 exactly (bits + 0x4B400000 read as 1.5 * 2^23 + D_i, minus 1.5 * 2^23), then
//   t = f_0 c_0; t = fma(f_1, c_1, t); t = fma(f_2, c_2, t); y = fma(t, da 2^75, y)
//   c_i = 7^i d 2^-75   (exact: f16 d times 1, 7 or 49, times a power of two)
// No bias and no min term: the q - 32 offset is inside the planes.
// Operands (quantize_q8_1.cu's quantize_q8s_split with bias 0, mmq_repack.cu's repack_q6k_sb;
// numpy twins in minfer.quants.mmq_sb_ref):
//   Aq  int8 [M, K]         qa (signed: the q8s split without its +128)
//   Ta  float2 [K/32, Mp]   (da * 2^75, da * sa_c) per token and chunk (the q8s split's table;
//                           only .x of a super-block's first chunk is read); Mp = M rounded to 128
//   Wp  int8 [3, N, K]      the planes P0, P1, P2
//   Ts  float4 [K/256, Np]  (c_0, c_1, c_2, 0) per row and super-block; Np = N rounded to 128
// Block: 2 warpgroups (256 threads, 1 block per SM), tile 128 tokens x 64 weight rows; warpgroup
// w owns tokens 64w..64w+63 and the 64 rows (m64n64: D_0..D_2 and y are 32 registers each).
// Stages of 128 k (half a super-block) in a 3-slot cp.async ring: stage kt's wgmmas are issued,
// then (wait_group 1 and a barrier: every warpgroup's stage kt-1 is done) stage kt-1's slot takes
// stage kt+2. Persistent over work items in super-block units (wgmma_common.cuh TileSched, then
// stream-K), like mmq_sb_q4k.cu. Dynamic smem Sb6Smem::BYTES.
// Entries: mmq_sb_q6k (C =) and mmq_sb_q6k_acc (C +=, reductions), both (Aq, Ta, Wp, Ts, C, M,
// N, K, dp, ws, flags); K % 256 == 0; dp, ws (float4 [gridDim][8][256]), flags as in
// mmq_wgmma_q4k.cu; every buffer under 2^31 B.
#include "gemm_f16_common.cuh"
#include "wgmma_common.cuh"

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

constexpr int BM = 128, BN = 64, BK = 128, KC = BK / 32, T = 256;   // tile, stage, chunks
constexpr int TPAD = 128;                                          // table row padding
constexpr int SLOTS = 3;

struct Sb6Smem {
    static constexpr int A = BM * BK, P = BN * BK;                 // swizzled tiles (A, P0..P2)
    static constexpr int TA = BM * 8, TS = BN * 16;                // da (chunk 0), c_i per row
    static constexpr int STAGE = A + 3 * P + TA + TS;
    static constexpr int BYTES = SLOTS * STAGE + 1024;             // + manual 1 KB alignment
};
static_assert(Sb6Smem::STAGE == 43008 && Sb6Smem::BYTES == 130048, "sb q6_K smem");
static_assert(Sb6Smem::STAGE % 1024 == 0, "stages keep the swizzled tiles 1024-aligned");

// d[32] (s32) (= or +=, scale_d) A (64x32 s8, smem desc) * B (32x64 s8, smem desc)
__device__ __forceinline__ void igmma_s8_m64n64k32(int (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
          "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
          "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]),
          "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]),
          "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
}

// The block's cp.async copies of one stage, pieces of 16 B: A 128 rows x 8 (rows past M
// zero-filled), the planes 3 x 64 rows x 8 (rows past N zero-filled), da of the stage's
// super-block (chunk 0's Ta entries, 128 x 8 B, threads 0..63) and its Ts run (64 x 16 B,
// threads 64..127). Per-thread 32-bit offsets, advanced by the stage.
struct Sb6Copier {
    using S = Sb6Smem;
    static constexpr int RS = T / 8, AI = BM / RS, PI = BN / RS;   // row step 32; 4 + 2 pieces
    uint32_t a, p, dst, mask;

    __device__ __forceinline__ Sb6Copier(int m0, int n0, int M, int N, int K, int tid) {
        const int r = tid >> 3, c = tid & 7;
        dst = r * 128 + ((c ^ (r & 7)) << 4);
        a = (uint32_t)min(m0 + r, M - 1) * K + c * 16;
        p = (uint32_t)min(n0 + r, N - 1) * K + c * 16;
        mask = 0;
#pragma unroll
        for (int i = 0; i < AI; ++i) mask |= (m0 + r + RS * i < M ? 1u : 0u) << i;
#pragma unroll
        for (int i = 0; i < PI; ++i) mask |= (n0 + r + RS * i < N ? 1u : 0u) << (AI + i);
    }

    // stage kt of the tile (m0, n0) -> smem stage at sb, then commit
    __device__ __forceinline__ void issue(uint32_t sb, int kt, const uint8_t* Aq, const uint8_t* Ta,
                                          const uint8_t* Wp, const uint8_t* Ts, int N, int K,
                                          int Mp, int Np, int m0, int n0, int tid) const {
        const uint32_t k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < AI; ++i)
            cp_async16(sb + dst + i * RS * 128, Aq + (a + i * RS * K + k0), (mask >> i) & 1);
#pragma unroll
        for (int q = 0; q < 3; ++q)
#pragma unroll
            for (int i = 0; i < PI; ++i)
                cp_async16(sb + S::A + q * S::P + dst + i * RS * 128,
                           Wp + (q * (uint32_t)N * K + p + i * RS * K + k0), (mask >> (AI + i)) & 1);
        if (tid < 64)   // Ta row of the super-block's first chunk: tokens m0.. (float2 each)
            cp_async16(sb + S::A + 3 * S::P + tid * 16,
                       Ta + (((uint32_t)(kt >> 1) * 8 * Mp + m0) * 8 + tid * 16), true);
        else if (tid < 128)
            cp_async16(sb + S::A + 3 * S::P + S::TA + (tid - 64) * 16,
                       Ts + (((uint32_t)(kt >> 1) * Np + n0) * 16 + (tid - 64) * 16), true);
        gemm_f16::cp_async_commit();
    }
};

template <bool RED>
__device__ __forceinline__ void mmq_sb6_body(const uint8_t* __restrict__ Aq,
                                             const uint8_t* __restrict__ Ta,
                                             const uint8_t* __restrict__ Wp,
                                             const uint8_t* __restrict__ Ts, float* C, int M,
                                             int N, int K, int dp, float4* ws, int* flags) {
    constexpr int NI = BN / 8;   // n8 fragments
    using S = Sb6Smem;
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
    int d0[NI * 4], d1[NI * 4], d2[NI * 4];

    wgmma::TileSched sched{ntiles, dp, KS, 0};
    wgmma::Work w;
    if (!sched.next(w)) return;
    int m0 = (w.tile % mtiles) * BM, n0 = (w.tile / mtiles) * BN;
    Sb6Copier cp(m0, n0, M, N, K, tid);
    auto prologue = [&]() {
        cp.issue(base + ((2 * w.k0) % SLOTS) * S::STAGE, 2 * w.k0, Aq, Ta, Wp, Ts, N, K, Mp, Np, m0,
                 n0, tid);
        cp.issue(base + ((2 * w.k0 + 1) % SLOTS) * S::STAGE, 2 * w.k0 + 1, Aq, Ta, Wp, Ts, N, K, Mp,
                 Np, m0, n0, tid);
    };
    prologue();
    while (true) {
        for (int sbk = w.k0; sbk < w.k1; ++sbk)   // super-blocks; their two stages unrolled, so
#pragma unroll                                     // the loop edge sees no wgmma in flight
        for (int h = 0; h < 2; ++h) {
            const int kt = 2 * sbk + h;
            // stage kt landed (kt+1 may still be in flight): visible to the wgmmas
            gemm_f16::cp_async_wait<1>();
            wgmma::fence_proxy_async();
            __syncthreads();
            const uint32_t so = base + (kt % SLOTS) * S::STAGE;
            const uint32_t sa = so + wg * 64 * 128;
            wgmma::fence();
#pragma unroll
            for (int c = 0; c < KC; ++c) {
                const int acc = h | (c > 0);   // a super-block's first chunk starts D
                const uint64_t da_ = wgmma::sw128_desc(sa + c * 32);
                igmma_s8_m64n64k32(d0, da_, wgmma::sw128_desc(so + S::A + c * 32), acc);
                igmma_s8_m64n64k32(d1, da_, wgmma::sw128_desc(so + S::A + S::P + c * 32), acc);
                igmma_s8_m64n64k32(d2, da_, wgmma::sw128_desc(so + S::A + 2 * S::P + c * 32), acc);
            }
            wgmma::commit();
            // while they run: once every warpgroup's stage kt-1 is done, its slot takes kt+2
            wgmma::wait<1>();
            __syncthreads();
            if (kt + 2 < 2 * w.k1)
                cp.issue(base + ((kt + 2) % SLOTS) * S::STAGE, kt + 2, Aq, Ta, Wp, Ts, N, K, Mp, Np,
                         m0, n0, tid);
            else
                gemm_f16::cp_async_commit();
            if (h == 1) {   // the super-block's sums are complete: fold them into y
                wgmma::wait<0>();
                wgmma::fence_regs(d0);
                wgmma::fence_regs(d1);
                wgmma::fence_regs(d2);
                const uint8_t* st = smem_raw + (so - raw);
                const float2* ta = reinterpret_cast<const float2*>(st + S::A + 3 * S::P);
                const float4* ts = reinterpret_cast<const float4*>(st + S::A + 3 * S::P + S::TA);
                const float da0 = ta[rl].x, da8 = ta[rl + 8].x;
                constexpr float MAGIC = 12582912.0f;   // 1.5 * 2^23: its bits are 0x4B400000
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const float4 e0 = ts[i * 8 + 2 * t], e1 = ts[i * 8 + 2 * t + 1];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 e = (j & 1) ? e1 : e0;
                        const float f0 = __int_as_float(d0[4 * i + j] + 0x4B400000) - MAGIC;
                        const float f1 = __int_as_float(d1[4 * i + j] + 0x4B400000) - MAGIC;
                        const float f2 = __int_as_float(d2[4 * i + j] + 0x4B400000) - MAGIC;
                        const float tt = fmaf(f2, e.z, fmaf(f1, e.y, f0 * e.x));
                        y[4 * i + j] = fmaf(tt, (j & 2) ? da8 : da0, y[4 * i + j]);
                    }
                }
            }
        }
        const wgmma::Work cur = w;
        const int sm0 = (cur.tile % mtiles) * BM, sn0 = (cur.tile / mtiles) * BN;
        const bool more = sched.next(w);
        gemm_f16::cp_async_wait<0>();   // (the empty groups past the item's end)
        __syncthreads();                // every warp is done with the stages
        if (more) {
            m0 = (w.tile % mtiles) * BM;
            n0 = (w.tile / mtiles) * BN;
            cp = Sb6Copier(m0, n0, M, N, K, tid);
            prologue();
        }
        // a stream-K tail publishes its sums, a head adds its tail's; then the stores
        wgmma::finish_item<NI, T, RED>(cur, KS, y, C, M, N, sm0 + rl, sn0 + 2 * t, ws, flags);
        if (!more) break;
#pragma unroll
        for (int i = 0; i < NI * 4; ++i) y[i] = 0.f;
    }
    gemm_f16::cp_async_wait<0>();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb_q6k(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
           const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Ts, float* C, int M, int N,
           int K, int dp, float4* ws, int* flags) {
    mmq_sb6_body<false>(Aq, Ta, Wp, Ts, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_sb_q6k_acc(const uint8_t* __restrict__ Aq, const uint8_t* __restrict__ Ta,
               const uint8_t* __restrict__ Wp, const uint8_t* __restrict__ Ts, float* C, int M,
               int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb6_body<true>(Aq, Ta, Wp, Ts, C, M, N, K, dp, ws, flags);
}
