// mmq_blk.cu: the block-scaled int8 path. C[M, N] f32 = x[M, K] W[N, K]^T with both operands
// rotated by a 128-point Walsh-Hadamard transform per 128 of K and quantized to int8 with one
// f32 scale per (token, 128 of K) or per token, and per (weight row, 256 of K: a pair of
// blocks); Hopper wgmma m64n128k32 .s32.s8.s8, the int32 sums folded into f32 once per 128 of
// K, or per 256 with per-token scales (sm_90a only; warp-specialized, persistent, stream-K).
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// Why: an exact q4_K kernel folds every accumulator once per 32 of K (the sub-scale), which at
// Hopper's int8 rate costs the whole issue width; here a fold is once per stage of 128:
//   z[row][tok] += f32(S) * (sw[row] * sa[tok]),  S = sum_k qw qa over the stage (|S| < 2^21)
// (or, with one token scale over all blocks, z += f32(S) sw[row] once per pair of blocks, S
// over both (|S| < 2^22), and z *= sa[tok] at the end)
// (a per-row weight scale would save the FMUL but fails the KL-divergence gate:
// docs/perplexity.md)
// Math and layouts: the numpy twins in minfer.cuda.paths.blk.twin (quantize_blk, blk_operand,
// blk_gemm). Operands Tt (tokens), Wb (weight): [KB][Rp/128] blocks of OP = 16896 B, one per
// (128-K block, 128-row tile): the tile's image as the wgmma reads it (128 rows x 128 int8,
// 128-byte swizzle), then the 128 rows' f32 scales (the weight's with the rotation's 1/128).
// Entries:
//   blk_operand_f16 (x, ld, R, K, Rp, out, smul, pair): x f16 [R, K] (row stride ld) ->
//       operand (scales times smul: 1 for tokens, 1/128 for a weight, requantized at load;
//       pair: 1, or 2 for a weight: one scale per (row, pair of blocks), in both slots);
//       four lanes per (row, block or pair): the rotation (5 stages in registers, 2 by
//       shuffles), amax, s = amax / 127, q = rint(x' * (127 / amax)); rows R..Rp-1 and k >= K
//       are zeros.
//   blk_operand_f16_tok (x, ld, R, K, Rp, out): the same with one scale per token (the max over
//       its blocks, written into every block's slot): a warp per row.
//   rmsnorm_blk_operand (x, w, eps, h16, out, M, K, Mp, tok, t): the operand of h = f16(rmsnorm(x)
//       * w) from the residual x f32 [M, K] in the norm's launch (and h itself into h16, if not
//       null), bit-identical to rmsnorm_f32_f16 then blk_operand_f16 (tok: _tok); a CTA per
//       token, K <= 8192. A family without pre-norms (olmo2) reads the residual itself: w null,
//       h = f16(x) (cvt_f32_f16 then blk_operand_f16's bits); t f32 [M, K] not null, its post-norm
//       first: x += rmsnorm(t) * w (rmsnorm_add_f32's bits, x written back), h = f16(x).
//   mmq_blk (C =), mmq_blk_acc (C +=), both (Tt, Wb, C, M, N, K, dp, ws, flags), and
//   mmq_blk_swiglu (Tt, Wb, H, M, N, K, dp, ws, flags): H f16 [M, N/2] = swiglu of the
//       gate|up product, rows interleaved per 16 (wgmma_int8.cuh store_glu).
//   mmq_blk_geglu: the same with gemma's GELU: H = gelu(gate) * up.
//   mmq_blk_tok, mmq_blk_tok_swiglu, mmq_blk_tok_geglu: the same on a token operand with one
//       scale per token: the fold is z += f32(S) sw(row) (I2F, FFMA) once per pair of blocks
//       2i, 2i + 1, the
//       token's scale applied once before the epilogue. The GEMMs after an rmsnorm take it
//       (blk_ref.token_scaled: their input's blocks share one scale at a small cost in
//       accuracy, docs/blk.md).
//   moe_blk_tok_swiglu (gate|up), moe_blk (down): a mixture-of-experts FFN's grouped GEMMs
//       over per-expert weight operands, one CTA per (weight row tile, expert-sorted row tile),
//       the expert from the tile prefix (moe.cu's sort); moe_blk_operand_f16[_tok]: their token
//       operands of the padded, expert-sorted (gathered) rows. At the end of this file.
// Block: 384 threads, 1 per SM; one producer thread bulk-copies a stage's two blocks into a
// BLK_STAGES-slot ring; warpgroups 1, 2 own weight rows 0..63 and 64..127 of a 128 x 128 tile
// and alternate two s32 accumulator buffers, so a unit's fold (a stage, or mmq_blk_tok's pair)
// runs under the next unit's wgmmas; units go in straight-line groups of BLK_GROUP (4; then 2,
// 1) with no wgmma in flight at a branch (ptxas serializes every wgmma otherwise). Tiles go in
// the f16 GEMM's grouped order (BLK_GROUP_M token tiles sweep every weight row tile), so a
// long prompt's token blocks stay in L2 while the weights stream: in plain row-major order a
// wave covered all of a 16,384-token prompt's blocks (64 MB, over the L2) for one row tile and
// the GEMM ran at the DRAM's bandwidth.
// Build options: -DBLK_FOLD=1 converts S by the magic-number add instead of I2F (A/B);
// -DBLK_GROUP=N; -DBLK_STAGES=N the ring depth; -DBLK_GROUP_M=N the tile order's group (4:
// 1.06x 8 and 1.3x row-major on gate|up at 16,384 tokens, H100). Timing builds (wrong
// results; docs/perf.md "Per GEMM"): -DBLK_FOLD=2 | 3 | 4 the fold without its I2F | FMUL |
// both; -DBLK_NOFOLD no fold (what the data movement and wgmmas cost); -DBLK_HALFLOAD the
// weight block copied alone (half the L2 reads); -DBLK_SERIAL each unit folded right after its
// wgmmas, none under them (A/B of the overlap).
#include <cuda_fp16.h>

