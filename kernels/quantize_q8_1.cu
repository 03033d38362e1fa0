// quantize_q8_1.cu: activations -> q8_1 raw blocks (40 B per 32 values), the MMQ prepass.
// Per block: amax = max|x|, d = amax/127 (f32), q = amax == 0 ? 0 : roundf(x/d) (IEEE f32
// division, round half away from zero, like ggml's CUDA quantize_q8_1), s = sum of the q's
// (int32), d stored as f16 (round to nearest even). Bit-identical to
// minfer.quants.q8_1.quantize_q8_1_raw.
// Entries: quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K)      x f32 [M, K]
//          quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) x f16 [M, K]
// Eight lanes per block of 32 values, four values per lane (one 16-byte f32 / 8-byte f16 load;
// x 16-byte aligned): a warp quantizes 4 blocks, reductions are 3 shuffle steps. Grid
// (ceil(M*K/32 / 32)), block 256. K % 32 == 0. (One warp per block with one value per lane spent
// ~20 us on [512, 4096]: ten shuffles and a division chain per value, latency-bound.)
#include "mmq_common.cuh"

struct Q8Lane { int q[4]; int s, hs; float d; };   // this lane's 4 values, block / half sums, f32 d

__device__ __forceinline__ void load4(const float* x, long long i, float (&v)[4]) {
    const float4 f = *reinterpret_cast<const float4*>(x + i);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}
__device__ __forceinline__ void load4(const __half* x, long long i, float (&v)[4]) {
    const uint2 u = *reinterpret_cast<const uint2*>(x + i);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}

// Where a block's values come from: Rows<T> reads x [M, K] (f32 or f16). values(b, l8, v):
// block b's values 4*l8 .. 4*l8+3.
template <class T>
struct Rows {
    const T* x;
    int K;
    __device__ __forceinline__ void values(long long b, int l8, float (&v)[4]) const {
        load4(x, b * 32 + 4 * l8, v);
    }
};

// block b's values 4*l8 .. 4*l8+3 (l8 = lane % 8); every lane of the warp must call it
template <class Src>
__device__ __forceinline__ Q8Lane quantize_lanes(const Src& src, long long b, int l8) {
    float v[4];
    src.values(b, l8, v);
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    #pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    Q8Lane r;
    r.d = __fdiv_rn(amax, 127.0f);
    int s = 0;
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        r.q[k] = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(v[k], r.d));
        s += r.q[k];
    }
    #pragma unroll
    for (int o = 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    r.hs = s;                                            // lanes 0-3: values 0..15, 4-7: 16..31
    r.s = s + __shfl_xor_sync(0xffffffffu, s, 4);
    return r;
}

__device__ __forceinline__ uint32_t pack4(const int (&q)[4], int off) {
    return ((uint32_t)(q[0] + off) & 0xFFu) | (((uint32_t)(q[1] + off) & 0xFFu) << 8) |
           (((uint32_t)(q[2] + off) & 0xFFu) << 16) | (((uint32_t)(q[3] + off) & 0xFFu) << 24);
}

// this thread's block (b) and lane in it; false past the last block (after the shuffles)
__device__ __forceinline__ long long block_of_thread(int& l8) {
    l8 = threadIdx.x & 7;
    return (long long)blockIdx.x * (blockDim.x >> 3) + (threadIdx.x >> 3);
}

template <class T>
__device__ __forceinline__ void quantize_block(const T* x, uint8_t* y, int M, int K) {
    const long long nblk = (long long)M * (K / 32);
    int l8;
    const long long b = block_of_thread(l8);
    const Q8Lane r = quantize_lanes(Rows<T>{x, K}, b < nblk ? b : nblk - 1, l8);
    if (b >= nblk) return;
    uint8_t* blk = y + b * 40;
    *(uint32_t*)(blk + 4 + 4 * l8) = pack4(r.q, 0);
    if (l8 == 0) {
        *(uint32_t*)blk = (uint32_t)__half_as_ushort(__float2half_rn(r.d));   // d, pad = 0
        *(int32_t*)(blk + 36) = r.s;
    }
}

extern "C" __global__ void quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K) {
    quantize_block<float>(x, y, M, K);
}

extern "C" __global__ void quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) {
    quantize_block<__half>(x, y, M, K);
}
