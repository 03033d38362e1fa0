// mmq_sb_q4k.cu: C[M, N] f32 = q8s(A)[M, K] x q4_K(W)[N, K]^T on Hopper int8 tensor cores with
// one weight byte per value and the sub-scale folded per 32-chunk in FP32 (wgmma m64n128k32
// .s32.u8.u8, sm_90a only; warp-specialized).
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// The super-block ("SB") q4_K kernel: the activations are q8s (qa + 128, one scale da per token
// and 256 values, so a super-block's chunks share every float scale), the weight is v, the
// q4_K nibble, one byte per value (an earlier form folded sc into two int8 planes, sc v needing
// 10 bits: twice the tensor work; docs/mmq.md). Per chunk c the tensor core
// sums S_c = sum_k (qa + 128) v (< 2^17: an f32 denormal) and one FFMA per C value carries it
// into z with the weight row's factor:
//   z = fma(S_c, mc, z),  mc = d sc_c 2^74
// z counts in units of the token's dc = da 2^75 of the current super-block, so a super-block
// starts with z = fma(z, r, b) (r = dc_old / dc_new, b = f32(-128 sum_c sc_c V_c) d 2^-75 the
// row's bias) and the work item ends with y = z dc. The min term sum_c (da s_c / dc)(-dmin m_c)
// = fmin I, fmin = -dmin 2^-75 per row, I = sum_c m_c s_c: one f16 wgmma (k16) of integers,
// A = [m_c | 64 m_c] (registers), B = [lo_c | hi_c] with s_c = 64 hi_c + lo_c (the chunk's
// sum of q), exact in its f32 accumulator (|I| < 2^21), into the chunk buffer that chunk 6's
// fold frees; one FFMA per C value after chunk 7's fold. (It was 3 tf32 wgmmas, 3xTF32:
// three times the tensor time.) Math and layouts: the numpy twins in minfer.quants.mmq_sb_ref
// (emulate_sb_q4k spells the arithmetic out).
// Operands, one block per (super-block, 128-row / 128-token tile), each of its two stages one
// contiguous piece (mmq_sb_layout.cuh):
//   Wb  [K/256][Np/128] blocks of 41984 B   v images + mc / b / fmin / Am (mmq_repack.cu
//                                            repack_q4k_sb)
//   Tt  [K/256][Mp/128] blocks of 37888 B   qa + 128 images + r / B / dc (quantize_q8_1.cu
//                                            q8s_sb_operand, or sb_token_tables on a split)
// The wgmma's M side is the weight rows, its N side the tokens: a thread's C values z[4i + j]
// are weight row 64w + 16 (warp % 4) + g + 8 (j / 2) and token 8i + 2t + j % 2 of the 128 x 128
// tile (w the consumer warpgroup, g = lane / 4, t = lane % 4), so a chunk's fold needs the
// factors of two rows (one float2) and the per-token factors come once per super-block.
// Block: 384 threads, 1 per SM. One thread of warpgroup 0 copies (two bulk copies per 128-k
// stage into a 5-slot ring, completion on the slot's `full` mbarrier by transaction bytes; 128
// threads issuing 16-byte cp.async took a quarter of the issue slots (ncu));
// warpgroups 1, 2 own weight rows 0..63 and 64..127 of the tile, issue the wgmmas (chunk q into buffer q % 2, the next chunk in flight
// under each fold) and release a slot on its `empty` mbarrier after their last read of it;
// setmaxnreg gives them the producer's registers. Persistent over work items in super-block
// units, then stream-K (wgmma_common.cuh TileSched; the exchange among the consumers).
// Entries: mmq_sb_q4k (C =) and mmq_sb_q4k_acc (C +=, reductions), both (Tt, Wb, C, M, N, K,
// dp, ws, flags), and mmq_sb_q4k_swiglu (Tt, Wb, H, M, N, K, dp, ws, flags): H f16 [M, N/2] =
// swiglu of the gate|up product, the weight's rows interleaved per 16 (store_swiglu; N % 16 ==
// 0); K % 256 == 0; build option SB_GLU_EXACT (tests); ws float4 [gridDim][16][256], flags as in
// wgmma_common.cuh TileSched; every buffer under 2^31 B. Dynamic smem SbSmem::BYTES.
#include "gemm_f16_common.cuh"
#include "mmq_common.cuh"
#include "mmq_sb_layout.cuh"
#include "wgmma_common.cuh"
#include "wgmma_int8.cuh"