#include "blk_operand.cuh"
#include "gemm_f16_common.cuh"
#include "rmsnorm.cuh"
#include "wgmma_common.cuh"
#include "wgmma_int8.cuh"

namespace {
using gemm_f16::smem_u32;

constexpr int BM = 128, BN = 128, T = 256;   // tile (tokens, rows), consumer threads
using blkop::IMG;
using blkop::OP;
#ifndef BLK_STAGES
#define BLK_STAGES 6
#endif
#ifndef BLK_FOLD   // 0: I2F; 1: the magic-number add (IADD + FADD: slower, docs/perf.md)
#define BLK_FOLD 0
#endif
#ifndef BLK_GROUP  // stages per straight-line group (8 spills 32 B at BLK_FOLD 0)
#define BLK_GROUP 4
#endif
#ifndef BLK_GROUP_M   // token tiles per group of the tile order (gemm_f16::tile_origin)
#define BLK_GROUP_M 4
#endif
constexpr int STAGES = BLK_STAGES;
constexpr int CONSUMER_REGS = 232, PRODUCER_REGS = 40;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * 168, "register budget");

// a stage: the weight block at W (image, then scales), the token block at X
struct BlkSmem {
    static constexpr int W = 0, X = 17 * 1024, STAGE = 34 * 1024;
    static constexpr int BYTES = STAGES * STAGE + 1024 + 16 * STAGES;   // + alignment, mbarriers
};
static_assert(BlkSmem::BYTES <= 232448, "over the H200's opt-in shared memory");
static_assert(BlkSmem::X >= OP && BlkSmem::X + OP <= BlkSmem::STAGE && BlkSmem::X % 1024 == 0,
              "stage layout");

// d (+)= A B over one k32 step: A 64 weight rows, B 128 tokens, both s8 from shared memory
template <int ACC>
__device__ __forceinline__ void igmma_s8(int (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
        WG_R64
        "%64, %65, p;\n}\n"
        : WG_D64
        : "l"(a), "l"(b), "n"(ACC));
}

// a stage's four k32 steps into d (FIRST: the first one overwrites d, else all add to it)
template <bool FIRST>
__device__ __forceinline__ void stage_mma(int (&d)[64], uint32_t st, int cw) {
    const uint64_t a = wgmma::sw128_desc(st + BlkSmem::W + cw * 64 * 128);
    const uint64_t b = wgmma::sw128_desc(st + BlkSmem::X);
    wgmma::fence();
    igmma_s8<FIRST ? 0 : 1>(d, a, b);
#pragma unroll
    for (int c = 1; c < 4; ++c) igmma_s8<1>(d, a + 2 * c, b + 2 * c);   // +32 B per k32 step
    wgmma::commit();
}

__device__ __forceinline__ float s32_to_f32(int v) {
#if BLK_FOLD == 1   // 2^23 + 2^22 + v holds v in its mantissa for |v| < 2^22 (IADD + FADD)
    return __int_as_float(v + 0x4B400000) - 12582912.f;
#else
    return __int2float_rn(v);
#endif
}

// z[k] += f32(S[k]) sw(row) sa(token) for the stage in shared memory at p (the thread's rows
// rw, rw + 8; its tokens 16 q + 2t (+1), 16 q + 8 + 2t (+1) for q = 0..7), after the wgmma wait
// (TOK: the token operand's scale is per token, the same in every block: applied once, by
// scale_tokens before the epilogue, so the fold is I2F + FFMA)
template <bool TOK>
__device__ __forceinline__ void fold(float (&z)[64], int (&d)[64], const uint8_t* p, int rw,
                                     int t) {
    wgmma::fence_regs(d);
#ifdef BLK_NOFOLD   // timing build only (wrong results): the kernel without its folds
    return;
#endif
    const float* ws = reinterpret_cast<const float*>(p + BlkSmem::W + IMG);
    const float2* ts = reinterpret_cast<const float2*>(p + BlkSmem::X + IMG);
    const float w0 = ws[rw], w1 = ws[rw + 8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const float2 a0 = ts[8 * q + t], a1 = ts[8 * q + 4 + t];
#pragma unroll
        for (int k = 8 * q; k < 8 * q + 8; ++k) {
            const float2 a = (k & 4) ? a1 : a0;
            if constexpr (TOK) {
                z[k] = fmaf(s32_to_f32(d[k]), (k & 2) ? w1 : w0, z[k]);
                asm volatile("" : "+f"(z[k]));
                continue;
            }
#if BLK_FOLD == 2     // timing build (wrong results): FMUL + FFMA, no conversion
            z[k] = fmaf(__int_as_float(d[k]), ((k & 2) ? w1 : w0) * ((k & 1) ? a.y : a.x), z[k]);
#elif BLK_FOLD == 3   // timing build (wrong results): I2F + FFMA, no FMUL
            z[k] = fmaf(__int2float_rn(d[k]), (k & 1) ? a.y : a.x, z[k]);
#elif BLK_FOLD == 4   // timing build (wrong results): the FFMA alone
            z[k] = fmaf(__int_as_float(d[k]), (k & 1) ? a.y : a.x, z[k]);
#else
            z[k] = fmaf(s32_to_f32(d[k]), ((k & 2) ? w1 : w0) * ((k & 1) ? a.y : a.x), z[k]);
#endif
            asm volatile("" : "+f"(z[k]));   // (keeps each conversion next to its FFMA)
        }
    }
}

