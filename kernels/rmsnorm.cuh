// rmsnorm.cuh: the row scale of rmsnorm, shared by layers.cu (rmsnorm_f32_*) and
// quantize_q8_1.cu (rmsnorm_sb_operand), so the two give bit-identical f16 activations.
//   scale = (float)(1 / sqrt(sum(x^2) / D + eps)), sum of squares in double (as ggml),
//   y = f16/f32(x * scale * w) with the two products rounded separately (rms_value).
// Block-wide (every thread of the block calls it, blockDim.x a multiple of 32, <= 1024). The
// summation order is fixed by the launch: thread t sums its pieces t, t + blockDim.x, ... (16-byte
// float4 pieces when D % 4 == 0 and the row is 16-byte aligned, else single values), then a
// shuffle tree per warp, then warp 0 over the warps.
#pragma once
#include <stdint.h>

__device__ __forceinline__ float rms_scale(const float* __restrict__ xr, int D, float eps) {
    double s = 0.0;
    if ((D & 3) == 0 && ((uintptr_t)xr & 15) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 4
        for (int p = threadIdx.x; p < D / 4; p += blockDim.x) {   // loads issued 4 at a time
            const float4 f = x4[p];
            s += (double)f.x * f.x + (double)f.y * f.y + (double)f.z * f.z + (double)f.w * f.w;
        }
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            const double v = (double)xr[i];
            s += v * v;
        }
    }
    __shared__ double red[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) red[0] = s;
    }
    __syncthreads();
    return (float)(1.0 / sqrt(red[0] / D + (double)eps));
}

// one normalized value before the output cast: (x * scale) * w, each product rounded
__device__ __forceinline__ float rms_value(float x, float scale, float w) {
    return __fmul_rn(__fmul_rn(x, scale), w);
}