namespace {
using gemm_f16::smem_u32;
using sbop::IMG;
using sbop::TBLK;
using sbop::TH0;
using sbop::WBLK;
using sbop::WH0;

constexpr int BM = 128, BN = 128, BK = 128, T = 256;   // tile (tokens, rows), stage, consumers
#ifndef SB_STAGES   // the ring depth (the launcher sizes smem for it: mmq_sb.sb_smem)
#define SB_STAGES 5
#endif
constexpr int STAGES = SB_STAGES;
constexpr int CONSUMER_REGS = 232, PRODUCER_REGS = 40;
// setmaxnreg moves registers within the block's launch allocation (168 per thread at 384
// threads): a consumer increase beyond what the producer released would wait forever
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * 168, "register budget");

// A stage: the weight piece of the operand block (image, tables) at W, the token piece at X
// (the second stage's pieces are the larger: the tables' rest)
struct SbSmem {
    static constexpr int W = 0, WT = W + IMG;                    // weight image, tables
    static constexpr int X = 23 * 1024, TT = X + IMG;            // token image, tables
    static constexpr int STAGE = 44 * 1024;                      // TT + TBLK - TH0 = 44544
    static constexpr int BYTES = STAGES * STAGE + 1024 + 16 * STAGES;   // + alignment, mbarriers
};
static_assert(BM * BK == IMG && BN * BK == IMG, "a stage image is a 128 x 128 B tile");
static_assert(SbSmem::TT + (TBLK - TH0) <= SbSmem::STAGE && SbSmem::STAGE % 1024 == 0 &&
              SbSmem::X % 1024 == 0, "stage layout");
static_assert(SbSmem::X >= SbSmem::WT + (WBLK - WH0), "stage layout");
static_assert(SbSmem::BYTES == 44 * 1024 * STAGES + 1024 + 16 * STAGES, "sb smem");

__device__ __forceinline__ void igmma(int (&d)[64], uint64_t a, uint64_t b) {   // d = A B
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 "
        WG_R64
        "%64, %65, 0;\n"
        : WG_D64
        : "l"(a), "l"(b));
}

// d (the f32 bits of an m64n128 fragment, in an s32 buffer) = A (64x16 f16 from registers:
// a0 = row g, k 2t, 2t+1; a1 = row g+8, the same k; a2, a3 = the same rows at k 2t+8, 2t+9;
// 16 rows per warp) * B (16x128 f16, desc)
__device__ __forceinline__ void hgmma_into(int (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        WG_R64
        "{%64, %65, %66, %67}, %68, 0, 1, 1, 0;\n"
        : WG_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// One stage into slot `st`: the weight piece w (wbytes: the image of its 128 k, the tables'
// part) and the token piece t of a super-block's operand blocks, one bulk copy each, completing
// on the slot's `full` barrier (issued by one thread)
__device__ __forceinline__ void copy_stage(uint32_t st, uint32_t full, const uint8_t* w,
                                           uint32_t wbytes, const uint8_t* t, uint32_t tbytes) {
    wgmma::mbar_expect_tx(full, wbytes + tbytes);
    wgmma::bulk_copy(st + SbSmem::W, w, wbytes, full);
    wgmma::bulk_copy(st + SbSmem::X, t, tbytes, full);
}

// z[k] += S (the chunk's s32 fragment read as f32 denormals) * the factor of its row (m.x for
// the thread's row g, m.y for g + 8)
__device__ __forceinline__ void fold(float (&z)[64], const int (&d)[64], float2 m) {
#pragma unroll
    for (int k = 0; k < 64; ++k) z[k] = fmaf(__int_as_float(d[k]), (k & 2) ? m.y : m.x, z[k]);
}

// the previous chunk's buffer (db when `odd`, a constant once the caller unrolls), after the
// wgmma wait: its reads stay after the wait, then the fold
__device__ __forceinline__ void fold_buf(float (&z)[64], int (&da)[64], int (&db)[64], bool odd,
                                         float2 m) {
    if (odd) { wgmma::fence_regs(db); fold(z, db, m); }
    else { wgmma::fence_regs(da); fold(z, da, m); }
}

// the factor of fragment value k's token in a fold-order float4 of the token tables (v: the
// one of n8 groups 2p, 2p+1, p = k / 8)
__device__ __forceinline__ float token_factor(float4 v, int k) {
    return (k & 4) ? ((k & 1) ? v.w : v.z) : ((k & 1) ? v.y : v.x);
}

// a new super-block: z = z r + b (r: the token's dc ratio, from the token table in fold order;
// b: the row's bias)
__device__ __forceinline__ void rescale(float (&z)[64], const float4* r, float2 b, int t) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {   // tokens 16p + 2t (+1), 16p + 8 + 2t (+1)
        const float4 v = r[p * 4 + t];
#pragma unroll
        for (int k = 8 * p; k < 8 * p + 8; ++k)
            z[k] = fmaf(z[k], token_factor(v, k), (k & 2) ? b.y : b.x);
    }
}

// y = z dc of the item's last super-block (dc: the token table's, in fold order)
__device__ __forceinline__ void scale_dc(float (&z)[64], const float4* dc, int t) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {
        const float4 v = dc[p * 4 + t];
#pragma unroll
        for (int k = 8 * p; k < 8 * p + 8; ++k) z[k] *= token_factor(v, k);
    }
}

