// gemm_f16.cu: C[M, N] = A[M, K] @ B[N, K]^T, f16 operands, f32 accumulate ("NT": A row-major
// activations, B row-major [N, K] weights as GGUF stores them). minfer's default GEMM path.
//
// Epilogue `mode` (passed by the launcher, uniform per launch):
//   0: C (f32) = acc          1: C (f16) = acc (round to nearest)     2: C (f32) += acc
//
// Variants (the launcher, minfer/cuda/gemm.py, picks one; kernels never choose):
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
#include <cuda_fp16.h>
#include <stdint.h>

static_assert(sizeof(half) == 2, "f16 is 2 bytes");
static_assert(sizeof(uint4) == 16, "16-byte chunks");

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (ragged M/N/K tails).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
    const int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x16 row) * b (16x8 col), f16 in, f32 accumulate.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
struct TileCfg {
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int WM = BM / WARPS_M;  // warp tile rows
    static constexpr int WN = BN / WARPS_N;  // warp tile cols
    static constexpr int MI = WM / 16;       // m16 fragments per warp
    static constexpr int NI = WN / 8;        // n8 fragments per warp
    static constexpr int CPR = BK / 8;       // 16-byte chunks per smem row
    // swizzle: chunk ^= (row >> SHIFT) & (CPR-1); 8 consecutive rows at one logical chunk land
    // in 8 distinct 16-byte bank groups (rows of CPR chunks packed 8/CPR per 128-byte line).
    static constexpr int SHIFT = CPR == 8 ? 0 : (CPR == 4 ? 1 : 2);
    static constexpr int RSTEP = THREADS / CPR;  // rows covered by one pass of the block
    static constexpr int A_ITERS = BM * CPR / THREADS;
    static constexpr int B_ITERS = BN * CPR / THREADS;
    static constexpr int STAGE_HALVES = (BM + BN) * BK;
    static constexpr int SMEM_BYTES = STAGES * STAGE_HALVES * 2;

    static_assert(BK == 16 || BK == 32 || BK == 64, "BK in {16, 32, 64}");
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile: m16 x (2 x n8) fragments");
    static_assert(BM * CPR % THREADS == 0 && BN * CPR % THREADS == 0, "whole cp.async passes");
    static_assert(RSTEP % 8 == 0, "a pass moves whole swizzle periods (swizzle is pass-invariant)");
    static_assert(STAGES >= 2, "pipeline");
};

// offset (in halves) of logical (row, chunk) in a swizzled [rows, BK] tile
template <int BK, int SHIFT>
__device__ __forceinline__ int swz(int row, int ch) {
    constexpr int CPR = BK / 8;
    return row * BK + ((ch ^ ((row >> SHIFT) & (CPR - 1))) << 3);
}

template <int MODE>
__device__ __forceinline__ void store2(void* C, int N, int row, int col, float v0, float v1,
                                       bool vec) {
    // row < M checked by the caller; col is even
    const size_t o = static_cast<size_t>(row) * N + col;
    if (vec) {  // N even: col < N implies col + 1 < N, and o is even (8/4-byte aligned)
        if (col >= N) return;
        if (MODE == 0) {
            *reinterpret_cast<float2*>(static_cast<float*>(C) + o) = make_float2(v0, v1);
        } else if (MODE == 1) {
            *reinterpret_cast<half2*>(static_cast<half*>(C) + o) = __floats2half2_rn(v0, v1);
        } else {
            float2* p = reinterpret_cast<float2*>(static_cast<float*>(C) + o);
            float2 r = *p;
            r.x += v0;
            r.y += v1;
            *p = r;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (col + j >= N) return;
            const float v = j ? v1 : v0;
            if (MODE == 0) static_cast<float*>(C)[o + j] = v;
            else if (MODE == 1) static_cast<half*>(C)[o + j] = __float2half_rn(v);
            else static_cast<float*>(C)[o + j] += v;
        }
    }
}

template <int MODE, int MI, int NI>
__device__ __forceinline__ void epilogue(void* C, int M, int N, int row0, int col0,
                                         const float (&acc)[MI][NI][4], int lane) {
    const bool vec = (N & 1) == 0;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mi * 16 + h * 8 + g;
            if (row >= M) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
                store2<MODE>(C, N, row, col0 + ni * 8 + t * 2, acc[mi][ni][2 * h],
                             acc[mi][ni][2 * h + 1], vec);
        }
}

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void gemm_body(const half* __restrict__ A, const half* __restrict__ B,
                                          void* __restrict__ C, int M, int N, int K, int mode) {
    using Cfg = TileCfg<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    constexpr int MI = Cfg::MI, NI = Cfg::NI, CPR = Cfg::CPR, SHIFT = Cfg::SHIFT;
    extern __shared__ __align__(128) uint8_t smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    // grouped block order: GROUP_M row-tiles share the B column tiles while they are in L2
    constexpr int GROUP_M = 8;
    const int npm = (M + BM - 1) / BM, npn = (N + BN - 1) / BN;
    const int pid = blockIdx.x;
    const int in_group = GROUP_M * npn;
    const int first_m = (pid / in_group) * GROUP_M;
    const int gsz = min(npm - first_m, GROUP_M);
    const int pm = first_m + (pid % in_group) % gsz;
    const int pn = (pid % in_group) / gsz;
    const int m0 = pm * BM, n0 = pn * BN;

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
    if (mode == 0) epilogue<0, MI, NI>(C, M, N, row0, col0, acc, lane);
    else if (mode == 1) epilogue<1, MI, NI>(C, M, N, row0, col0, acc, lane);
    else epilogue<2, MI, NI>(C, M, N, row0, col0, acc, lane);
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

GEMM_ENTRY(128, 256, 32, 2, 4, 4, 1)
GEMM_ENTRY(128, 256, 64, 2, 4, 3, 1)
GEMM_ENTRY(128, 128, 32, 2, 2, 4, 2)
GEMM_ENTRY(128, 128, 64, 2, 2, 3, 2)
GEMM_ENTRY(128, 128, 32, 2, 4, 4, 2)
GEMM_ENTRY(128, 128, 64, 2, 4, 3, 2)
GEMM_ENTRY(64, 128, 32, 2, 2, 4, 3)
GEMM_ENTRY(64, 64, 64, 2, 2, 4, 3)
GEMM_ENTRY(32, 64, 64, 1, 4, 4, 4)
GEMM_ENTRY(16, 64, 64, 1, 4, 4, 4)

#define GEMV_ENTRY(ROWS, U)                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        gemv_f16_r##ROWS(const half* __restrict__ a, const half* __restrict__ B,               \
                         void* __restrict__ C, int N, int K, int mode) {                        \
        gemv_body<ROWS, U>(a, B, C, N, K, mode);                                               \
    }

GEMV_ENTRY(4, 4)
GEMV_ENTRY(2, 4)
GEMV_ENTRY(1, 8)
