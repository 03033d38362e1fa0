// wgmma_common.cuh: the Hopper wgmma plumbing shared by gemm_f16_sm90a.cu and mmq_wgmma_q4k.cu
// (sm_90a only): the async-proxy fence, wgmma fence / commit / wait, and the shared-memory
// descriptor of a K-major operand stored with the 128-byte swizzle (rows of 128 bytes, the
// 16-byte chunk c of row r at c ^ (r % 8), 8-row atoms 1024 B apart, 1024-byte aligned tiles).
// One k-step of a wgmma reads 32 bytes of each row (k16 of f16, k32 of int8): its descriptor
// starts 32 * step bytes into the atom.
#pragma once
#include <stdint.h>

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

}  // namespace wgmma
