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

// ---- register fences ----

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

// ---- warp specialization: mbarriers in shared memory, bulk copies, register
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
// A TMA tensor map (CUtensorMap's size and alignment), made on the host by
// minfer/cuda/runtime/tma.py
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

// box {64 halves, rows} at (k0, row0) of a 2-D f16 tensor map -> shared memory in the map's
// swizzle, rows and columns past the tensor zero-filled; completes as transactions on `bar`
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap* map, int k0, int row0,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)),
        "r"(k0), "r"(row0), "r"(bar) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- the tile schedule of the persistent int8 kernel (data-parallel, then stream-K) ----
// Tiles [0, dp) go round-robin over the grid (whole waves); the last ntiles - dp tiles are split
// by k-stages: their U = (ntiles - dp) * KT stage units are dealt out evenly, block b taking
// units [b U / G, (b+1) U / G) in tile-major order. The launcher (minfer.cuda.paths.blk.stream_k.
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

}  // namespace wgmma
