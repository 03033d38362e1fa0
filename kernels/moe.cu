// moe.cu: the mixture-of-experts FFN on the GPU (llama.cpp's build_moe_ffn with softmax gating:
// qwen3moe, Mixtral). Launchers and numpy twins: minfer/cuda/ops/moe.py; the layer that runs them:
// minfer/cuda/load/moe.py. Per layer, T tokens, E experts, k used per token, P = T * k (token, slot)
// pairs, pair p = t * k + j (j: the slot's rank):
//
//   moe_route_f32      logits f32 [T, E] (the router GEMM's output) -> sel int32 [T, k] (expert
//                      ids in rank order: probability descending, the lower id first among equal
//                      probabilities) and wts f32 [T, k] (their softmax probabilities, divided by
//                      their sum clamped to 6.1035e-5 when norm_w, times w_scale when it is
//                      neither 0 nor 1). A warp per token, E <= 512 (16 values a lane), 4 warps
//                      a block: grid (ceil(T / 4)), block (128).
//   moe_sort           sel (P ids) -> offs int32 [E + 1] (expert e's rows of the expert-sorted
//                      order are offs[e] .. offs[e + 1]), toff int32 [E + 1] (the prefix of each
//                      expert's row tiles of bm rows: the grouped GEMM's tile scheduler), perm
//                      int32 [P] (sorted row -> pair), rowpos int32 [P] (pair -> sorted row).
//                      One block of 1024 threads: a shared-memory histogram, a scan, then each
//                      pair takes the next row of its expert (atomics: the order of the rows
//                      within an expert is not fixed; every GEMM row is computed on its own, so
//                      the results are). grid (1), block (1024).
//   moe_mma_f16_glu    the "m-grouped contiguous" grouped GEMM (DeepGEMM / CUTLASS grouped GEMM):
//   moe_mma_f16        one launch over (column tile, global row tile); a row tile belongs to
//                      the expert e with toff[e] <= tile < toff[e + 1] (binary search) and covers
//                      rows offs[e] + (tile - toff[e]) * 64 .. (clipped to offs[e + 1]); tiles
//                      past toff[E] exit. C rows r = A row a(r) @ W[e].T with W [E, N, K] f16
//                      (GGUF's stacked ffn_*_exps, dequantized), a(r) = a_rows[r] / a_div when
//                      a_rows is given (the gather of the normed activations: a_rows = perm,
//                      a_div = k gives the token of each pair), else r. _glu: W [E, 2F, K] each
//                      expert's gate|up rows interleaved per 16 (8 gate, their 8 up: the dense
//                      f16 glu layout), C f16 [P, F] = silu(A gate^T) * (A up^T) (swiglu.cuh's
//                      rounding); plain: C f32 [P, N] = A W^T. The dense f16 path's tile
//                      (gemm_f16_common.cuh): 64 x 128 x 32, 4 warps, a 4-deep cp.async
//                      pipeline, ldmatrix, mma.sync m16n8k16, its epilogues. K % 8 == 0 (a K
//                      tail zero-filled), any N (F % 8 == 0). grid (ceil(N / 128), max row
//                      tiles), block (128), 48 KiB of dynamic shared memory.
//   moe_gemm_f16_glu   the same GEMMs, one simple kernel (the control: wmma 16x16x16 fragments,
//   moe_gemm_f16       64 x 64 x 32 tiles, 4 warps of 32 x 32, registers to shared memory, no
//                      pipeline); _glu: N = F (W has 2F rows, interleaved as above), Ch f16;
//                      plain: Cf f32. grid (ceil(N / 64), max row tiles), block (128).
//   moe_combine_f32    x f32 [T, D] += sum over j in rank order of wts[t, j] * ys[rowpos[t k + j]]
//                      (ys f32 [P, D]: the down GEMM's rows), each product and sum rounded on its
//                      own (no FMA: the twin is exact). grid (T), block (256).
//   moe_shared_add_f32 qwen2moe's shared expert: x f32 [T, D] += sigmoid(gl[t]) * y[t, :] (gl f32
//                      [T]: h . ffn_gate_inp_shexp, the f16 GEMM's; y f32 [T, D]: the shared
//                      SwiGLU's down GEMM), the sigmoid 1 / (1 + expf(-g)) (llama.cpp writes
//                      silu(g) / g: the same to an ulp), product and sum rounded on their own.
//                      grid (T), block (256).
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

