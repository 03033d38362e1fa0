// rope.cuh: the rotary embedding's rotation and the GEMM rope epilogue's target, shared by
// layers.cu (the rope kernels) and gemm_f16_common.cuh (mode 4: the fused qkv GEMM writes roped
// q, k and v straight into q16 and the KV cache), so both round alike bit for bit.
#pragma once
#include <cuda_fp16.h>
#include <stddef.h>   // offsetof

// (a, b) rotated by the angle (c, sn): (a c - b sn, a sn + b c), each product and sum rounded
// on its own (no FMA contraction), as the numpy twin minfer.reference.ops.rope computes it
__device__ __forceinline__ float2 rope_rot(float a, float b, float c, float sn) {
    return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)),
                       __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c)));
}

// Mode 4's target, in device memory (minfer/cuda/ops/layers.py QkvRope packs it; its numpy dtype
// is pinned against these offsets by tests/test_rope_epilogue.py): the fused qkv GEMM's row t,
// column c (N = qd + 2 kd) goes to q16[t, c] (c < qd), kc[pos + t, c - qd] (k) or vc[pos + t,
// c - qd - kd] (v), q and k rotated in adjacent pairs (the llama, non-neox order) for the pair
// index (c mod D) / 2 < half_r, with cos_t / sin_t [n_pos, half_r] at the position slot - lo of
// row t's tok[t] = (KV slot, its sequence's first slot), read on the device as rope_qkv reads
// it, so a captured graph serves every layout.
struct RopeQkv {
    __half* q16;          // [T, qd]
    __half* kc;           // [S, kd] this layer's K cache
    __half* vc;           // [S, kd] this layer's V cache
    const float* cos_t;   // [n_pos, half_r]
    const float* sin_t;   // [n_pos, half_r]
    const int2* tok;      // [T]: (slot, lo) per row
    int qd, kd, D, half_r;
};
static_assert(sizeof(RopeQkv) == 64 && offsetof(RopeQkv, qd) == 48 && offsetof(RopeQkv, half_r) == 60,
              "minfer/cuda/ops/layers.py ROPE_QKV_DTYPE");
