// quantize_q8_1.cu: activations -> q8_1 raw blocks (40 B per 32 values), the MMQ prepass.
// Per block: amax = max|x|, d = amax/127 (f32), q = amax == 0 ? 0 : roundf(x/d) (IEEE f32
// division, round half away from zero, like ggml's CUDA quantize_q8_1), s = sum of the q's
// (int32), d stored as f16 (round to nearest even). Bit-identical to
// minfer.quants.q8_1.quantize_q8_1_raw.
// Entries: quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K)      x f32 [M, K]
//          quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) x f16 [M, K]
//          quantize_q8_1_split(_f16)(x, uint8_t* Aq, float2* Ta, int M, int K, int Mp): the same
//            blocks laid out for the wgmma kernel (mmq_wgmma_q4k.cu): Aq [M, K] = q + 128 (u8),
//            Ta [K/32, Mp] = (d * 2^75, d * s) with d the f16-rounded scale (rows >= M untouched).
//          quantize_q8_1_split6(_f16)(x, uint8_t* Xq, uint8_t* Tx, int M, int K): the blocks laid
//            out for mmq_wgmma_q6k.cu: Xq [M, 2K], per chunk 64 B = [q+128 of values 0..15 |
//            32 zeros | q+128 of values 16..31]; Tx one 5 KB block per (64-token tile, 128-k
//            stage) at (m/64 * K/128 + kt) * 5120: TD float [4 chunks][64] = d * 2^75, then TS
//            uint2 [8 halves][64] = d * (sum of the half's q) as tf32 (hi, lo). K % 128 == 0.
// One warp per block of 32 values; grid (ceil(M*K/32 / 8)), block 256. K % 32 == 0.
#include "mmq_common.cuh"

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

struct Q8Block { int q, s; float d; };   // this lane's value, the block's sum and f32 scale

template <class T>
__device__ __forceinline__ Q8Block quantize_lane(const T* x, long long b, int lane) {
    const float xi = to_f32<T>(x[b * 32 + lane]);
    float amax = fabsf(xi);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const int q = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(xi, d));
    int s = q;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return {q, s, d};
}

// 4 lanes' bytes -> one 32-bit word (valid in lanes with lane % 4 == 0)
__device__ __forceinline__ uint32_t pack4(uint32_t qb) {
    return qb | (__shfl_down_sync(0xffffffffu, qb, 1) << 8) |
           (__shfl_down_sync(0xffffffffu, qb, 2) << 16) | (__shfl_down_sync(0xffffffffu, qb, 3) << 24);
}

template <class T>
__device__ __forceinline__ void quantize_block(const T* x, uint8_t* y, int M, int K) {
    const long long nblk = (long long)M * (K / 32);
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return;
    const Q8Block r = quantize_lane<T>(x, b, lane);
    uint8_t* blk = y + b * 40;
    const uint32_t w = pack4((uint32_t)r.q & 0xFFu);   // blk + 4 + lane: 4-byte aligned
    if ((lane & 3) == 0) *(uint32_t*)(blk + 4 + lane) = w;
    if (lane == 0) {
        *(uint32_t*)blk = (uint32_t)__half_as_ushort(__float2half_rn(r.d));   // d, pad = 0
        *(int32_t*)(blk + 36) = r.s;
    }
}

template <class T>
__device__ __forceinline__ void quantize_split(const T* x, uint8_t* Aq, float2* Ta, int M, int K,
                                               int Mp) {
    const long long nblk = (long long)M * (K / 32);
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return;
    const Q8Block r = quantize_lane<T>(x, b, lane);
    const uint32_t w = pack4((uint32_t)(r.q + 128) & 0xFFu);
    if ((lane & 3) == 0) *(uint32_t*)(Aq + b * 32 + lane) = w;
    if (lane == 0) {
        const long long m = b / (K / 32), j = b % (K / 32);
        const float d = __half2float(__float2half_rn(r.d));
        Ta[j * Mp + m] = make_float2(d * 0x1p75f, d * (float)r.s);
    }
}

template <class T>
__device__ __forceinline__ void quantize_split6(const T* x, uint8_t* Xq, uint8_t* Tx, int M, int K) {
    const long long nblk = (long long)M * (K / 32);
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblk) return;
    const Q8Block r = quantize_lane<T>(x, b, lane);
    int hs = r.q;   // the sum of this lane's 16-half
    #pragma unroll
    for (int o = 8; o > 0; o >>= 1) hs += __shfl_xor_sync(0xffffffffu, hs, o);
    const uint32_t w = pack4((uint32_t)(r.q + 128) & 0xFFu);
    const long long m = b / (K / 32), j = b % (K / 32);
    uint8_t* row = Xq + m * 2 * K + j * 64;
    if ((lane & 3) == 0) *(uint32_t*)(row + lane + (lane & 16) * 2) = w;   // 0..15, 48..63
    if ((lane & 3) == 1) *(uint32_t*)(row + 16 + 4 * (lane >> 2)) = 0u;    // 16..47
    if ((lane & 15) == 0) {
        const float d = __half2float(__float2half_rn(r.d));
        uint8_t* blk = Tx + ((m / 64) * (K / 128) + j / 4) * 5120;
        const int tm = (int)(m % 64), cc = (int)(j % 4), h = lane >> 4;
        if (h == 0) reinterpret_cast<float*>(blk)[cc * 64 + tm] = d * 0x1p75f;
        uint32_t hi, lo;
        tf32_split(d * (float)hs, hi, lo);
        reinterpret_cast<uint2*>(blk + 1024)[(2 * cc + h) * 64 + tm] = make_uint2(hi, lo);
    }
}

extern "C" __global__ void quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K) {
    quantize_block<float>(x, y, M, K);
}

extern "C" __global__ void quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) {
    quantize_block<__half>(x, y, M, K);
}

extern "C" __global__ void quantize_q8_1_split(const float* x, uint8_t* Aq, float2* Ta, int M,
                                               int K, int Mp) {
    quantize_split<float>(x, Aq, Ta, M, K, Mp);
}

extern "C" __global__ void quantize_q8_1_split_f16(const __half* x, uint8_t* Aq, float2* Ta,
                                                   int M, int K, int Mp) {
    quantize_split<__half>(x, Aq, Ta, M, K, Mp);
}

extern "C" __global__ void quantize_q8_1_split6(const float* x, uint8_t* Xq, uint8_t* Tx, int M,
                                                int K) {
    quantize_split6<float>(x, Xq, Tx, M, K);
}

extern "C" __global__ void quantize_q8_1_split6_f16(const __half* x, uint8_t* Xq, uint8_t* Tx,
                                                    int M, int K) {
    quantize_split6<__half>(x, Xq, Tx, M, K);
}