// G units of P stages straight-line from the block's running stage `it`: unit u's stages all
// into da (u even) or db, the unit folded once (P = 2: the token-scaled GEMMs, whose weight
// scales a pair of blocks shares: |S| < 2^22 still) while unit u + 1 runs; its slots released
// after the fold; none in flight at the end
template <int G, int P, bool TOK>
__device__ __forceinline__ void run_stages(float (&z)[64], int (&da)[64], int (&db)[64],
                                           uint32_t& it, uint32_t base, const uint8_t* sbase,
                                           uint32_t bars, int cw, int rw, int t) {
    using S = BlkSmem;
    static_assert(P == 1 || TOK, "a fold per pair needs the per-token operand");
    // the fold of unit v (its last stage's scales: a pair's are equal), then its slots' release
    auto fold_unit = [&](int v, int (&d)[64]) {
        fold<TOK>(z, d, sbase + (it + v * P + P - 1) % STAGES * S::STAGE, rw, t);
#pragma unroll
        for (int j = 0; j < P; ++j)
            wgmma::mbar_arrive(bars + 8 * (STAGES + (it + v * P + j) % STAGES));
    };
#pragma unroll
    for (int u = 0; u < G; ++u) {
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const uint32_t q = it + u * P + j, slot = q % STAGES;
            wgmma::mbar_wait(bars + 8 * slot, (q / STAGES) & 1);
            if (j == 0) stage_mma<true>(u & 1 ? db : da, base + slot * S::STAGE, cw);
            else stage_mma<false>(u & 1 ? db : da, base + slot * S::STAGE, cw);
        }
#ifdef BLK_SERIAL   // timing build: each unit's fold right after its wgmmas (no overlap)
        wgmma::wait<0>();
        fold_unit(u, u & 1 ? db : da);
        continue;
#endif
        if (u > 0) {
            wgmma::wait<P>();
            fold_unit(u - 1, u & 1 ? da : db);
        }
    }
#ifndef BLK_SERIAL
    wgmma::wait<0>();
    fold_unit(G - 1, (G - 1) & 1 ? db : da);
#endif
    it += G * P;
}

// z[k] *= the per-token scale of its token (TOK operands; tile tokens m0 .. m0 + 127 of the
// token operand Tt, read from its first block: every block holds the same scales)
__device__ __forceinline__ void scale_tokens(float (&z)[64], const uint8_t* __restrict__ Tt,
                                             int tile_tok, int t) {
    const float2* ts = reinterpret_cast<const float2*>(Tt + static_cast<size_t>(tile_tok) * OP
                                                       + IMG);
#pragma unroll
    for (int j = 0; j < 16; ++j) {   // tokens 8 j + 2 t (+1): z[4 j .. 4 j + 3]
        const float2 a = ts[4 * j + t];
#pragma unroll
        for (int k = 4 * j; k < 4 * j + 4; ++k) z[k] *= (k & 1) ? a.y : a.x;
    }
}

