// rmsnorm.cuh: the row scale of rmsnorm for layers.cu (rmsnorm_f32_*).
//   scale = (float)(1 / sqrt(sum(x^2) / D + eps)), sum of squares in double (as ggml),
//   y = f16/f32(x * scale * w) with the two products rounded separately (rms_value).
// Block-wide (every thread of the block calls rms_scale / rms_finish; blockDim.x a multiple of
// 32, <= 1024). The summation order is fixed: the row is cut into 256-value chunks, chunk c
// goes to warp c % warps, lane l sums the chunk's values 8l .. 8l + 7 in order (two 16-byte
// loads; single values where D % 8 != 0 or the row is not 16-byte aligned: then thread t sums
// t, t + blockDim.x, ...), chunks in increasing order; then a shuffle tree per warp, then warp
// 0 over the warps.
#pragma once
#include <stdint.h>

// one lane's part of a chunk: s += x[0]^2 + ... + x[7]^2, in order
__device__ __forceinline__ double rms_chunk_sum(double s, const float (&x)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) s += (double)x[e] * x[e];
    return s;
}

// values 8l .. 8l + 7 of chunk c (zeros past D; D % 8 == 0, row 16-byte aligned)
__device__ __forceinline__ void rms_load8(const float* __restrict__ xr, int D, int c, int l,
                                          float (&x)[8]) {
    const int k = c * 256 + 8 * l;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (k < D) {
        a = *reinterpret_cast<const float4*>(xr + k);
        b = *reinterpret_cast<const float4*>(xr + k + 4);
    }
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}

__device__ __forceinline__ bool rms_vec(const float* xr, int D) {
    return (D & 7) == 0 && ((uintptr_t)xr & 15) == 0;
}

// the block's sum of the threads' partial sums s -> the row's scale
__device__ __forceinline__ float rms_finish(double s, int D, float eps) {
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

__device__ __forceinline__ float rms_scale(const float* __restrict__ xr, int D, float eps) {
    double s = 0.0;
    if (rms_vec(xr, D)) {
        const int warps = blockDim.x >> 5, l = threadIdx.x & 31;
#pragma unroll 2
        for (int c = threadIdx.x >> 5; c < (D + 255) / 256; c += warps) {
            float x[8];
            rms_load8(xr, D, c, l, x);
            s = rms_chunk_sum(s, x);
        }
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            const double v = (double)xr[i];
            s += v * v;
        }
    }
    return rms_finish(s, D, eps);
}

// one normalized value before the output cast: (x * scale) * w, each product rounded
__device__ __forceinline__ float rms_value(float x, float scale, float w) {
    return __fmul_rn(__fmul_rn(x, scale), w);
}
