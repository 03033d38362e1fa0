// quantize_q8_1.cu: activations -> q8_1 raw blocks (40 B per 32 values), the MMQ prepass.
// Per block: amax = max|x|, d = amax/127 (f32), q = amax == 0 ? 0 : roundf(x/d) (IEEE f32
// division, round half away from zero, like ggml's CUDA quantize_q8_1), s = sum of the q's
// (int32), d stored as f16 (round to nearest even). Bit-identical to
// minfer.quants.q8_1.quantize_q8_1_raw.
// Entries: quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K)      x f32 [M, K]
//          quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) x f16 [M, K]
// One warp per block of 32 values; grid (ceil(M*K/32 / 8)), block 256. K % 32 == 0.
#include "mmq_common.cuh"

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ void quantize_block(const T* x, uint8_t* y, int M, int K) {
    const long long nblk = (long long)M * (K / 32);
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return;
    const float xi = to_f32<T>(x[b * 32 + lane]);
    float amax = fabsf(xi);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const int q = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(xi, d));
    int s = q;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    uint8_t* blk = y + b * 40;
    // 4 lanes' bytes -> one 32-bit store (blk + 4 + lane is 4-byte aligned for lane % 4 == 0)
    const uint32_t qb = (uint32_t)q & 0xFFu;
    const uint32_t w = qb | (__shfl_down_sync(0xffffffffu, qb, 1) << 8) |
                       (__shfl_down_sync(0xffffffffu, qb, 2) << 16) |
                       (__shfl_down_sync(0xffffffffu, qb, 3) << 24);
    if ((lane & 3) == 0) *(uint32_t*)(blk + 4 + lane) = w;
    if (lane == 0) {
        *(uint32_t*)blk = (uint32_t)__half_as_ushort(__float2half_rn(d));   // d, pad = 0
        *(int32_t*)(blk + 36) = s;
    }
}

extern "C" __global__ void quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K) {
    quantize_block<float>(x, y, M, K);
}

extern "C" __global__ void quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) {
    quantize_block<__half>(x, y, M, K);
}
