// mmq_wgmma_q6k.cu: C[M, N] f32 = q8_1(A)[M, K] x q6_K(W)[N, K]^T on Hopper int8 tensor cores
// (wgmma m64n64k32 .s32.u8.u8, sm_90a only): the q6_K MMQ math of mmq_q6k.cu, re-laid for wgmma.
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
//
// q6_K scales change every 16 values, q8_1's every 32 (minfer.quants.mmq_ref): per 32-chunk c
// with halves h = 0, 1: y += da * sum_h dsv_h * S'_h, S'_h = sum_{k in h} qa * (q - 32),
// dsv_h = d * sc_h. A wgmma k-step sums 32 values, so the activations come zero-padded (each
// half-step sees only its 16) and the u8 offsets are undone around the integer result:
//   D_h = sum_{k in h} (qa + 128) * q  = S_h + 128 Q_h        (S_h = sum qa*q, Q_h = sum q)
//   S'_h = S_h - 32 A_h                                       (A_h = sum qa over the half)
// Epilogue, 3 FFMA per C value and chunk (D_h < 2^18 reads as the f32 denormal D_h * 2^-149):
//   t = fma(D_0, c_0, b); t = fma(D_1, c_1, t); y = fma(t, da * 2^75, y)
//   c_h = dsv_h * 2^74, b = -128 (sc_0 Q_0 + sc_1 Q_1) d 2^-75
// and the -32 A_h term is a [64 x 8] x [8 x 64] product per warpgroup and stage on tf32
// mma.sync m16n8k4 (3xTF32) straight into y (wm = -32 dsv_h per weight row, xs = da * A_h per
// token): the wgmma accumulator's per-warp fragment is the m16n8 C fragment.
//
// Operands (quantize_q8_1.cu's quantize_q8_1_split6 and mmq_repack.cu's repack_q6k_wgmma write
// them; numpy twins in minfer.quants.mmq_wgmma_ref):
//   Wq  uint8 [N, K]      q (0..63), natural k order
//   Xq  uint8 [M, 2K]     per chunk 64 B: [qa+128 of half 0 | 16 zeros | 16 zeros | qa+128 of half 1]
//   Tw  per (128-row tile, stage of 128 k) one 16 KB block: TB float4 [4 chunks][128 rows]
//       (c_0, c_1, b, 0), then TM uint4 [8 halves][64 row pairs] = wm as tf32 (hi, lo) of rows
//       r and r+8 of each 16-row group, (hi_r, hi_r+8, lo_r, lo_r+8): one load per mma A
//       fragment (as two uint2 per row, ptxas copied every fragment into a register pair)
//   Tx  per (64-token tile, stage) one 5 KB block: TD float [4][64] = da * 2^75, then TS uint2
//       [8][64] = xs as tf32 (hi, lo)
// so a stage's tables are two contiguous runs (one cp.async piece per thread and 16 B).
//
// Block: 2 warpgroups (256 threads, 1 block per SM), tile 128 weight rows x 64 tokens; here the
// weights are the wgmma's M side (warpgroup w: rows 64w..64w+63; each thread's two rows share
// one float4 of scales per chunk) and the tokens its N side. Per chunk the two half-steps are
// the pipelined pair (wait_group 1): the half-1 wgmma runs under the half-0 FFMAs, the next
// chunk's half 0 under the half-1 FFMAs. Stages of BK = 128 k filled by 16-byte cp.async
// STAGES-1 ahead (128-byte swizzle, wgmma_common.cuh). Persistent over work items (tiles
// M-fastest, then stream-K) like mmq_wgmma_q4k.cu. Stores: lane pairs swap values so each writes a float2 of two weight
// rows. Dynamic smem Q6Smem<STAGES>::BYTES.
// Entries: mmq_wgmma_q6k (C =) and mmq_wgmma_q6k_acc (C +=), both (Xq, Tx, Wq, Tw, C, M, N, K,
// dp, ws, flags), K % 128 == 0;
// dp, ws (float4 [gridDim][8][256]), flags as in mmq_wgmma_q4k.cu; every buffer under 2^31 B.
#include "gemm_f16_common.cuh"
#include "mmq_common.cuh"
#include "wgmma_common.cuh"

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

constexpr int BN = 128, BT = 64, BK = 128, KC = BK / 32;   // rows, tokens, k per stage, chunks
constexpr int TXB = KC * BT * 4 + 2 * KC * BT * 8;         // Tx block per (token tile, stage)
constexpr int TWB = KC * BN * 16 + 2 * KC * BN * 8;        // Tw block per (row tile, stage)