// EPI: 0 C = (f32 [M, N]), 1 C += (reductions), 2 / 3 the swiglu / geglu epilogue (C is H f16
// [M, N / 2]);
// TOK: the token operand has one scale per token (its fold leaves it to the epilogue)
template <int EPI, bool TOK>
__device__ __forceinline__ void mmq_blk_body(const uint8_t* __restrict__ Tt,
                                              const uint8_t* __restrict__ Wb, void* C, int M,
                                              int N, int K, int dp, float4* ws, int* flags) {
    using S = BlkSmem;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sbase = smem_raw + (base - raw);
    const uint32_t bars = base + STAGES * S::STAGE;   // full[s] at 8s, empty[s] at 8(STAGES + s)
    const int ntok = (M + BM - 1) / BM, nrow = (N + BN - 1) / BN, ntiles = ntok * nrow;
    const int KB = (K + 127) / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            wgmma::mbar_init(bars + 8 * s, 1);
            wgmma::mbar_init(bars + 8 * (STAGES + s), T);
        }
    }
    __syncthreads();
    wgmma::TileSched sched{ntiles, dp, KB, 0};
    wgmma::Work w;
    uint32_t it = 0;   // the block's running stage count: stage it lives in slot it % STAGES
    if (threadIdx.x < 128) {   // producer: one thread issues every copy
        wgmma::setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        // (32-bit offsets: the launcher keeps both operands under 2^31 bytes)
        const uint32_t wstep = nrow * OP, tstep = ntok * OP;
        while (true) {
            asm volatile("" : "+r"(sched.ntiles));
            if (!sched.next(w)) break;
            int m0, n0;
            gemm_f16::tile_origin<BM, BN, BLK_GROUP_M>(w.tile, M, N, m0, n0);
            uint32_t wo = n0 / BN * OP + w.k0 * wstep;
            uint32_t to = m0 / BM * OP + w.k0 * tstep;
            for (int q = w.k0; q < w.k1; ++q, ++it, wo += wstep, to += tstep) {
                const uint32_t slot = it % STAGES, st = base + slot * S::STAGE;
                wgmma::mbar_wait(bars + 8 * (STAGES + slot), ((it / STAGES) & 1) ^ 1);
#ifdef BLK_HALFLOAD   // timing build (wrong results): the weight block only (half the L2 reads)
                wgmma::mbar_expect_tx(bars + 8 * slot, OP);
                wgmma::bulk_copy(st + S::W, Wb + wo, OP, bars + 8 * slot);
#else
                wgmma::mbar_expect_tx(bars + 8 * slot, 2 * OP);
                wgmma::bulk_copy(st + S::W, Wb + wo, OP, bars + 8 * slot);
                wgmma::bulk_copy(st + S::X, Tt + to, OP, bars + 8 * slot);
#endif
            }
        }
        return;
    }
    wgmma::setmaxnreg_inc<CONSUMER_REGS>();
    int Mc = M;   // (anew on this side: a value held across the register reallocation spills)
    asm volatile("" : "+r"(Mc));
    const int tid = threadIdx.x - 128, lane = tid & 31, warp = tid >> 5, cw = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int rw = cw * 64 + (warp & 3) * 16 + g;   // the thread's first weight row of the tile
    float z[64];
    int da[64], db[64];
    while (sched.next(w)) {
#pragma unroll
        for (int k = 0; k < 64; ++k) z[k] = 0.f;
        // P stages per fold: per-token operands fold once per pair of blocks 2i, 2i + 1 (the
        // weight's scale), so a stream-K part that starts at an odd block takes that one alone
        constexpr int P = TOK ? 2 : 1;
        int n = w.k1 - w.k0;
        if constexpr (P == 2) {
            if (w.k0 & 1) {
                run_stages<1, 1, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
                --n;
            }
        }
        for (; n >= P * BLK_GROUP; n -= P * BLK_GROUP)
            run_stages<BLK_GROUP, P, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        for (; n >= 2 * P; n -= 2 * P)
            run_stages<2, P, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        if constexpr (P == 2) {
            if (n >= 2) {
                run_stages<1, 2, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
                n -= 2;
            }
        }
        if (n) run_stages<1, 1, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        // a stream-K tail publishes its values, a head adds its tail's; then the stores
        if (w.k0 > 0) {
            wgmma::sk_put<64, T, 128>(ws, flags, z);
        } else {
            if (w.k1 < KB) wgmma::sk_add<64, T, 128>(ws, flags, z);
            int m0, r0;
            gemm_f16::tile_origin<BM, BN, BLK_GROUP_M>(w.tile, Mc, N, m0, r0);
            if constexpr (TOK) scale_tokens(z, Tt, m0 / BM, t);
            m0 += 2 * t;
            r0 += rw;
            if constexpr (EPI >= 2)
                store_glu<EPI - 2>(z, static_cast<__half*>(C), M, N / 2, m0, r0);
            else store_t<EPI == 1>(z, static_cast<float*>(C), M, N, m0, r0);
        }
    }
}

}  // namespace

// the entries: NAME (C =), NAME_swiglu, NAME_geglu and (mmq_blk only) NAME_acc; NAME mmq_blk
// (token scales per block) or mmq_blk_tok (per token: the GEMMs after an rmsnorm, none of
// which adds to C; its C += would spill)
#define MMQ_BLK_ENTRY(NAME, EPI, TOK, CT)                                                       \
    extern "C" __global__ void __launch_bounds__(384, 1)                                        \
    NAME(const uint8_t* __restrict__ Tt, const uint8_t* __restrict__ Wb, CT* C, int M, int N,   \
         int K, int dp, float4* ws, int* flags) {                                               \
        mmq_blk_body<EPI, TOK>(Tt, Wb, C, M, N, K, dp, ws, flags);                              \
    }
MMQ_BLK_ENTRY(mmq_blk, 0, false, float)
MMQ_BLK_ENTRY(mmq_blk_acc, 1, false, float)
MMQ_BLK_ENTRY(mmq_blk_swiglu, 2, false, __half)
MMQ_BLK_ENTRY(mmq_blk_geglu, 3, false, __half)
MMQ_BLK_ENTRY(mmq_blk_tok, 0, true, float)
MMQ_BLK_ENTRY(mmq_blk_tok_swiglu, 2, true, __half)
MMQ_BLK_ENTRY(mmq_blk_tok_geglu, 3, true, __half)

// ---- the operand prepass (weights at load, activations before each GEMM) ----
// Four lanes (a quad) take one (row, 128-K block): lane l of the quad holds the block's values
// i = 32 j + 8 l + e (j, e = 0..7 / 0..3: four 16-byte loads), so the rotation's stages
// h = 1, 2, 4 (e) and 32, 64 (j) run in registers and only h = 8, 16 (l) by shuffles: 64
// shuffles per 8 blocks, in the twin's stage order (the same f32 sums, bit for bit). Quads go
// row-fastest, so a warp writes 8 consecutive image rows (1 KB) of one block.
namespace {
using namespace blkop;

// v[8j + e] = x[row][k0 + 32 j + 8 l + e] (zeros past K or for a padding row; the launcher
// checks K % 8 == 0 and x 16-byte aligned, so 8 values are all in or all out)
__device__ __forceinline__ void load32(float (&v)[32], const __half* __restrict__ x,
                                       long long ld, int R, int K, int row, int k0, int l) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int k = k0 + 32 * j + 8 * l;
        uint4 u = make_uint4(0, 0, 0, 0);
        if (row < R && k < K) u = *reinterpret_cast<const uint4*>(x + row * ld + k);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            v[8 * j + 2 * e] = f.x;
            v[8 * j + 2 * e + 1] = f.y;
        }
    }
}