#include "gemm_f16_common.cuh"  // the dense f16 tile's pieces (cp.async, ldmatrix, mma, epilogues)
#include "swiglu.cuh"           // swiglu1

#define MOE_MAX_E 512    // llama.cpp's LLAMA_MAX_EXPERTS
#define ROUTE_PER 16     // MOE_MAX_E / 32: router values a lane holds
#define GBM 64           // grouped GEMM block tile: rows
#define GBN 64           // columns
#define GBK 32           // depth per step
#define GLD (GBK + 8)    // shared A / B row stride (halves): 80 B rows, 16-byte aligned
#define CLD (GBN + 4)    // shared C row stride (floats)

static_assert(ROUTE_PER * 32 == MOE_MAX_E, "router values per lane");
static_assert(GBM * GBK / 8 == 256 && GBN * GBK / 8 == 256, "two 16-byte chunks per thread");

// ---- routing -----------------------------------------------------------------------------------
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(128)
    moe_route_f32(int* __restrict__ sel, float* __restrict__ wts, const float* __restrict__ logits,
                  int T, int E, int k, int norm_w, float w_scale) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (t >= T) return;  // (uniform per warp)
    const float* l = logits + (size_t)t * E;
    float p[ROUTE_PER];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; ++i) {
        const int e = i * 32 + lane;
        p[i] = e < E ? l[e] : -INFINITY;
        m = fmaxf(m, p[i]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; ++i) {
        const int e = i * 32 + lane;
        p[i] = e < E ? expf(p[i] - m) : 0.f;
        s += p[i];
    }
    s = warp_sum(s);
#pragma unroll
    for (int i = 0; i < ROUTE_PER; ++i) {
        const int e = i * 32 + lane;
        p[i] = e < E ? __fdiv_rn(p[i], s) : -1.f;  // -1: no expert (probabilities are >= 0)
    }
    float wsum = 0.f;  // (lane 0's)
    for (int j = 0; j < k; ++j) {
        float bv = -1.f;  // strict >: a taken or missing expert (-1) is never chosen
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTE_PER; ++i) {  // ascending ids: strict > keeps the lowest
            if (p[i] > bv) {
                bv = p[i];
                bi = i * 32 + lane;
            }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
#pragma unroll
        for (int i = 0; i < ROUTE_PER; ++i)
            if (i * 32 + lane == bi) p[i] = -1.f;  // taken
        if (bi >= E) {  // no expert left: NaN logits (the NaN goes on to the output)
            bi = 0;
            bv = __int_as_float(0x7fffffff);
        }
        if (lane == 0) {
            sel[(size_t)t * k + j] = bi;
            wts[(size_t)t * k + j] = bv;
            wsum = j ? __fadd_rn(wsum, bv) : bv;
        }
    }
    if (lane == 0) {
        const float div = norm_w ? fmaxf(wsum, 6.103515625e-5f) : 1.f;
        const bool scale = w_scale != 0.f && w_scale != 1.f;
        for (int j = 0; j < k; ++j) {
            float w = wts[(size_t)t * k + j];
            if (norm_w) w = __fdiv_rn(w, div);
            if (scale) w = __fmul_rn(w, w_scale);
            wts[(size_t)t * k + j] = w;
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    moe_sort(int* __restrict__ offs, int* __restrict__ toff, int* __restrict__ perm,
             int* __restrict__ rowpos, const int* __restrict__ sel, int P, int E, int bm) {
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int cur[MOE_MAX_E];
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) atomicAdd(&cnt[sel[p]], 1);
    __syncthreads();
    if (tid == 0) {
        int o = 0, to = 0;
        for (int e = 0; e < E; ++e) {
            offs[e] = o;
            toff[e] = to;
            cur[e] = o;
            o += cnt[e];
            to += (cnt[e] + bm - 1) / bm;
        }
        offs[E] = o;
        toff[E] = to;
    }
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) {
        const int pos = atomicAdd(&cur[sel[p]], 1);
        perm[pos] = p;
        rowpos[p] = pos;
    }
}

// ---- grouped GEMM ------------------------------------------------------------------------------
template <bool GLU>
__device__ __forceinline__ void moe_gemm_body(float* __restrict__ Cf, __half* __restrict__ Ch,
                                              const __half* __restrict__ A,
                                              const int* __restrict__ a_rows, int a_div,
                                              const __half* __restrict__ W,
                                              const int* __restrict__ offs,
                                              const int* __restrict__ toff, int E, int N, int K) {
    using namespace nvcuda;
    constexpr int LOAD_BYTES = (GLU ? 3 : 2) * GBM * GLD * 2;
    constexpr int C_BYTES = (GLU ? 2 : 1) * GBM * CLD * 4;
    constexpr int SMEM = LOAD_BYTES > C_BYTES ? LOAD_BYTES : C_BYTES;
    __shared__ __align__(128) unsigned char smem[SMEM];
    __half* As = reinterpret_cast<__half*>(smem);
    __half* Bs = As + GBM * GLD;
    __half* B2s = Bs + GBN * GLD;

    const int mt = blockIdx.y;
    if (mt >= toff[E]) return;  // (uniform per block)
    int lo = 0, hi = E;  // toff[lo] <= mt < toff[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (toff[mid] <= mt) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int r0 = offs[e] + (mt - toff[e]) * GBM;
    const int rend = offs[e + 1];
    const int n0 = blockIdx.x * GBN;
    // GLU: W is expert e's gate|up [2N, K], rows interleaved per 16 (8 gate, their 8 up)
    const __half* We = W + (size_t)e * (GLU ? 2 : 1) * N * K;

    const int tid = threadIdx.x;
    const int warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const __half* arow[2];
    const __half* brow[2];
    const __half* b2row[2];
    bool aok[2], bok[2];
    int srow[2], scol[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = tid + i * 128;
        srow[i] = c >> 2;
        scol[i] = (c & 3) * 8;
        const int g = r0 + srow[i];
        aok[i] = g < rend;
        const int src = aok[i] ? (a_rows ? a_rows[g] / a_div : g) : 0;
        arow[i] = A + (size_t)src * K;
        const int n = n0 + srow[i];
        bok[i] = n < N;
        const int wr = bok[i] ? (GLU ? ((n >> 3) << 4) + (n & 7) : n) : 0;  // gate (or the) row
        brow[i] = We + (size_t)wr * K;
        b2row[i] = GLU ? brow[i] + 8 * (size_t)K : nullptr;  // its up row
    }
    int4 ra[2], rb[2], rb2[2];
    const int4 zero = make_int4(0, 0, 0, 0);
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int kk = k0 + scol[i];
            const bool kin = kk < K;
            ra[i] = aok[i] && kin ? *reinterpret_cast<const int4*>(arow[i] + kk) : zero;
            rb[i] = bok[i] && kin ? *reinterpret_cast<const int4*>(brow[i] + kk) : zero;
            if (GLU) rb2[i] = bok[i] && kin ? *reinterpret_cast<const int4*>(b2row[i] + kk) : zero;
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            *reinterpret_cast<int4*>(As + srow[i] * GLD + scol[i]) = ra[i];
            *reinterpret_cast<int4*>(Bs + srow[i] * GLD + scol[i]) = rb[i];
            if (GLU) *reinterpret_cast<int4*>(B2s + srow[i] * GLD + scol[i]) = rb2[i];
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2], acc2[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            wmma::fill_fragment(acc[i][j], 0.f);
            if (GLU) wmma::fill_fragment(acc2[i][j], 0.f);
        }
    load(0);
    for (int k0 = 0; k0 < K; k0 += GBK) {
        store();
        __syncthreads();
        if (k0 + GBK < K) load(k0 + GBK);  // next step's loads in flight during the mma
#pragma unroll
        for (int kk = 0; kk < GBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * GLD + kk, GLD);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Bs + (wn * 32 + j * 16) * GLD + kk, GLD);
#pragma unroll
                for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
                if (GLU) {
                    wmma::load_matrix_sync(fb, B2s + (wn * 32 + j * 16) * GLD + kk, GLD);
#pragma unroll
                    for (int i = 0; i < 2; ++i) wmma::mma_sync(acc2[i][j], fa[i], fb, acc2[i][j]);
                }
            }
        }
        __syncthreads();
    }
    float* Cs = reinterpret_cast<float*>(smem);
    float* C2s = Cs + GBM * CLD;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float* at = Cs + (wm * 32 + i * 16) * CLD + wn * 32 + j * 16;
            wmma::store_matrix_sync(at, acc[i][j], CLD, wmma::mem_row_major);
            if (GLU)
                wmma::store_matrix_sync(at + GBM * CLD, acc2[i][j], CLD, wmma::mem_row_major);
        }
    __syncthreads();
    for (int idx = tid; idx < GBM * GBN; idx += 128) {
        const int r = idx / GBN, c = idx % GBN;
        const int g = r0 + r, n = n0 + c;
        if (g < rend && n < N) {
            if (GLU) Ch[(size_t)g * N + n] = __float2half_rn(swiglu1(Cs[r * CLD + c], C2s[r * CLD + c]));
            else Cf[(size_t)g * N + n] = Cs[r * CLD + c];
        }
    }
}