template <int STAGES>
struct Q6Smem {
    static constexpr int W = BN * BK, X = BT * 2 * BK;      // swizzled tiles (X: two of 64 x 128 B)
    static constexpr int STAGE = W + X + TXB + TWB;
    static constexpr int BYTES = STAGES * STAGE + 1024;     // + manual 1 KB alignment
};
static_assert(TXB == 5120 && TWB == 16384, "q6_K wgmma table blocks");
static_assert(Q6Smem<3>::STAGE == 54272 && Q6Smem<3>::BYTES == 163840, "q6_K wgmma smem");
static_assert(Q6Smem<3>::STAGE % 1024 == 0, "stages keep the 1024-byte tile alignment");
static_assert(sizeof(float4) == 16 && sizeof(uint2) == 8, "table entries");

// The block's cp.async pieces of one stage (16 B each, 256 threads): W 128 rows x 8 (4 per
// thread, rows 32 apart), X 64 rows x 16 (4 per thread, rows 16 apart; pieces 8..15 of a row go
// to the second tile), rows past N / M zero-filled; Tw 1024 pieces (4 per thread), Tx 320.
struct Copier6 {
    static constexpr int T = 256;
    uint32_t w, x, tx, tw, dst_w, dst_x, mask;

    __device__ __forceinline__ Copier6(int m0, int n0, int M, int N, int K, int KT, int tid) {
        const int rw = tid >> 3, cw = tid & 7, rx = tid >> 4, cx = tid & 15;
        dst_w = rw * 128 + ((cw ^ (rw & 7)) << 4);
        dst_x = (cx >> 3) * (BT * 128) + rx * 128 + (((cx & 7) ^ (rx & 7)) << 4);
        w = (uint32_t)min(n0 + rw, N - 1) * K + cw * 16;
        x = (uint32_t)min(m0 + rx, M - 1) * (2 * K) + cx * 16;
        mask = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            mask |= (n0 + rw + 32 * i < N ? 1u : 0u) << i;
            mask |= (m0 + rx + 16 * i < M ? 1u : 0u) << (4 + i);
        }
        tx = ((uint32_t)(m0 / BT) * KT) * TXB + tid * 16;
        tw = ((uint32_t)(n0 / BN) * KT) * TWB + tid * 16;
    }

    __device__ __forceinline__ void issue(uint32_t sb, int kt, const uint8_t* Xq, const uint8_t* Tx,
                                          const uint8_t* Wq, const uint8_t* Tw, int K,
                                          int tid) const {
        using S = Q6Smem<MMQ_WG_STAGES>;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            cp_async16(sb + dst_w + i * 32 * 128, Wq + (w + i * 32 * K + kt * BK), (mask >> i) & 1);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            cp_async16(sb + S::W + dst_x + i * 16 * 128, Xq + (x + i * 16 * 2 * K + kt * 2 * BK),
                       (mask >> (4 + i)) & 1);
        const uint32_t stx = sb + S::W + S::X, stw = stx + TXB;
        cp_async16(stx + tid * 16, Tx + (tx + kt * TXB), true);
        if (tid < TXB / 16 - T) cp_async16(stx + T * 16 + tid * 16, Tx + (tx + kt * TXB + T * 16), true);
#pragma unroll
        for (int i = 0; i < TWB / 16 / T; ++i)
            cp_async16(stw + i * T * 16 + tid * 16, Tw + (tw + kt * TWB + i * T * 16), true);
        gemm_f16::cp_async_commit();
    }
};

