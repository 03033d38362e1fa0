// gemm_f16_common.cuh: helpers shared by gemm_f16.cu (mma.sync) and gemm_f16_sm90a.cu (wgmma):
// cp.async, ldmatrix, mma.sync m16n8k16, the XOR smem swizzle, grouped block order, and the
// epilogue (mode 0: C f32 = acc, 1: C f16 = acc, 2: C f32 += acc, 3: C f16 [M, N/2] =
// swiglu of B rows interleaved per 16, 4: rope: C is a RopeQkv*, the fused qkv output goes
// roped into q16 and the KV cache, 5: as 3 with gemma's GELU: geglu) over m16n8 accumulator
// fragments acc[MI][NI][4] (rows row0 + mi*16 + lane/4 (+8), cols col0 + ni*8 + 2*(lane%4)).
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "swiglu.cuh"   // glu1: the swiglu / geglu layers' rounding
#include "rope.cuh"     // rope_rot, RopeQkv: the rope kernels' rounding

static_assert(sizeof(half) == 2, "f16 is 2 bytes");
static_assert(sizeof(uint4) == 16, "16-byte chunks");

namespace gemm_f16 {

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

template <int MODE>  // 0: f32, 1: f16
__device__ __forceinline__ void store2(void* C, int N, int row, int col, float v0, float v1,
                                       bool vec) {
    // row < M checked by the caller; col is even
    const size_t o = static_cast<size_t>(row) * N + col;
    if (vec) {  // N even: col < N implies col + 1 < N, and o is even (8/4-byte aligned)
        if (col >= N) return;
        if (MODE == 0) *reinterpret_cast<float2*>(static_cast<float*>(C) + o) = make_float2(v0, v1);
        else *reinterpret_cast<half2*>(static_cast<half*>(C) + o) = __floats2half2_rn(v0, v1);
    } else {
        if (col < N) {
            if (MODE == 0) static_cast<float*>(C)[o] = v0;
            else static_cast<half*>(C)[o] = __float2half_rn(v0);
        }
        if (col + 1 < N) {
            if (MODE == 0) static_cast<float*>(C)[o + 1] = v1;
            else static_cast<half*>(C)[o + 1] = __float2half_rn(v1);
        }
    }
}

// Mode 3 (glu): B is a gate|up weight [N = 2F, K] with its rows interleaved per 16 (8 gate rows,
// then the same 8 features' up rows: minfer.quants.glu.glu_rows), so fragment ni (even)
// holds gate and ni + 1 up of features (col0 + ni*8)/2 + 2*(lane%4) (+1), col0 % 16 == 0 and
// N % 16 == 0 (the launcher checks). C f16 [M, F] = act(gate) * up, rounded as the swiglu /
// geglu layer (swiglu.cuh glu1: ACT 0 silu, mode 3; ACT 1 gemma's GELU, mode 5).
// fn(mi, h, row) for each accumulator row of this thread inside C (row < M): rows row0 + mi*16
// + h*8 + lane/4
template <int MI, class Fn>
__device__ __forceinline__ void for_rows(int M, int row0, int lane, Fn&& fn) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mi * 16 + h * 8 + (lane >> 2);
            if (row < M) fn(mi, h, row);
        }
}

template <int ACT, int MI, int NI>
__device__ __forceinline__ void epilogue_glu(half* C, int M, int N, int row0, int col0,
                                             const float (&acc)[MI][NI][4], int lane) {
    static_assert(NI % 2 == 0, "gate and up fragments in pairs");
    const int t = lane & 3, F = N / 2;
    for_rows<MI>(M, row0, lane, [&](int mi, int h, int row) {
#pragma unroll
        for (int ni = 0; ni < NI; ni += 2) {
            const int col = col0 + ni * 8;
            if (col >= N) continue;
            *reinterpret_cast<half2*>(C + static_cast<size_t>(row) * F + col / 2 + 2 * t) =
                __floats2half2_rn(glu1<ACT>(acc[mi][ni][2 * h], acc[mi][ni + 1][2 * h]),
                                  glu1<ACT>(acc[mi][ni][2 * h + 1], acc[mi][ni + 1][2 * h + 1]));
        }
    });
}

