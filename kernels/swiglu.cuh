// swiglu.cuh: the GLU activations of one value, act(g) * u, shared by the layers that apply them
// (layers.cu swiglu, gemma_layers.cu geglu) and the GEMMs' glu epilogues (gemm_f16_common.cuh,
// wgmma_int8.cuh), so they round identically. Each operation is rounded on its own
// (__fdiv_rn / __fadd_rn / __fmul_rn: no FMA contraction), as the numpy twins
// minfer.reference.ops.swiglu / ops.geglu do. glu1<ACT> / glu1_fast<ACT>: ACT 0 silu (SwiGLU,
// llama), 1 ggml's tanh GELU (GeGLU, gemma).
#pragma once
#include <cuda_fp16.h>

__device__ __forceinline__ float swiglu1(float gv, float uv) {
    const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
    return __fmul_rn(silu, uv);
}

// The same function with the fast intrinsics (__expf, __fdividef: a few ulp of f32, far under
// the f16 rounding that follows): the int8 wgmma GEMM's glu epilogue, where the exact form's
// IEEE division and expf sit on the GEMM's critical path (wgmma_int8.cuh store_glu).
__device__ __forceinline__ float swiglu1_fast(float gv, float uv) {
    return __fmul_rn(__fdividef(gv, 1.0f + __expf(-gv)), uv);
}

// GELU (tanh form) as the reference's float32 mode, which is ggml's CPU op: a table indexed by
// x rounded to f16 holding f16(gelu_f32(x_f16)); x >= 10 passes, x <= -10 gives 0. The table's
// value is computed here (tanhf within 2 ulp of f32, then rounded to f16: equal to the table
// but where tanhf's last bits cross an f16 rounding boundary, 1 f16 ulp). FAST (the int8 GEMM's
// epilogue): tanh from __expf and __fdividef, a few ulp of f32 before the f16 rounding, as
// 1 + tanh(v) = 2 / (1 + e^-2v), which cancels nowhere (2 sigmoid(2v)).
template <bool FAST = false>
__device__ __forceinline__ float gelu_ggml(float x) {
    if (x >= 10.f) return x;
    if (x <= -10.f) return 0.f;
    const float h = __half2float(__float2half_rn(x));
    if constexpr (FAST) {
        const float inner = 0.79788456080286535587989211986876f * h * (1.f + 0.044715f * h * h);
        const float one_plus_tanh = __fdividef(2.f, 1.f + __expf(-2.f * inner));
        return __half2float(__float2half_rn(0.5f * h * one_plus_tanh));
    } else {
        const float inner = __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, h),
                                      __fadd_rn(1.f, __fmul_rn(__fmul_rn(0.044715f, h), h)));
        const float y = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.f, tanhf(inner)));
        return __half2float(__float2half_rn(y));
    }
}

__device__ __forceinline__ float geglu1(float gv, float uv) {
    return __fmul_rn(gelu_ggml(gv), uv);
}

template <int ACT>
__device__ __forceinline__ float glu1(float gv, float uv) {
    static_assert(ACT == 0 || ACT == 1, "ACT 0 silu, 1 gelu");
    if constexpr (ACT == 0) return swiglu1(gv, uv);
    else return geglu1(gv, uv);
}

template <int ACT>
__device__ __forceinline__ float glu1_fast(float gv, float uv) {
    static_assert(ACT == 0 || ACT == 1, "ACT 0 silu, 1 gelu");
    if constexpr (ACT == 0) return swiglu1_fast(gv, uv);
    else return __fmul_rn(gelu_ggml<true>(gv), uv);
}

// the layers' body: y f16 [T, F] = act(g) * u, g / u f32 rows of stride ldg; grid
// (ceil(F / 256), T), block 256 (layers.cu swiglu_f32_f16, gemma_layers.cu geglu_f32_f16)
template <int ACT>
__device__ __forceinline__ void glu_rows_f32_f16(__half* y, long ldy, const float* g,
                                                 const float* u, long ldg, int F) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= F) return;
    y[t * ldy + i] = __float2half_rn(glu1<ACT>(g[t * ldg + i], u[t * ldg + i]));
}