template <bool ACC>   // ACC: C += (reductions), else C =
__device__ __forceinline__ void mmq_wgmma_q6k_body(const uint8_t* __restrict__ Xq,
                                                   const uint8_t* __restrict__ Tx,
                                                   const uint8_t* __restrict__ Wq,
                                                   const uint8_t* __restrict__ Tw, float* C, int M,
                                                   int N, int K, int dp, float4* ws,
                                                   int* flags) {
    constexpr int STAGES = MMQ_WG_STAGES, NI = BT / 8;
    using S = Q6Smem<STAGES>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint8_t* sgen = smem_raw + (base - raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int mtiles = (M + BT - 1) / BT, ntiles = mtiles * ((N + BN - 1) / BN);
    const int KT = K / BK;
    const int ra = wg * 64 + (warp & 3) * 16 + g;   // this thread's rows ra, ra + 8 in the tile
    const bool vec = (N & 1) == 0;                  // float2 stores: row even, row + 1 < N

    float acc[NI][4];   // acc[i]: (ra, tok 8i+2t), (ra, 8i+2t+1), (ra+8, 8i+2t), (ra+8, 8i+2t+1)
#pragma unroll
    for (int i = 0; i < NI; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    int d[2][32];     // the two halves' wgmma results (the pipelined pair)
    float th[32];     // half 0's partial t

    wgmma::TileSched sched{ntiles, dp, KT, 0};   // work items as in mmq_wgmma_q4k.cu
    wgmma::Work w;
    if (!sched.next(w)) return;
    int m0 = (w.tile % mtiles) * BT, n0 = (w.tile / mtiles) * BN;
    Copier6 cp(m0, n0, M, N, K, KT, tid);
    wgmma::ring_prologue<STAGES, S::STAGE>(cp, base, w.k0, w.k1, Xq, Tx, Wq, Tw, K, tid);
    while (true) {
        for (int kt = w.k0; kt < w.k1; ++kt) {
            wgmma::ring_next<STAGES, S::STAGE>(cp, base, kt, w.k1, Xq, Tx, Wq, Tw, K, tid);
            const int so = (kt % STAGES) * S::STAGE;
            const uint32_t sw = base + so + wg * 64 * 128, sx = base + so + S::W;
            const uint8_t* tbase = sgen + so + S::W + S::X;
            const float* td = reinterpret_cast<const float*>(tbase);                 // [4][64]
            const uint2* ts = reinterpret_cast<const uint2*>(tbase + KC * BT * 4);    // [8][64]
            const float4* tb = reinterpret_cast<const float4*>(tbase + TXB);          // [4][128]
            const uint4* tm = reinterpret_cast<const uint4*>(tbase + TXB + KC * BN * 16);  // [8][64]
            // descriptors of the stage's tiles; a k-step adds its byte offset / 16 (the start
            // address field: offsets stay inside the 256 KB shared window, no carry)
            const uint64_t dw = wgmma::sw128_desc(sw), dx = wgmma::sw128_desc(sx);
            auto issue = [&](int c, int b) {   // chunk c's half b into d[b]
                wgmma::fence();
                wgmma::igmma_m64n64k32(d[b], dw + c * 2,
                                       dx + ((c >> 1) * (BT * 128) + (c & 1) * 64 + b * 32) / 16);
                wgmma::commit();
            };
            issue(0, 0);
            issue(0, 1);
#pragma unroll
            for (int c = 0; c < KC; ++c) {
                const float4 ea = tb[c * BN + ra], eb = tb[c * BN + ra + 8];   // (c0, c1, b, 0)
                float2 dv[NI];   // da * 2^75 of tokens 8i + 2t, + 1
#pragma unroll
                for (int i = 0; i < NI; ++i)
                    dv[i] = *reinterpret_cast<const float2*>(td + c * BT + i * 8 + 2 * t);
                wgmma::wait<1>();   // half 0 of chunk c done; half 1 may still run
                wgmma::fence_regs(d[0]);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    th[4 * i + 0] = fmaf(__int_as_float(d[0][4 * i + 0]), ea.x, ea.z);
                    th[4 * i + 1] = fmaf(__int_as_float(d[0][4 * i + 1]), ea.x, ea.z);
                    th[4 * i + 2] = fmaf(__int_as_float(d[0][4 * i + 2]), eb.x, eb.z);
                    th[4 * i + 3] = fmaf(__int_as_float(d[0][4 * i + 3]), eb.x, eb.z);
                }
                if (c + 1 < KC) issue(c + 1, 0);
                if (c + 1 < KC) wgmma::wait<1>();
                else wgmma::wait<0>();
                wgmma::fence_regs(d[1]);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    float(&y)[4] = acc[i];
                    y[0] = fmaf(fmaf(__int_as_float(d[1][4 * i + 0]), ea.y, th[4 * i + 0]), dv[i].x, y[0]);
                    y[1] = fmaf(fmaf(__int_as_float(d[1][4 * i + 1]), ea.y, th[4 * i + 1]), dv[i].y, y[1]);
                    y[2] = fmaf(fmaf(__int_as_float(d[1][4 * i + 2]), eb.y, th[4 * i + 2]), dv[i].x, y[2]);
                    y[3] = fmaf(fmaf(__int_as_float(d[1][4 * i + 3]), eb.y, th[4 * i + 3]), dv[i].y, y[3]);
                }
                if (c + 1 < KC) issue(c + 1, 1);
            }
            // -32 A_h term of the stage: y[r][tok] += sum_h wm[h][r] * xs[h][tok], two k4 steps
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const uint4 wa = tm[(4 * q + t) * (BN / 2) + (ra >> 4) * 8 + g];   // rows ra, ra+8
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const uint2 xb = ts[(4 * q + t) * BT + i * 8 + g];
                    wgmma::mma_tf32_k4(acc[i], wa.x, wa.y, xb.x);
                    wgmma::mma_tf32_k4(acc[i], wa.x, wa.y, xb.y);
                    wgmma::mma_tf32_k4(acc[i], wa.z, wa.w, xb.x);
                }
            }
        }
        const int sm0 = m0, sn0 = n0;
        const wgmma::Work cur = w;
        const bool more = sched.next(w);
        __syncthreads();   // every warp is done with the stages
        if (more) {
            m0 = (w.tile % mtiles) * BT;
            n0 = (w.tile / mtiles) * BN;
            cp = Copier6(m0, n0, M, N, K, KT, tid);
            wgmma::ring_prologue<STAGES, S::STAGE>(cp, base, w.k0, w.k1, Xq, Tx, Wq, Tw, K, tid);
        }
        if (cur.k0 > 0) {   // a stream-K tail: its sums go to the block with the head
            wgmma::sk_put<NI * 4, 256>(ws, flags, &acc[0][0]);
        } else if (cur.k1 < KT) {
            wgmma::sk_add<NI * 4, 256>(ws, flags, &acc[0][0]);
        }
        // C[tok][row]: lanes g and g^1 (lane ^ 4) swap so that each holds two adjacent rows of
        // one token: even g stores (tok, rows r, r+1), odd g (tok+1, rows r-1, r). The swap
        // rewrites acc[i][2u..2u+1] as that pair.
        const int odd = g & 1;
        if (cur.k0 == 0) {   // (a tail stores nothing)
#pragma unroll
            for (int i = 0; i < NI; ++i)
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const float v0 = acc[i][2 * u], v1 = acc[i][2 * u + 1];
                    const float recv = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                    acc[i][2 * u] = odd ? recv : v0;
                    acc[i][2 * u + 1] = odd ? v1 : recv;
                }
            auto each = [&](auto&& f) {   // each (C pointer, float2 of acc) of the thread
#pragma unroll
                for (int i = 0; i < NI; ++i)
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        const int tok = sm0 + i * 8 + 2 * t + odd, row = sn0 + ra + 8 * u - odd;
                        if (tok < M && row < N)
                            f(C + (size_t)tok * N + row, acc[i][2 * u], acc[i][2 * u + 1],
                              row + 1 < N);
                    }
            };
            if constexpr (ACC)   // C += as reductions (wgmma_common.cuh red_c2)
                each([&](float* p, float& y0, float& y1, bool second) {
                    wgmma::red_c2(p, make_float2(y0, y1), vec, second);
                });
            else
                each([&](float* p, float& y0, float& y1, bool second) {
                    wgmma::store_c2(p, make_float2(y0, y1), vec, second);
                });
        }
        if (!more) break;
#pragma unroll
        for (int i = 0; i < NI; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    }
    gemm_f16::cp_async_wait<0>();
}

}  // namespace

// C = and C += (reductions) as two entries, the launcher picks (measured: the same k-loop
// speed as one kernel with a runtime flag; 7-21% faster on C += than a load-add-store per pair)
extern "C" __global__ void __launch_bounds__(256, 1)
mmq_wgmma_q6k(const uint8_t* __restrict__ Xq, const uint8_t* __restrict__ Tx,
              const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M,
              int N, int K, int dp, float4* ws, int* flags) {
    mmq_wgmma_q6k_body<false>(Xq, Tx, Wq, Tw, C, M, N, K, dp, ws, flags);
}

extern "C" __global__ void __launch_bounds__(256, 1)
mmq_wgmma_q6k_acc(const uint8_t* __restrict__ Xq, const uint8_t* __restrict__ Tx,
                  const uint8_t* __restrict__ Wq, const uint8_t* __restrict__ Tw, float* C, int M,
                  int N, int K, int dp, float4* ws, int* flags) {
    mmq_wgmma_q6k_body<true>(Xq, Tx, Wq, Tw, C, M, N, K, dp, ws, flags);
}