// the quad's block -> its Walsh-Hadamard transform, stage by stage as blk_ref.fwht128 (h = 1,
// 2, 4: register bits 0-2; h = 8, 16: lanes xor 1, 2; h = 32, 64: register bits 3, 4);
// returns max |v| over the block
__device__ __forceinline__ float rotate128(float (&v)[32], int l) {
    butterfly<0>(v);
    butterfly<1>(v);
    butterfly<2>(v);
    butterfly_x(v, l, 1);
    butterfly_x(v, l, 2);
    butterfly<3>(v);
    butterfly<4>(v);
    return block_amax(v, 2);
}

__device__ __forceinline__ void store32(uint8_t* img, const float (&v)[32], float inv, int r,
                                        int l) {
#pragma unroll
    for (int j = 0; j < 4; ++j) store8(img, r, 32 * j + 8 * l, pack8(v + 8 * j, inv));
}
}  // namespace

extern "C" __global__ void __launch_bounds__(256)
blk_operand_f16(const __half* __restrict__ x, long long ld, int R, int K, int Rp,
                uint8_t* __restrict__ out, float smul, int pair) {
    const int l = threadIdx.x & 3;
    const long long quad = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 2;
    const int KB = (K + 127) / 128, KG = (KB + pair - 1) / pair;
    // (a warp's quads run together: the shuffles need all 32 lanes, so none returns early)
    const bool live = quad < static_cast<long long>(Rp) * KG;
    const int row = live ? static_cast<int>(quad % Rp) : R;
    const int kb = live ? static_cast<int>(quad / Rp) * pair : 0;
    float v[32], u[32];
    load32(v, x, ld, R, K, row, kb * 128, l);
    float amax = rotate128(v, l);
    if (pair == 2) {   // (a weight: one scale per pair of blocks; the launch's, so warp-uniform)
        load32(u, x, ld, R, K, row, (kb + 1) * 128, l);   // (zeros past K)
        amax = fmaxf(amax, rotate128(u, l));
    }
    if (!live) return;
    uint8_t* blk = block_at(out, kb, Rp, row);
    store32(blk, v, q8_inv(amax), row & 127, l);
    if (l == 0) store_scale(blk, row & 127, amax, smul);
    if (pair == 2 && kb + 1 < KB) {
        blk = block_at(out, kb + 1, Rp, row);
        store32(blk, u, q8_inv(amax), row & 127, l);
        if (l == 0) store_scale(blk, row & 127, amax, smul);
    }
}

// blk_operand_f16_tok: blk_operand_f16 with one scale per row (its max over all blocks; tokens
// only): a warp per row, its quads on blocks q, q + 8, ..; the row rotated twice (for the max,
// then for the bytes: the rotation is cheaper than holding a long row)
extern "C" __global__ void __launch_bounds__(256)
blk_operand_f16_tok(const __half* __restrict__ x, long long ld, int R, int K, int Rp,
                    uint8_t* __restrict__ out) {
    const int l = threadIdx.x & 3, qd = (threadIdx.x >> 2) & 7;
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);   // (the grid covers Rp rows exactly)
    const int KB = (K + 127) / 128;
    float v[32], amax = 0.f;
    for (int kb0 = 0; kb0 < KB; kb0 += 8) {   // (warp-uniform: the shuffles need every lane)
        load32(v, x, ld, R, K, row, (kb0 + qd) * 128, l);
        amax = fmaxf(amax, rotate128(v, l));
    }
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float inv = q8_inv(amax);
    for (int kb0 = 0; kb0 < KB; kb0 += 8) {
        const int kb = kb0 + qd;
        load32(v, x, ld, R, K, row, kb * 128, l);
        rotate128(v, l);
        if (kb >= KB) continue;
        uint8_t* blk = block_at(out, kb, Rp, row);
        store32(blk, v, inv, row & 127, l);
        if (l == 0) store_scale(blk, row & 127, amax);
    }
}

// rmsnorm_blk_operand: h = f16(rmsnorm(x) * w) and its operand in one launch, a CTA of 8 warps
// per token (row m < Mp; padding rows give zeros). The row is read once, in rmsnorm.cuh's
// chunks of 256 (chunk c to warp c % 8, lane l its values 8 l .. 8 l + 7) and summation order,
// so h is bit-identical to layers.cu's rmsnorm_f32_f16 and the operand to blk_operand_f16's of
// it. Within a chunk the lanes 16 b .. 16 b + 15 hold block 2 c + b: value i = 8 (l % 16) + e,
// the rotation's h = 1, 2, 4 in registers (e), 8 .. 64 across lanes (xor 1, 2, 4, 8).
// w null: no norm (h = f16(x)); t not null: the norm is t's, added into x first (the 256
// threads sum as rmsnorm_add_f32's 256 do: the same bits).
constexpr int NORM_CH = 4;   // chunks per warp held in registers: K <= 8 x 4 x 256 = 8192

