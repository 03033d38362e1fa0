// swiglu.cuh: silu(g) * u for one value, shared by layers.cu (the swiglu layer) and the GEMMs'
// swiglu epilogues (gemm_f16_common.cuh, wgmma_int8.cuh), so they round identically. Each operation is
// rounded on its own (__fdiv_rn / __fadd_rn / __fmul_rn: no FMA contraction), as the numpy twin
// minfer.reference.ops.swiglu does.
#pragma once

__device__ __forceinline__ float swiglu1(float gv, float uv) {
    const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
    return __fmul_rn(silu, uv);
}

// The same function with the fast intrinsics (__expf, __fdividef: a few ulp of f32, far under
// the f16 rounding that follows): the int8 wgmma GEMM's swiglu epilogue, where the exact form's
// IEEE division and expf sit on the GEMM's critical path (wgmma_int8.cuh store_swiglu).
__device__ __forceinline__ float swiglu1_fast(float gv, float uv) {
    return __fmul_rn(__fdividef(gv, 1.0f + __expf(-gv)), uv);
}
