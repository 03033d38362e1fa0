// wgmma_common.cuh: the Hopper wgmma plumbing shared by gemm_f16_sm90a.cu and the wgmma MMQ kernels
// (sm_90a only): the async-proxy fence, wgmma fence / commit / wait, and the shared-memory
// descriptor of a K-major operand stored with the 128-byte swizzle (rows of 128 bytes, the
// 16-byte chunk c of row r at c ^ (r % 8), 8-row atoms 1024 B apart, 1024-byte aligned tiles).
// One k-step of a wgmma reads 32 bytes of each row (k16 of f16, k32 of int8): its descriptor
// starts 32 * step bytes into the atom.
#pragma once
#include <stdint.h>

#include "gemm_f16_common.cuh"   // cp_async_wait / cp_async_commit

#ifndef MMQ_WG_STAGES   // the cp.async ring depth of the wgmma MMQ kernels (A/B: -DMMQ_WG_STAGES=4)
#define MMQ_WG_STAGES 3
#endif

namespace wgmma {

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// K-major operand with 128-byte swizzle: rows of 128 B, 8-row atoms 1024 B apart.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
    uint64_t d = static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);  // start address
    d |= static_cast<uint64_t>(1) << 16;                            // LBO (unused: swizzled K-major)
    d |= static_cast<uint64_t>(1024 >> 4) << 32;                    // SBO: next 8-row atom
    d |= static_cast<uint64_t>(1) << 62;                            // swizzle mode 1: 128 B
    return d;
}

// K-major operand without swizzle: 8-row x 16-byte core matrices (128 contiguous bytes), `lbo`
// bytes from a core matrix to the next along k, `sbo` bytes to the next 8 rows.
__device__ __forceinline__ uint64_t plain_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) |
           static_cast<uint64_t>(lbo >> 4) << 16 | static_cast<uint64_t>(sbo >> 4) << 32;
}

// ---- int8 MMQ pieces (mmq_wgmma_q4k.cu, mmq_wgmma_q6k.cu, mmq_sb_q4k.cu, mmq_sb_q6k.cu) ----

// d[32] = A (64x32 u8, smem desc) * B (32x64 u8, smem desc), both K-major, s32 (scale-d 0)
__device__ __forceinline__ void igmma_m64n64k32(int (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.u8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 0;\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31])
        : "l"(da), "l"(db));
}

template <int R>
__device__ __forceinline__ void fence_regs(int (&d)[R]) {  // D reads stay after the wait
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (f32 [4]) += A (16x4 tf32, row) x B (4x8 tf32, col): a0 = A[g][t], a1 = A[g+8][t],
// b0 = B[t][g]; c as the m16n8 C fragment.
__device__ __forceinline__ void mma_tf32_k4(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// ---- the cp.async stage ring of the wgmma MMQ kernels (Cp: the kernel's copier, whose
// issue(smem_stage, kt, a, ta, w, tw, K, tid) copies stage kt and commits one group). A work
// item runs stages [k0, k1) of a tile; stage kt lives in slot kt % STAGES ----

// the first STAGES-1 stages of an item (an empty group past k1 keeps the group count)
template <int STAGES, int STAGE_BYTES, class Cp>
__device__ __forceinline__ void ring_prologue(const Cp& cp, uint32_t base, int k0, int k1,
                                              const uint8_t* a, const uint8_t* ta,
                                              const uint8_t* w, const uint8_t* tw, int K, int tid) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (k0 + s < k1) cp.issue(base + ((k0 + s) % STAGES) * STAGE_BYTES, k0 + s, a, ta, w, tw, K, tid);
        else gemm_f16::cp_async_commit();
    }
}

// top of k-step kt: stage kt landed for every thread and is visible to wgmma (cp.async writes
// are generic-proxy), stage kt-1 is consumed by all, so its slot takes stage kt + STAGES - 1
template <int STAGES, int STAGE_BYTES, class Cp>
__device__ __forceinline__ void ring_next(const Cp& cp, uint32_t base, int kt, int k1,
                                          const uint8_t* a, const uint8_t* ta, const uint8_t* w,
                                          const uint8_t* tw, int K, int tid) {
    gemm_f16::cp_async_wait<STAGES - 2>();
    fence_proxy_async();
    __syncthreads();
    const int nk = kt + STAGES - 1;
    if (nk < k1) cp.issue(base + (nk % STAGES) * STAGE_BYTES, nk, a, ta, w, tw, K, tid);
    else gemm_f16::cp_async_commit();
}