extern "C" __global__ void __launch_bounds__(256)
rmsnorm_blk_operand(float* __restrict__ x, const float* __restrict__ w, float eps,
                    __half* __restrict__ h16, uint8_t* __restrict__ Tt, int M, int K, int Mp,
                    int tok, const float* __restrict__ t) {
    using namespace blkop;
    const int m = blockIdx.x, l = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int NC = (K + 255) / 256, KB = (K + 127) / 128;
    float* xr = x + static_cast<size_t>(m) * K;
    const float* nr = t ? t + static_cast<size_t>(m) * K : xr;   // the normed row
    float v[NORM_CH][8];
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < NORM_CH; ++j) {   // (all loads first: rms_load8 zero-fills past K)
        if (m < M && wi + 8 * j < NC) {
            rms_load8(nr, K, wi + 8 * j, l, v[j]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[j][e] = 0.f;
        }
    }
#pragma unroll
    for (int j = 0; j < NORM_CH; ++j) s = rms_chunk_sum(s, v[j]);
    const float scale = w ? rms_finish(s, K, eps) : 1.f;   // (w: uniform over the CTA)
    float h[NORM_CH][8], am[NORM_CH];   // the rotated blocks (lanes 16 b .. of chunk j), max |h|
    float rmax = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_CH; ++j) {
        const int c = wi + 8 * j, k0 = c * 256 + 8 * l;
        if (m < M && c < NC && k0 < K) {
            float y[8];   // the value h rounds: rmsnorm(x) * w, x, or x + rmsnorm(t) * w
            if (w) {
                const float4 wa = *reinterpret_cast<const float4*>(w + k0);
                const float4 wb = *reinterpret_cast<const float4*>(w + k0 + 4);
                const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] = rms_value(v[j][e], scale, wv[e]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] = v[j][e];
            }
            if (t) {
                float4* xp = reinterpret_cast<float4*>(xr + k0);
                const float4 xa = xp[0], xb = xp[1];
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] = __fadd_rn(xv[e], y[e]);
                xp[0] = make_float4(y[0], y[1], y[2], y[3]);
                xp[1] = make_float4(y[4], y[5], y[6], y[7]);
            }
            __align__(16) __half hh[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                hh[e] = __float2half_rn(y[e]);
                h[j][e] = __half2float(hh[e]);
            }
            if (h16) *reinterpret_cast<uint4*>(h16 + static_cast<size_t>(m) * K + k0) =
                *reinterpret_cast<const uint4*>(hh);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) h[j][e] = 0.f;
        }
        if (c >= NC) continue;   // (warp-uniform)
        butterfly<0>(h[j]);
        butterfly<1>(h[j]);
        butterfly<2>(h[j]);
#pragma unroll
        for (int mm = 1; mm < 16; mm <<= 1) butterfly_x(h[j], l, mm);
        am[j] = block_amax(h[j], 8);
        rmax = fmaxf(rmax, am[j]);
    }
    if (tok) {   // one scale per token: the max over the row's blocks (lanes, then warps)
        __shared__ float wmax[8];
        rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, 16));
        if (l == 0) wmax[wi] = rmax;
        __syncthreads();
        rmax = wmax[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) rmax = fmaxf(rmax, wmax[i]);
    }
#pragma unroll
    for (int j = 0; j < NORM_CH; ++j) {
        const int c = wi + 8 * j, kb = 2 * c + (l >> 4);
        if (kb >= KB) break;   // (c >= NC too)
        const float amax = tok ? rmax : am[j];
        uint8_t* blk = block_at(Tt, kb, Mp, m);
        store8(blk, m & 127, 8 * (l & 15), pack8(h[j], q8_inv(amax)));
        if ((l & 15) == 0) store_scale(blk, m & 127, amax);
    }
}

// ---- grouped GEMMs of a mixture-of-experts FFN (minfer.cuda.paths.blk.moe; the f16 ones: moe.cu) ----
// The pairs (token, slot) sorted by expert (moe.cu's moe_sort with 128-row tiles): expert e's
// sorted rows offs[e] .. offs[e + 1] - 1, its row tiles toff[e] .. toff[e + 1] - 1 of 128 rows
// (each expert's last tile partial); a global row tile mt < toff[E] belongs to the expert e with
// toff[e] <= mt < toff[e + 1] (binary search) and holds sorted rows offs[e] + (mt - toff[e])
// 128 + i, i < 128, those < offs[e + 1]; the other rows of the tile are padding. Token operand
// Tt [KB][MT][OP]: MT (the launch's worst case, ceil(P / 128) + min(E, P)) row tiles of padded
// rows; tiles mt >= toff[E] are never written nor read. Weights Wb [E][KB][ceil(N / 128)][OP]:
// one dense operand per expert (blk_operand_f16 of its [N, K] rows, pair 2).
namespace {
// the expert of row tile mt < toff[E]: toff[e] <= mt < toff[e + 1]
__device__ __forceinline__ int moe_expert(const int* __restrict__ toff, int E, int mt) {
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (toff[mid] <= mt) lo = mid;
        else hi = mid;
    }
    return lo;
}