// Mode 4 (rope): the fused qkv GEMM's [M, qd + 2 kd] tile goes to q16 / kc / vc as rope.cuh's
// RopeQkv says, each (even, odd) column pair of this thread being one rotation pair (D even:
// no pair straddles a head), rotated and rounded exactly as rope_qkv_f32_f16 does the same f32
// values (the engine's logits are bitwise those of GEMM f32 + rope_qkv; tests/gpu).
// The cos / sin loads: a fragment's column offset in its head steps by 8 (q, k and v start at
// multiples of D; D >= 8, even: QkvRope checks), so when D divides 128 the 16 fragments of a
// batch meet every angle this thread needs for its row, and later batches reuse them. Per row,
// one batch of loads, then every store (a store may alias the tables as far as the compiler
// knows: loads placed after stores wait one L2 round trip each; measured at M = 2048, batches
// of 8 loads between stores: 1.03x slower than the f32 GEMM + rope launch; every load of both
// rows hoisted: spills).
template <int MI, int NI>
__device__ __forceinline__ void epilogue_rope(const RopeQkv* __restrict__ rp, int M, int N,
                                              int row0, int col0, float (&acc)[MI][NI][4],
                                              int lane) {
    constexpr int B = NI < 16 ? NI : 16;   // fragments per batch of table loads
    const RopeQkv r = *rp;
    const int t = lane & 3, kv0 = r.qd + r.kd;
    const bool reuse = 128 % r.D == 0;   // batch b's angles are batch 0's
    const int hc0 = (col0 + 2 * t) % r.D;   // fragment 0's column offset inside its head
    for_rows<MI>(M, row0, lane, [&](int mi, int h, int row) {
        const int2 tp = r.tok[row];   // (KV slot, first slot of its sequence)
        const long p_abs = tp.x, p_rot = tp.x - tp.y;
        const float* cr = r.cos_t + p_rot * r.half_r;
        const float* sr = r.sin_t + p_rot * r.half_r;
        float cs[B], sn[B];
        unsigned on = 0;   // bit j: fragment b + j's pair is inside rope_dim
        int hc = hc0;
#pragma unroll
        for (int b = 0; b < NI; b += B) {
            if (b == 0 || !reuse) {
                on = 0;
#pragma unroll
                for (int j = 0; j < B && b + j < NI; ++j) {
                    const int p = hc >> 1;
                    hc += 8;
                    if (hc >= r.D) hc -= r.D;
                    const bool in = p < r.half_r;
                    cs[j] = in ? cr[p] : 0.f;
                    sn[j] = in ? sr[p] : 0.f;
                    on |= static_cast<unsigned>(in) << j;
                }
            }
#pragma unroll
            for (int j = 0; j < B && b + j < NI; ++j) {
                const int ni = b + j, col = col0 + ni * 8 + 2 * t;
                if (((on >> j) & 1u) && col < kv0) {   // q or k, inside rope_dim
                    const float2 y = rope_rot(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], cs[j],
                                              sn[j]);
                    acc[mi][ni][2 * h] = y.x;
                    acc[mi][ni][2 * h + 1] = y.y;
                }
            }
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int col = col0 + ni * 8 + 2 * t;
            if (col >= N) continue;
            __half* dst = col < r.qd ? r.q16 + static_cast<long>(row) * r.qd + col
                        : col < kv0  ? r.kc + p_abs * r.kd + (col - r.qd)
                                     : r.vc + p_abs * r.kd + (col - kv0);
            *reinterpret_cast<__half2*>(dst) =
                __floats2half2_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        }
    });
}