// ---- warp specialization (mmq_sb_q4k.cu): mbarriers in shared memory, bulk copies, register
// reallocation between the producer and the consumer warpgroups ----

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// wait until the phase of parity `parity` has completed (a fresh barrier: parity 1 passes)
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred P1;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}
// arrive (one of the barrier's count) and expect `bytes` more of transactions in this phase
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n"
                 ::"r"(bar), "r"(bytes) : "memory");
}
// count `bytes` of the phase's transactions done without a copy (timing diagnostics)
__device__ __forceinline__ void mbar_complete_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// this thread's cp.asyncs so far arrive on `bar` when they complete (one of its count: .noinc)
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// bulk copy (the TMA engine, no tensor map) of `bytes` contiguous global bytes to shared
// memory (both 16-byte aligned, bytes % 16 == 0), completing as transactions on `bar`
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- the tile schedule of the persistent wgmma MMQ kernels (data-parallel, then stream-K) ----
// Tiles [0, dp) go round-robin over the grid (whole waves); the last ntiles - dp tiles are split
// by k-stages: their U = (ntiles - dp) * KT stage units are dealt out evenly, block b taking
// units [b U / G, (b+1) U / G) in tile-major order. The launcher (minfer.cuda.mmq_wgmma.
// schedule) leaves 0 or between G and 2G tiles to stream-K, so every block's share is >= KT
// units and a tile is split between at most two blocks: its k-tail [s, KT) is the first item
// of block b+1, which publishes the partial sums (sk_put), its head [0, s) the last item of
// block b, which adds them (sk_add) before the store. A wave of 1.2 tiles per SM then costs
// 1.2 tile-times instead of 2.
struct Work {
    int tile, k0, k1;   // stages [k0, k1) of tile `tile`
};

// Only the item index lives across the k-loop (the kernels sit at the register cap); each
// item is recomputed from it and the launch parameters.
struct TileSched {
    int ntiles, dp, KT, i;

    // the block's i-th item; false past its last
    __device__ __forceinline__ bool next(Work& w) {
        const int G = gridDim.x, b = blockIdx.x;
        const int ndp = dp > b ? (dp - b + G - 1) / G : 0;   // its round-robin tiles
        const int j = i++ - ndp;
        if (j < 0) {
            w = {b + (i - 1) * G, 0, KT};
            return true;
        }
        const long long U = (long long)(ntiles - dp) * KT;   // < 2^31 (launcher's offsets)
        const int u0 = (int)(U * b / G), u1 = (int)(U * (b + 1) / G);
        const int u = j == 0 ? u0 : (u0 / KT + j) * KT;
        if (u >= u1) return false;
        const int k0 = u % KT;
        w = {dp + u / KT, k0, min(KT, k0 + (u1 - u))};
        return true;
    }
};

// The participating threads of the stream-K exchange: the whole block (OFF = 0, __syncthreads)
// or, in a warp-specialized kernel, the T consumer threads from threadIdx.x = OFF on (named
// barrier 1).
template <int T, int OFF>
__device__ __forceinline__ void group_sync() {
    if (OFF == 0) __syncthreads();
    else asm volatile("bar.sync 1, %0;\n" ::"n"(T) : "memory");
}