// EPI: 0 C = (f32 [M, N]), 1 C += (reductions), 2 the swiglu epilogue (C is H f16 [M, N / 2])
template <int EPI>
__device__ __forceinline__ void mmq_sb_body(const uint8_t* __restrict__ Tt,
                                             const uint8_t* __restrict__ Wb, void* C, int M,
                                             int N, int K, int dp, float4* ws, int* flags) {
    using S = SbSmem;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sbase = smem_raw + (base - raw);
    const uint32_t bars = base + STAGES * S::STAGE;   // full[s] at 8s, empty[s] at 8(STAGES + s)
    const int ntok = (M + BM - 1) / BM, ntiles = ntok * ((N + BN - 1) / BN);
    const int KS = K / 256;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            wgmma::mbar_init(bars + 8 * s, 1);
            wgmma::mbar_init(bars + 8 * (STAGES + s), T);
        }
    }
    __syncthreads();
    wgmma::TileSched sched{ntiles, dp, KS, 0};
    wgmma::Work w;
    uint32_t it = 0;   // the block's running stage count: stage it lives in slot it % STAGES
    if (threadIdx.x < 128) {   // producer: one thread issues every copy
        wgmma::setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        // (32-bit offsets: the launcher keeps both operands under 2^31 bytes)
        const uint32_t wstep = (N + BN - 1) / BN * sbop::WOP, tstep = ntok * sbop::TOP;
        // (ntiles made opaque per item: hoisting next()'s 64-bit products spilled at 40 registers)
        while (true) {
            asm volatile("" : "+r"(sched.ntiles));
            if (!sched.next(w)) break;
            // the item's super-blocks: their blocks are wstep / tstep apart
            uint32_t wo = w.tile / ntok * sbop::WOP + w.k0 * wstep;
            uint32_t to = w.tile % ntok * sbop::TOP + w.k0 * tstep;
            for (int q = w.k0; q < w.k1; ++q, wo += wstep, to += tstep) {
#pragma unroll
                for (int s = 0; s < 2; ++s, ++it) {
                    const uint32_t slot = it % STAGES;
                    wgmma::mbar_wait(bars + 8 * (STAGES + slot), ((it / STAGES) & 1) ^ 1);
                    copy_stage(base + slot * S::STAGE, bars + 8 * slot, Wb + wo + s * (IMG + WH0),
                               s ? IMG + WBLK - WH0 : IMG + WH0, Tt + to + s * (IMG + TH0),
                               s ? IMG + TBLK - TH0 : IMG + TH0);
                }
            }
        }
        return;
    }
    wgmma::setmaxnreg_inc<CONSUMER_REGS>();
    const int tid = threadIdx.x - 128, lane = tid & 31, warp = tid >> 5, cw = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int pair = (cw * 4 + (warp & 3)) * 8 + g;    // its rows' float2 in the row tables
    float z[64];
    int da[64], db[64];
    while (sched.next(w)) {
#pragma unroll
        for (int k = 0; k < 64; ++k) z[k] = 0.f;
        // (only the count lives across the loop: the item is derived again at its end)
        const int nsb = w.k1 - w.k0;
        for (int q = 0; q < nsb; ++q) {   // super-blocks, their two stages unrolled: at the loop
            // edge no wgmma is in flight (ptxas would serialize every one)
            const uint32_t s0 = it % STAGES, s1 = (it + 1) % STAGES;
            const uint32_t o0 = base + s0 * S::STAGE, o1 = base + s1 * S::STAGE;
            const uint8_t* p0 = sbase + s0 * S::STAGE;
            const uint8_t* p1 = sbase + s1 * S::STAGE;
            // ---- first stage: chunks 0..3 issued, 0..2 folded ----
            wgmma::mbar_wait(bars + 8 * s0, (it / STAGES) & 1);   // (bulk copies: async proxy)
            rescale(z, reinterpret_cast<const float4*>(p0 + S::TT),
                    reinterpret_cast<const float2*>(p0 + S::WT + 2048)[pair], t);
            // descriptors: a k-step of 32 bytes is +2 in the start-address field
            const uint64_t a0 = wgmma::sw128_desc(o0 + S::W + cw * 64 * 128);
            const uint64_t b0 = wgmma::sw128_desc(o0 + S::X);
            wgmma::fence();
            igmma(da, a0, b0);
            wgmma::commit();
#pragma unroll
            for (int c = 1; c < 4; ++c) {
                wgmma::fence();
                igmma(c & 1 ? db : da, a0 + 2 * c, b0 + 2 * c);
                wgmma::commit();
                const float2 m = reinterpret_cast<const float2*>(p0 + S::WT + (c - 1) * 512)[pair];
                wgmma::wait<1>();
                fold_buf(z, da, db, !(c & 1), m);   // chunk c - 1
            }
            // ---- second stage: chunks 4..7 issued, 3..7 folded, the min term ----
            wgmma::mbar_wait(bars + 8 * s1, ((it + 1) / STAGES) & 1);
            const uint64_t a1 = wgmma::sw128_desc(o1 + S::W + cw * 64 * 128);
            const uint64_t b1 = wgmma::sw128_desc(o1 + S::X);
            uint4 am;   // the min term's A operand (loaded under chunk 6's fold)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                wgmma::fence();
                igmma(c & 1 ? db : da, a1 + 2 * c, b1 + 2 * c);
                wgmma::commit();
                const float2 m =
                    c == 0 ? reinterpret_cast<const float2*>(p0 + S::WT + 3 * 512)[pair]
                           : reinterpret_cast<const float2*>(p1 + S::WT + (c - 1) * 512)[pair];
                if (c == 3) am = reinterpret_cast<const uint4*>(p1 + S::WT + 2560)[pair * 4 + t];
                wgmma::wait<1>();
                fold_buf(z, da, db, !(c & 1), m);   // chunk 3 + c
                if (c == 0) wgmma::mbar_arrive(bars + 8 * (STAGES + s0));   // first stage read
            }
            // the min term into the free buffer (chunk 6 is folded) while chunk 7 finishes: one
            // f16 wgmma of integers, B = the token tables' [lo | hi] core matrices
            const float2 m7 = reinterpret_cast<const float2*>(p1 + S::WT + 3 * 512)[pair];
            const uint32_t ah[4] = {am.x, am.y, am.z, am.w};
            wgmma::fence();
            hgmma_into(da, ah, wgmma::plain_desc(o1 + S::TT, 128, 256));
            wgmma::commit();
            wgmma::wait<1>();   // chunk 7
            wgmma::fence_regs(db);
            fold(z, db, m7);
            const float2 fm = reinterpret_cast<const float2*>(p1 + S::WT + 2048)[pair];
            wgmma::wait<0>();   // the min term: z += I fmin (I exact, read as f32)
            wgmma::fence_regs(da);
            fold(z, da, fm);
            it += 2;
            if (q + 1 < nsb) wgmma::mbar_arrive(bars + 8 * (STAGES + s1));
        }
        {
            wgmma::TileSched again{ntiles, dp, KS, sched.i - 1};
            again.next(w);
        }
        // y = z dc of the item's last super-block (from its second stage's slot, then released)
        const uint32_t sl = (it + STAGES - 1) % STAGES;
        scale_dc(z, reinterpret_cast<const float4*>(sbase + sl * S::STAGE + S::TT + 4096), t);
        wgmma::mbar_arrive(bars + 8 * (STAGES + sl));
        // a stream-K tail publishes its values, a head adds its tail's; then the stores
        if (w.k0 > 0) {
            wgmma::sk_put<64, T, 128>(ws, flags, z);
        } else {
            if (w.k1 < KS) wgmma::sk_add<64, T, 128>(ws, flags, z);
            const int rw = (pair >> 3) * 16 + g;   // the thread's first weight row
            const int m0 = (w.tile % ntok) * BM + 2 * t, r0 = (w.tile / ntok) * BN + rw;
            if constexpr (EPI == 2) store_swiglu(z, static_cast<__half*>(C), M, N / 2, m0, r0);
            else store_t<EPI == 1>(z, static_cast<float*>(C), M, N, m0, r0);
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
mmq_sb_q4k(const uint8_t* __restrict__ Tt, const uint8_t* __restrict__ Wb, float* C, int M,
            int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_body<0>(Tt, Wb, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(384, 1)
mmq_sb_q4k_acc(const uint8_t* __restrict__ Tt, const uint8_t* __restrict__ Wb, float* C,
                int M, int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_body<1>(Tt, Wb, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(384, 1)
mmq_sb_q4k_swiglu(const uint8_t* __restrict__ Tt, const uint8_t* __restrict__ Wb, __half* H,
                  int M, int N, int K, int dp, float4* ws, int* flags) {
    mmq_sb_body<2>(Tt, Wb, H, M, N, K, dp, ws, flags);
}