template <int MODE, int MI, int NI>
__device__ __forceinline__ void epilogue(void* C, int M, int N, int row0, int col0,
                                         float (&acc)[MI][NI][4], int lane) {
    if (MODE == 3 || MODE == 5) {
        epilogue_glu<MODE == 5, MI, NI>(static_cast<half*>(C), M, N, row0, col0, acc, lane);
        return;
    }
    const bool vec = (N & 1) == 0;
    const int t = lane & 3;
    if (MODE == 2) {
        // C += acc: issue every residual load before any store (stores to C could alias later
        // loads, so a fused load-add-store loop would serialize one memory round trip each)
        const float* Cf = static_cast<const float*>(C);
        for_rows<MI>(M, row0, lane, [&](int mi, int h, int row) {
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int col = col0 + ni * 8 + t * 2;
                const size_t o = static_cast<size_t>(row) * N + col;
                if (vec) {
                    if (col < N) {
                        const float2 r = *reinterpret_cast<const float2*>(Cf + o);
                        acc[mi][ni][2 * h] += r.x;
                        acc[mi][ni][2 * h + 1] += r.y;
                    }
                } else {
                    if (col < N) acc[mi][ni][2 * h] += Cf[o];
                    if (col + 1 < N) acc[mi][ni][2 * h + 1] += Cf[o + 1];
                }
            }
        });
    }
    constexpr int SMODE = MODE == 1 ? 1 : 0;
    for_rows<MI>(M, row0, lane, [&](int mi, int h, int row) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            store2<SMODE>(C, N, row, col0 + ni * 8 + t * 2, acc[mi][ni][2 * h],
                          acc[mi][ni][2 * h + 1], vec);
    });
}

// Mode 2's residual tile into L2 ahead of the epilogue: this thread's rows of C (as for_rows),
// 128-byte lines (lane % 4) + 4j of the BN f32 columns at col0; the accumulate epilogue's loads
// then hit L2 instead of waiting on DRAM with the tensor cores idle (issued a few k-tiles
// before the mainloop ends, while DRAM is otherwise quiet).
template <int MI, int BN>
__device__ __forceinline__ void prefetch_acc_l2(const float* C, int M, int N, int row0, int col0,
                                                int lane) {
    constexpr int LINES = BN * 4 / 128;   // 128-byte lines of a row's BN f32
    for_rows<MI>(M, row0, lane, [&](int, int, int row) {
#pragma unroll
        for (int j = lane & 3; j < LINES; j += 4) {
            const int col = col0 + j * 32;
            if (col < N)
                asm volatile("prefetch.global.L2 [%0];\n" ::"l"(C + static_cast<size_t>(row) * N + col));
        }
    });
}

// the epilogue of the launch's `mode` (uniform per launch; the kernels' one dispatch)
template <int MI, int NI>
__device__ __forceinline__ void store_tile(int mode, void* C, int M, int N, int row0, int col0,
                                           float (&acc)[MI][NI][4], int lane) {
    if (mode == 0) epilogue<0, MI, NI>(C, M, N, row0, col0, acc, lane);
    else if (mode == 1) epilogue<1, MI, NI>(C, M, N, row0, col0, acc, lane);
    else if (mode == 2) epilogue<2, MI, NI>(C, M, N, row0, col0, acc, lane);
    else if (mode == 3) epilogue<3, MI, NI>(C, M, N, row0, col0, acc, lane);   // glu: silu
    else if (mode == 5) epilogue<5, MI, NI>(C, M, N, row0, col0, acc, lane);   // glu: gelu
    else epilogue_rope<MI, NI>(static_cast<const RopeQkv*>(C), M, N, row0, col0, acc, lane);
}

// grouped tile order: GROUP_M row-tiles share the B column tiles while they are in L2; tile
// `pid` of the ceil(M / BM) x ceil(N / BN) grid starts at (m0, n0) (twin: minfer.cuda.ops.
// stream_k.tile_origin)
template <int BM, int BN, int GROUP_M = 8>
__device__ __forceinline__ void tile_origin(int pid, int M, int N, int& m0, int& n0) {
    const int npm = (M + BM - 1) / BM, npn = (N + BN - 1) / BN;
    const int in_group = GROUP_M * npn;
    const int first_m = (pid / in_group) * GROUP_M;
    const int gsz = min(npm - first_m, GROUP_M);
    m0 = (first_m + (pid % in_group) % gsz) * BM;
    n0 = ((pid % in_group) / gsz) * BN;
}

// one block per tile, in the grouped order
template <int BM, int BN>
__device__ __forceinline__ void block_origin(int M, int N, int& m0, int& n0) {
    tile_origin<BM, BN>(blockIdx.x, M, N, m0, n0);
}

}  // namespace gemm_f16