// A stream-K tail's partial sums: R accumulators per thread into workspace slot blockIdx.x
// (float4 [R/4][T], coalesced; T = the group's thread count, a constant so the offsets are
// immediates), then the slot's flag is raised (release).
template <int R, int T, int OFF = 0>
__device__ __forceinline__ void sk_put(float4* ws, int* flags, const float* acc) {
    float4* p = ws + (blockIdx.x * (R / 4) * T + (threadIdx.x - OFF));
#pragma unroll
    for (int j = 0; j < R / 4; ++j)
        __stcg(p + j * T, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    __threadfence();
    group_sync<T, OFF>();
    if (threadIdx.x == OFF)
        asm volatile("st.release.gpu.global.s32 [%0], 1;\n" ::"l"(flags + blockIdx.x) : "memory");
}

// A stream-K head adds the tail's partial sums of block blockIdx.x + 1 (acc + tail, a fixed
// order: runs are deterministic), once its flag is up; the flag is cleared for the next launch
// (a CUDA graph replays the kernel with no reset). The tail is block b+1's first item, so the
// wait is short; the grid is at most one block per SM, all resident, so it cannot deadlock.
template <int R, int T, int OFF = 0>
__device__ __forceinline__ void sk_add(const float4* ws, int* flags, float* acc) {
    const int src = blockIdx.x + 1;
    if (threadIdx.x == OFF) {
        int f;
        while (true) {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(f) : "l"(flags + src) : "memory");
            if (f) break;
            __nanosleep(64);
        }
        flags[src] = 0;
    }
    group_sync<T, OFF>();
    const float4* p = ws + (src * (R / 4) * T + (threadIdx.x - OFF));
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
        const float4 v = __ldcg(p + j * T);
        acc[4 * j] += v.x;
        acc[4 * j + 1] += v.y;
        acc[4 * j + 2] += v.z;
        acc[4 * j + 3] += v.w;
    }
}

// The epilogue stores of both wgmma MMQ kernels, C[p], C[p + 1] = v (store_c2) or += v (red_c2;
// load_c2 reads them, for mmq_wgmma_q4k's load-add-store path):
// one float2 access when `pair` (p 8-byte aligned and p + 1 in range), else scalars, the second
// only when `second` (p + 1 in range); p itself must be in range. C += runs as fire-and-forget
// reductions (red.global.add: one add per element, rounded as a load-add-store would, except
// that a subnormal sum flushes to zero). A load-add-store per pair waited for each load in turn
// (a load after a store to C cannot move above it: nothing proves the addresses apart): 32
// global round trips per thread and tile, ~20 us a wave at 1 block per SM.
__device__ __forceinline__ float2 load_c2(const float* p, bool pair, bool second) {
    if (pair) return *reinterpret_cast<const float2*>(p);
    return make_float2(p[0], second ? p[1] : 0.f);
}
__device__ __forceinline__ void red_c2(float* p, float2 v, bool pair, bool second) {
    if (pair) {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(v.x), "f"(v.y) : "memory");
    } else {
        atomicAdd(p, v.x);
        if (second) atomicAdd(p + 1, v.y);
    }
}
__device__ __forceinline__ void store_c2(float* p, float2 v, bool pair, bool second) {
    if (pair) {
        *reinterpret_cast<float2*>(p) = v;
    } else {
        p[0] = v.x;
        if (second) p[1] = v.y;
    }
}

// The end of a work item in mmq_sb_q6k.cu: a stream-K tail
// publishes its sums; a head adds its tail's first; whole tiles and heads then store (C =) or
// reduce (C +=, RED) the thread's values of an m64nN accumulator fragment, y[4i + j] at row
// r0 + 8 (j >> 1) and column c0 + 8i + (j & 1) (r0: the thread's first row, c0: the tile's
// first column + 2t). KT: the item's k-units of a whole tile.
template <int NI, int T, bool RED>
__device__ __forceinline__ void finish_item(const Work& cur, int KT, float (&y)[NI * 4], float* C,
                                            int M, int N, int r0, int c0, float4* ws, int* flags) {
    if (cur.k0 > 0) {
        sk_put<NI * 4, T>(ws, flags, y);
    } else {
        if (cur.k1 < KT) sk_add<NI * 4, T>(ws, flags, y);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int r = r0 + 8 * u;
            if (r >= M) continue;
#pragma unroll
            for (int i = 0; i < NI; ++i) {
                const int col = c0 + i * 8;
                if (col >= N) continue;
                const float2 v = make_float2(y[4 * i + 2 * u], y[4 * i + 2 * u + 1]);
                if (RED) red_c2(C + (size_t)r * N + col, v, (N & 1) == 0, col + 1 < N);
                else store_c2(C + (size_t)r * N + col, v, (N & 1) == 0, col + 1 < N);
            }
        }
    }
}

}  // namespace wgmma