// the source row of padded row pr (tile pr / 128): a_rows[r] / a_div (or r) for its sorted row
// r, -1 for a padding row or a tile past toff[E]; live: the tile is below toff[E]
__device__ __forceinline__ int moe_src_row(const int* __restrict__ a_rows, int a_div,
                                           const int* __restrict__ offs,
                                           const int* __restrict__ toff, int E, int pr,
                                           bool& live) {
    const int mt = pr >> 7;
    live = mt < toff[E];
    if (!live) return -1;
    const int e = moe_expert(toff, E, mt);
    const int r = offs[e] + (mt - toff[e]) * 128 + (pr & 127);
    if (r >= offs[e + 1]) return -1;
    return a_rows ? a_rows[r] / a_div : r;
}

// GEMM of row tile blockIdx.y, weight row tile blockIdx.x: one CTA per output tile (no
// stream-K), mmq_blk_body's warp specialization, ring and folds over all KB blocks; EPI 0: C f32
// [P, N] (sorted rows), 2: H f16 [P, N / 2] (the swiglu of gate|up rows interleaved per 16);
// TOK: the token operand has one scale per token. PERSIST (the _p entries, not yet measured on
// a GPU: the launcher's persistent=True): a grid of at most one CTA an SM walks the live tiles
// (toff[E] row tiles x the column tiles, column fastest) from blockIdx.x by gridDim.x, the ring
// running on across tiles, so the producer loads the next tile's blocks while the consumers
// store this one's; every tile's sums as the one-tile CTA's, bit for bit.
template <int EPI, bool TOK, bool PERSIST>
__device__ __forceinline__ void moe_blk_body(const uint8_t* __restrict__ Tt,
                                             const uint8_t* __restrict__ Wb, void* C,
                                             const int* __restrict__ offs,
                                             const int* __restrict__ toff, int E, int MT, int N,
                                             int K) {
    using S = BlkSmem;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if (!PERSIST && static_cast<int>(blockIdx.y) >= toff[E]) return;   // (uniform: no barrier yet)
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sbase = smem_raw + (base - raw);
    const uint32_t bars = base + STAGES * S::STAGE;   // full[s] at 8s, empty[s] at 8(STAGES + s)
    const int KB = (K + 127) / 128, nrow = (N + BN - 1) / BN;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            wgmma::mbar_init(bars + 8 * s, 1);
            wgmma::mbar_init(bars + 8 * (STAGES + s), T);
        }
    }
    __syncthreads();
    // this CTA's tiles i = first, first + step, ... < ntile; (mt, nt) of tile i
    const int first = PERSIST ? static_cast<int>(blockIdx.x) : 0;
    const int step = PERSIST ? static_cast<int>(gridDim.x) : 1;
    const int ntile = PERSIST ? toff[E] * nrow : 1;
    auto tile_of = [&](int i, int& mt, int& nt) {
        if constexpr (PERSIST) {
            mt = i / nrow;
            nt = i - mt * nrow;
        } else {
            mt = blockIdx.y;
            nt = blockIdx.x;
        }
    };
    uint32_t it = 0;   // stage it lives in slot it % STAGES
    if (threadIdx.x < 128) {   // producer: one thread issues every copy
        wgmma::setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        const size_t wstep = static_cast<size_t>(nrow) * OP, tstep = static_cast<size_t>(MT) * OP;
        for (int i = first; i < ntile; i += step) {
            int mt, nt;
            tile_of(i, mt, nt);
            const int e = moe_expert(toff, E, mt);
            const uint8_t* wp = Wb + static_cast<size_t>(e) * KB * wstep + nt * OP;
            const uint8_t* tp = Tt + static_cast<size_t>(mt) * OP;
            for (int q = 0; q < KB; ++q, ++it, wp += wstep, tp += tstep) {
                const uint32_t slot = it % STAGES, st = base + slot * S::STAGE;
                wgmma::mbar_wait(bars + 8 * (STAGES + slot), ((it / STAGES) & 1) ^ 1);
                wgmma::mbar_expect_tx(bars + 8 * slot, 2 * OP);
                wgmma::bulk_copy(st + S::W, wp, OP, bars + 8 * slot);
                wgmma::bulk_copy(st + S::X, tp, OP, bars + 8 * slot);
            }
        }
        return;
    }
    wgmma::setmaxnreg_inc<CONSUMER_REGS>();
    const int tid = threadIdx.x - 128, lane = tid & 31, warp = tid >> 5, cw = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int rw = cw * 64 + (warp & 3) * 16 + g;   // the thread's first weight row of the tile
    float z[64];
    int da[64], db[64];
    for (int i = first; i < ntile; i += step) {
#pragma unroll
        for (int k = 0; k < 64; ++k) z[k] = 0.f;
        constexpr int P = TOK ? 2 : 1;   // stages per fold (mmq_blk_body's, from block 0)
        int n = KB;
        for (; n >= P * BLK_GROUP; n -= P * BLK_GROUP)
            run_stages<BLK_GROUP, P, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        for (; n >= 2 * P; n -= 2 * P)
            run_stages<2, P, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        if constexpr (P == 2) {
            if (n >= 2) {
                run_stages<1, 2, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
                n -= 2;
            }
        }
        if (n) run_stages<1, 1, TOK>(z, da, db, it, base, sbase, bars, cw, rw, t);
        int mt, nt;
        tile_of(i, mt, nt);
        const int e = moe_expert(toff, E, mt);
        const int r0 = offs[e] + (mt - toff[e]) * BM;   // the tile's first sorted row
        const int rows = min(BM, offs[e + 1] - r0);     // its rows (the rest: padding, not stored)
        if constexpr (TOK) scale_tokens(z, Tt, mt, t);
        const int wr = nt * BN + rw;
        if constexpr (EPI == 2)
            store_glu<0>(z, static_cast<__half*>(C) + static_cast<size_t>(r0) * (N / 2), rows,
                         N / 2, 2 * t, wr);
        else store_t<false>(z, static_cast<float*>(C) + static_cast<size_t>(r0) * N, rows, N,
                            2 * t, wr);
    }
}
}  // namespace

