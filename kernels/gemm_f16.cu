// gemm_f16.cu: C[M, N] = A[M, K] @ B[N, K]^T, f16 operands, f32 accumulate ("NT": A row-major
// activations, B row-major [N, K] weights as GGUF stores them). minfer's default GEMM path.
//
// Epilogue `mode` (passed by the launcher, uniform per launch):
//   0: C (f32) = acc          1: C (f16) = acc (round to nearest)     2: C (f32) += acc
//   3: C (f16) [M, N/2] = silu(gate) * up, B a gate|up weight interleaved per 16 rows (glu;
//      tile kernels only: gemm_f16_common.cuh epilogue_glu)
//   4: rope: C is a RopeQkv* (rope.cuh); B the fused q|k|v weight, the product goes roped into
//      q16 and the KV cache rows (tile kernels only: gemm_f16_common.cuh epilogue_rope)
//   5: as 3 with gemma's GELU (geglu: gelu(gate) * up, swiglu.cuh gelu_ggml)
//
// Variants (the launcher, minfer/cuda/paths/f16/gemm.py, picks one; kernels never choose):
//   gemm_f16_nt_<BM>x<BN>x<BK>_w<warps>_s<stages>: tensor-core tile kernel.
//     mma.sync m16n8k16 f16 -> f32, operands via ldmatrix.x4 from XOR-swizzled shared memory
//     (conflict-free for both the cp.async writes and the ldmatrix reads), a STAGES-deep
//     cp.async.cg pipeline, grouped block order for L2 reuse. 1-D grid of
//     ceil(M/BM) * ceil(N/BN) blocks, WARPS_M*WARPS_N*32 threads,
//     STAGES*(BM+BN)*BK*2 bytes of dynamic shared memory.
//   gemv_f16_r<ROWS>: M == 1 (decode step / LM head on the last position): memory bound, each
//     warp streams ROWS rows of B with 16-byte loads, U chunks deep, f32 accumulate, shuffle
//     reduce. 1-D grid of ceil(N / (8*ROWS)) blocks of 256 threads, no shared memory.
//
// Contract (validated by the launcher): K % 8 == 0 (16-byte rows: cp.async / uint4 loads,
// ragged K tails are zero-filled at 8-element granularity), A, B, C 16-byte aligned, all
// contiguous row-major. M and N any size >= 1 (predicated loads, guarded stores; when N is
// odd the epilogue falls back to scalar stores).
#include "gemm_f16_common.cuh"

namespace {
using namespace gemm_f16;

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void gemm_body(const half* __restrict__ A, const half* __restrict__ B,
                                          void* __restrict__ C, int M, int N, int K, int mode) {
    using Cfg = TileCfg<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    constexpr int MI = Cfg::MI, NI = Cfg::NI, CPR = Cfg::CPR, SHIFT = Cfg::SHIFT;
    extern __shared__ __align__(128) uint8_t smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    int m0, n0;
    block_origin<BM, BN>(M, N, m0, n0);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    // ---- loader geometry: thread -> (row r0 + i*RSTEP, chunk ch) for i < ITERS
    const int lr0 = tid / CPR, lch = tid % CPR;
    const int a_dst0 = swz<BK, SHIFT>(lr0, lch);  // pass-invariant swizzle (RSTEP % 8 == 0)
    const half* a_src0 = A + static_cast<size_t>(m0 + lr0) * K + lch * 8;
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
            const bool ok = k_ok && (m0 + lr0 + i * Cfg::RSTEP < M);
            const half* src = ok ? a_src0 + i * pass_stride + k0 : A;
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

    // ldmatrix lane addressing (rows within the warp tile, chunk parity)
    const int a_row = wm * Cfg::WM + (lane & 15);              // + mi*16
    const int a_chp = lane >> 4;                                // + 2*kk
    const int b_row = wn * Cfg::WN + (lane & 7) + ((lane >> 4) << 3);  // + nj*16
    const int b_chp = (lane >> 3) & 1;                          // + 2*kk

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
    cp_async_wait<0>();  // drain (empty) trailing groups before exit

    const int row0 = m0 + wm * Cfg::WM, col0 = n0 + wn * Cfg::WN;
    store_tile(mode, C, M, N, row0, col0, acc, lane);
}

// ---- GEMV (M == 1) ------------------------------------------------------------------------
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
    const half2* ah = reinterpret_cast<const half2*>(&a);
    const half2* bh = reinterpret_cast<const half2*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 af = __half22float2(ah[i]);
        const float2 bf = __half22float2(bh[i]);
        acc = fmaf(af.x, bf.x, acc);
        acc = fmaf(af.y, bf.y, acc);
    }
    return acc;
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {  // B is read once: skip L1
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

constexpr int GEMV_THREADS = 256;

template <int ROWS, int U>
__device__ __forceinline__ void gemv_body(const half* __restrict__ a, const half* __restrict__ B,
                                          void* __restrict__ C, int N, int K, int mode) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.x * (GEMV_THREADS / 32) + warp) * ROWS;
    if (n0 >= N) return;
    const int nch = K >> 3;  // 16-byte chunks per row
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
    const uint4* brow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)  // rows past N re-read row N-1 (never stored)
        brow[r] = reinterpret_cast<const uint4*>(B + static_cast<size_t>(min(n0 + r, N - 1)) * K);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;

    int c = lane;
    for (; c + 32 * (U - 1) < nch; c += 32 * U) {
        uint4 av[U], bv[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u) av[u] = __ldg(a4 + c + 32 * u);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) bv[u][r] = ld_stream(brow[r] + c + 32 * u);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r] = dot8(av[u], bv[u][r], acc[r]);
    }
    for (; c < nch; c += 32) {
        const uint4 av = __ldg(a4 + c);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = dot8(av, ld_stream(brow[r] + c), acc[r]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane < ROWS) {
        float v = acc[0];
#pragma unroll
        for (int r = 1; r < ROWS; ++r)
            if (lane == r) v = acc[r];
        const int n = n0 + lane;
        if (n < N) {
            if (mode == 0) static_cast<float*>(C)[n] = v;
            else if (mode == 1) static_cast<half*>(C)[n] = __float2half_rn(v);
            else static_cast<float*>(C)[n] += v;
        }
    }
}

}  // namespace

// ---- entries (names parsed by the launcher's geometry test: keep one per line) -----------
#define GEMM_ENTRY(BM, BN, BK, WMW, WNW, ST, MINB)                                             \
    extern "C" __global__ void __launch_bounds__(WMW * WNW * 32, MINB)                         \
        gemm_f16_nt_##BM##x##BN##x##BK##_w##WMW##x##WNW##_s##ST(                               \
            const half* __restrict__ A, const half* __restrict__ B, void* __restrict__ C, int M, \
            int N, int K, int mode) {                                                          \
        gemm_body<BM, BN, BK, WMW, WNW, ST>(A, B, C, M, N, K, mode);                            \
    }

GEMM_ENTRY(128, 128, 64, 2, 2, 3, 2)
GEMM_ENTRY(64, 128, 32, 2, 2, 4, 3)
GEMM_ENTRY(64, 64, 64, 2, 2, 4, 3)
GEMM_ENTRY(32, 64, 64, 1, 4, 4, 4)

#define GEMV_ENTRY(ROWS, U)                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        gemv_f16_r##ROWS(const half* __restrict__ a, const half* __restrict__ B,               \
                         void* __restrict__ C, int N, int K, int mode) {                        \
        gemv_body<ROWS, U>(a, B, C, N, K, mode);                                               \
    }

GEMV_ENTRY(4, 4)
GEMV_ENTRY(1, 8)