#define MOE_GEMM_ARGS                                                                         \
    float *__restrict__ Cf, __half *__restrict__ Ch, const __half *__restrict__ A,            \
        const int *__restrict__ a_rows, int a_div, const __half *__restrict__ W,               \
        const int *__restrict__ offs, const int *__restrict__ toff, int E, int N, int K

extern "C" __global__ void __launch_bounds__(128) moe_gemm_f16_glu(MOE_GEMM_ARGS) {
    moe_gemm_body<true>(Cf, Ch, A, a_rows, a_div, W, offs, toff, E, N, K);
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_f16(MOE_GEMM_ARGS) {
    moe_gemm_body<false>(Cf, Ch, A, a_rows, a_div, W, offs, toff, E, N, K);
}

// ---- grouped GEMM, the dense f16 path's mma.sync tile (gemm_f16_common.cuh) ----------------------
// The same walk over (column tile, global row tile) as above, on gemm_f16.cu's 64 x 128 x 32
// tile (4 warps of 32 x 64, a 4-deep cp.async pipeline into XOR-swizzled shared memory,
// ldmatrix, mma.sync m16n8k16) and its epilogues: MODE 3 (glu): W expert e's gate|up [N = 2F,
// K] interleaved per 16 rows, C f16 [P, F] (epilogue_glu: swiglu.cuh's rounding, F % 8 == 0);
// MODE 0: C f32 [P, N]. The loader reads A row a_rows[r] / a_div (or r) for sorted row r.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int MODE>
__device__ __forceinline__ void moe_mma_body(void* __restrict__ C, const __half* __restrict__ A,
                                             const int* __restrict__ a_rows, int a_div,
                                             const __half* __restrict__ W,
                                             const int* __restrict__ offs,
                                             const int* __restrict__ toff, int E, int N, int K) {
    using namespace gemm_f16;
    using Cfg = TileCfg<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    constexpr int MI = Cfg::MI, NI = Cfg::NI, CPR = Cfg::CPR, SHIFT = Cfg::SHIFT;
    static_assert(BM == GBM, "the sort's row tiles are GBM rows");
    extern __shared__ __align__(128) uint8_t smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    const int mt = blockIdx.y;
    if (mt >= toff[E]) return;  // (uniform per block)
    int lo = 0, hi = E;  // toff[lo] <= mt < toff[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (toff[mid] <= mt) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int m0 = offs[e] + (mt - toff[e]) * BM;
    const int rend = offs[e + 1];  // rows m0 .. rend - 1 (at most BM) are this tile's
    const int n0 = blockIdx.x * BN;
    const half* B = W + (size_t)e * N * K;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int lr0 = tid / CPR, lch = tid % CPR;
    const int a_dst0 = swz<BK, SHIFT>(lr0, lch);
    int a_src[Cfg::A_ITERS];  // the A row of each pass's row, -1 past the expert's rows
#pragma unroll
    for (int i = 0; i < Cfg::A_ITERS; ++i) {
        const int r = m0 + lr0 + i * Cfg::RSTEP;
        a_src[i] = r < rend ? (a_rows ? a_rows[r] / a_div : r) : -1;
    }
    const half* b_src0 = B + static_cast<size_t>(n0 + lr0) * K + lch * 8;
    const size_t pass_stride = static_cast<size_t>(Cfg::RSTEP) * K;
    const int KT = (K + BK - 1) / BK;

    auto load_tile = [&](int stage, int kt) {
        const int k0 = kt * BK;
        const bool k_ok = k0 + lch * 8 < K;
        half* As = smem + stage * Cfg::STAGE_HALVES;
        half* Bs = As + BM * BK;
#pragma unroll
        for (int i = 0; i < Cfg::A_ITERS; ++i) {
            const bool ok = k_ok && a_src[i] >= 0;
            const half* src = ok ? A + static_cast<size_t>(a_src[i]) * K + k0 + lch * 8 : A;
            cp_async16(smem_u32(As + a_dst0 + i * Cfg::RSTEP * BK), src, ok);
        }
#pragma unroll
        for (int i = 0; i < Cfg::B_ITERS; ++i) {
            const bool ok = k_ok && (n0 + lr0 + i * Cfg::RSTEP < N);
            const half* src = ok ? b_src0 + i * pass_stride + k0 : B;
            cp_async16(smem_u32(Bs + a_dst0 + i * Cfg::RSTEP * BK), src, ok);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;

    const int a_row = wm * Cfg::WM + (lane & 15);
    const int a_chp = lane >> 4;
    const int b_row = wn * Cfg::WN + (lane & 7) + ((lane >> 4) << 3);
    const int b_chp = (lane >> 3) & 1;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_tile(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt visible to all; stage (kt-1)%STAGES free for reuse
        {
            const int nk = kt + STAGES - 1;
            if (nk < KT) load_tile(nk % STAGES, nk);
            cp_async_commit();
        }
        const half* As = smem + (kt % STAGES) * Cfg::STAGE_HALVES;
        const half* Bs = As + BM * BK;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t af[MI][4];
            uint32_t bf[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                ldmatrix_x4(af[mi], smem_u32(As + swz<BK, SHIFT>(a_row + mi * 16, 2 * kk + a_chp)));
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj) {
                uint32_t r[4];
                ldmatrix_x4(r, smem_u32(Bs + swz<BK, SHIFT>(b_row + nj * 16, 2 * kk + b_chp)));
                bf[2 * nj][0] = r[0];
                bf[2 * nj][1] = r[1];
                bf[2 * nj + 1][0] = r[2];
                bf[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
        }
    }
    cp_async_wait<0>();
    // rows past rend (another expert's, or past P) are not stored: M = rend
    epilogue<MODE, MI, NI>(C, rend, N, m0 + wm * Cfg::WM, n0 + wn * Cfg::WN, acc, lane);
}

#define MOE_MMA_ARGS                                                                          \
    void *__restrict__ C, const __half *__restrict__ A, const int *__restrict__ a_rows,        \
        int a_div, const __half *__restrict__ W, const int *__restrict__ offs,                 \
        const int *__restrict__ toff, int E, int N, int K

extern "C" __global__ void __launch_bounds__(128, 3) moe_mma_f16_glu(MOE_MMA_ARGS) {
    moe_mma_body<64, 128, 32, 2, 2, 4, 3>(C, A, a_rows, a_div, W, offs, toff, E, N, K);
}

extern "C" __global__ void __launch_bounds__(128, 3) moe_mma_f16(MOE_MMA_ARGS) {
    moe_mma_body<64, 128, 32, 2, 2, 4, 0>(C, A, a_rows, a_div, W, offs, toff, E, N, K);
}

// ---- weighted scatter-add back to token order --------------------------------------------------
extern "C" __global__ void __launch_bounds__(256)
    moe_combine_f32(float* __restrict__ x, const float* __restrict__ ys,
                    const float* __restrict__ wts, const int* __restrict__ rowpos, int k, int D) {
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float s = 0.f;
        for (int j = 0; j < k; ++j) {
            const int r = rowpos[(size_t)t * k + j];
            const float v = __fmul_rn(wts[(size_t)t * k + j], ys[(size_t)r * D + c]);
            s = j ? __fadd_rn(s, v) : v;
        }
        x[(size_t)t * D + c] = __fadd_rn(x[(size_t)t * D + c], s);
    }
}

// ---- qwen2moe's sigmoid-gated shared expert, added to the residual -----------------------------
extern "C" __global__ void __launch_bounds__(256)
    moe_shared_add_f32(float* __restrict__ x, const float* __restrict__ y,
                       const float* __restrict__ gl, int D) {
    const int t = blockIdx.x;
    const float s = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-gl[t])));
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        const size_t i = (size_t)t * D + c;
        x[i] = __fadd_rn(x[i], __fmul_rn(s, y[i]));
    }
}