// moe_blk_tok_swiglu: the gate|up GEMM (per-token operand of the gathered normed rows, W
// expert e's gate|up [2F, K] rows interleaved per 16) -> H f16 [P, F]; moe_blk: the down GEMM
// (per-(token, 128) operand of H's sorted rows) -> C f32 [P, N]. grid (ceil(N / 128), MT),
// block 384, blk_smem() of dynamic shared memory; the _p entries (PERSIST): grid (at most the
// SMs).
#define MOE_BLK_ENTRY(NAME, EPI, TOK, CT, PERSIST)                                              \
    extern "C" __global__ void __launch_bounds__(384, 1)                                        \
    NAME(const uint8_t* __restrict__ Tt, const uint8_t* __restrict__ Wb, CT* C,                \
         const int* __restrict__ offs, const int* __restrict__ toff, int E, int MT, int N,       \
         int K) {                                                                               \
        moe_blk_body<EPI, TOK, PERSIST>(Tt, Wb, C, offs, toff, E, MT, N, K);                    \
    }
MOE_BLK_ENTRY(moe_blk_tok_swiglu, 2, true, __half, false)
MOE_BLK_ENTRY(moe_blk, 0, false, float, false)
MOE_BLK_ENTRY(moe_blk_tok_swiglu_p, 2, true, __half, true)
MOE_BLK_ENTRY(moe_blk_p, 0, false, float, true)

// moe_blk_operand_f16 (per (token, 128) scales) / moe_blk_operand_f16_tok (per token): the
// token operand [KB][MT][OP] of the padded sorted rows (above): padded row pr's values are x
// row moe_src_row(pr) (x f16, row stride K), zeros for a padding row; the same lanes, rotation
// and rounding as blk_operand_f16 (pair 1) / blk_operand_f16_tok, so a tile's bytes equal those
// of the dense prepass on its 128 rows. Tiles past toff[E] are not written.
// grid (ceil(MT 128 KB / 64)) / (MT 128 / 8), block 256.
extern "C" __global__ void __launch_bounds__(256)
moe_blk_operand_f16(const __half* __restrict__ x, const int* __restrict__ a_rows, int a_div,
                    const int* __restrict__ offs, const int* __restrict__ toff, int E, int K,
                    int MT, uint8_t* __restrict__ out) {
    const int l = threadIdx.x & 3;
    const long long quad = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 2;
    const int KB = (K + 127) / 128, Rp = MT * 128;
    const bool in = quad < static_cast<long long>(Rp) * KB;   // (whole warps run the shuffles)
    const int pr = in ? static_cast<int>(quad % Rp) : 0;
    const int kb = in ? static_cast<int>(quad / Rp) : 0;
    bool live = false;
    const int src = in ? moe_src_row(a_rows, a_div, offs, toff, E, pr, live) : -1;
    float v[32];
    // (row 0 of a one-row matrix at the source row, or of an empty one: zeros)
    load32(v, src >= 0 ? x + static_cast<size_t>(src) * K : x, 0, src >= 0 ? 1 : 0, K, 0,
           kb * 128, l);
    const float amax = rotate128(v, l);
    if (!in || !live) return;
    uint8_t* blk = block_at(out, kb, Rp, pr);
    store32(blk, v, q8_inv(amax), pr & 127, l);
    if (l == 0) store_scale(blk, pr & 127, amax);
}

extern "C" __global__ void __launch_bounds__(256)
moe_blk_operand_f16_tok(const __half* __restrict__ x, const int* __restrict__ a_rows, int a_div,
                        const int* __restrict__ offs, const int* __restrict__ toff, int E, int K,
                        int MT, uint8_t* __restrict__ out) {
    const int l = threadIdx.x & 3, qd = (threadIdx.x >> 2) & 7;
    const int pr = blockIdx.x * 8 + (threadIdx.x >> 5);   // (the grid covers MT 128 rows exactly)
    const int KB = (K + 127) / 128, Rp = MT * 128;
    bool live;
    const int src = moe_src_row(a_rows, a_div, offs, toff, E, pr, live);   // (warp-uniform)
    if (!live) return;
    const __half* xr = src >= 0 ? x + static_cast<size_t>(src) * K : x;
    const int R = src >= 0 ? 1 : 0;
    float v[32], amax = 0.f;
    for (int kb0 = 0; kb0 < KB; kb0 += 8) {
        load32(v, xr, 0, R, K, 0, (kb0 + qd) * 128, l);
        amax = fmaxf(amax, rotate128(v, l));
    }
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float inv = q8_inv(amax);
    for (int kb0 = 0; kb0 < KB; kb0 += 8) {
        const int kb = kb0 + qd;
        load32(v, xr, 0, R, K, 0, kb * 128, l);
        rotate128(v, l);
        if (kb >= KB) continue;
        uint8_t* blk = block_at(out, kb, Rp, pr);
        store32(blk, v, inv, pr & 127, l);
        if (l == 0) store_scale(blk, pr & 127, amax);
    }
}
