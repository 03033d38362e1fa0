// blk_operand.cuh: the block path's operand in registers, shared by every launch that writes one
// (mmq_blk.cu's prepass and rmsnorm_blk_operand, attention_sm90a.cu's epilogue): a 128-value
// block's Walsh-Hadamard rotation spread over a few lanes (butterflies in registers and across
// lanes, in the stage order of minfer.cuda.paths.blk.twin.fwht128, so the f32 sums are the twin's bit
// for bit), its max |v|, and the int8 bytes of the swizzled image (blk_ref.blk_operand's layout:
// 16-byte chunk c of image row r at r * 128 + (c ^ (r % 8)) * 16; then 128 f32 scales).
#pragma once
#include <stdint.h>

namespace blkop {
constexpr int IMG = 128 * 128, OP = IMG + 128 * 4;   // a block: image, scales
static_assert(OP == 16896 && OP % 16 == 0, "operand block (blk_ref.BLK_OP)");

// (a, b) at (i, i + h) -> (a + b, a - b) over the register index bit `bit` of v
template <int bit, int N>
__device__ __forceinline__ void butterfly(float (&v)[N]) {
#pragma unroll
    for (int r = 0; r < N; ++r) {
        if (r & (1 << bit)) continue;
        const float a = v[r], b = v[r | (1 << bit)];
        v[r] = a + b;
        v[r | (1 << bit)] = a - b;
    }
}

// the same butterfly across lanes: partner lane l ^ m holds index i ^ h
template <int N>
__device__ __forceinline__ void butterfly_x(float (&v)[N], int l, int m) {
#pragma unroll
    for (int r = 0; r < N; ++r) {
        const float o = __shfl_xor_sync(0xffffffffu, v[r], m);
        v[r] = (l & m) ? o - v[r] : v[r] + o;
    }
}

// max |v| over the lanes l ^ 1 .. l ^ (mmax) (mmax + 1 lanes holding one block)
template <int N>
__device__ __forceinline__ float block_amax(const float (&v)[N], int mmax) {
    float amax = 0.f;
#pragma unroll
    for (int r = 0; r < N; ++r) amax = fmaxf(amax, fabsf(v[r]));
    for (int m = 1; m <= mmax; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    return amax;
}

// q = rint(v * inv) (inv = 127 / amax, 0 for an all-zero block; |v| <= amax keeps |q| <= 127)
// into image row r: values 32 j + 8 l .. + 7 are 8 bytes of 16-byte chunk 2 j + l / 2. The
// rint is the magic-number add (2^23 + 2^22 + p holds rint(p) in its low mantissa bits; the
// multiply rounds first, as the twin's), its low byte q's two's complement: a multiply, an add
// and 3/4 of a byte permute per value (the prepass runs before every GEMM)
__device__ __forceinline__ uint32_t q8(float v, float inv) {
    return __float_as_uint(__fadd_rn(__fmul_rn(v, inv), 12582912.f));   // (_rn: no FFMA)
}

// 8 values' int8 as 8 bytes
__device__ __forceinline__ uint2 pack8(const float* u, float inv) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h, u += 4) {
        const uint32_t lo = __byte_perm(q8(u[0], inv), q8(u[1], inv), 0x0040);
        const uint32_t hi = __byte_perm(q8(u[2], inv), q8(u[3], inv), 0x0040);
        w[h] = __byte_perm(lo, hi, 0x5410);
    }
    return make_uint2(w[0], w[1]);
}

// block kb of row `row` in an operand of Rp rows ([KB, Rp / 128, OP]): its tile's image and scales
__device__ __forceinline__ uint8_t* block_at(uint8_t* op, int kb, int Rp, int row) {
    return op + (static_cast<size_t>(kb) * (Rp / 128) + row / 128) * OP;
}

// the multiplier q8 takes for a block of max |v| amax (0 for an all-zero block)
__device__ __forceinline__ float q8_inv(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }

// image row r's scale: amax / 127 (times smul: a weight's 1/128)
__device__ __forceinline__ void store_scale(uint8_t* blk, int r, float amax, float smul = 1.f) {
    reinterpret_cast<float*>(blk + IMG)[r] = amax / 127.f * smul;
}

// value i of image row r: byte i % 16 of its 16-byte chunk i / 16, swizzled
__device__ __forceinline__ uint8_t* img_at(uint8_t* img, int r, int i) {
    return img + r * 128 + (((i >> 4) ^ (r & 7)) << 4) + (i & 15);
}

// values i .. i + 7 (i % 8 == 0) of image row r: 8 bytes of its 16-byte chunk i / 16
__device__ __forceinline__ void store8(uint8_t* img, int r, int i, uint2 q) {
    *reinterpret_cast<uint2*>(img_at(img, r, i & ~7)) = q;   // (i & ~7: i % 8 == 0, said)
}

}  // namespace blkop
