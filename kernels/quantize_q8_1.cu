// quantize_q8_1.cu: activations -> q8_1 raw blocks (40 B per 32 values), the MMQ prepass.
// Per block: amax = max|x|, d = amax/127 (f32), q = amax == 0 ? 0 : roundf(x/d) (IEEE f32
// division, round half away from zero, like ggml's CUDA quantize_q8_1), s = sum of the q's
// (int32), d stored as f16 (round to nearest even). Bit-identical to
// minfer.quants.q8_1.quantize_q8_1_raw.
// Entries: quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K)      x f32 [M, K]
//          quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) x f16 [M, K]
//          quantize_q8s_split(_f16)(x, uint8_t* Aq, float2* Ta, int M, int K, int Mp): one
//            scale per 256 values (q8s, for mmq_sb_q4k.cu): Aq [M, K] = q + 128 (u8),
//            Ta [K/32, Mp] = (d * 2^75, d * s) with d the 256-block's f16-rounded scale (the
//            same for its 8 chunks) and s the chunk's sum; one warp per 256, K % 256 == 0.
//          sb_token_tables(const uint8_t* Aq, const float2* Ta, uint8_t* Tt, int M, int K,
//            int Mp): mmq_sb_q4k.cu's token operand from a q8s split (at the entry).
//          q8s_sb_operand(_f16)(x, uint8_t* Tt, int M, int K, int Mp) and
//            q8s_sb_operand_swiglu(g, u, ldg, Tt, M, K, Mp): the q8s split and sb_token_tables
//            in one launch, straight from the activations (or from f16(silu(g) * u)): the same
//            bytes, without Aq and Ta (at the entries).
//          rmsnorm_sb_operand(x, w, eps, h16, Tt, M, K, Mp): rmsnorm and q8s_sb_operand_f16 in
//            one launch (h16 written when non-null), CTA per token (at the entry).
// Eight lanes per block of 32 values, four values per lane (one 16-byte f32 / 8-byte f16 load;
// x 16-byte aligned): a warp quantizes 4 blocks, reductions are 3 shuffle steps. Grid
// (ceil(M*K/32 / 32)), block 256. K % 32 == 0. (One warp per block with one value per lane spent
// ~20 us on [512, 4096]: ten shuffles and a division chain per value, latency-bound.)
#include "mmq_common.cuh"
#include "mmq_sb_layout.cuh"
#include "rmsnorm.cuh"
#include "swiglu.cuh"

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

// Where a block's values come from: Rows<T> reads x [M, K] (f32 or f16); Swiglu computes them,
// x = f16(silu(g) * u) from g, u f32 [M, K] of row stride ldg. values(b, l8, v): block b's
// values 4*l8 .. 4*l8+3.
template <class T>
struct Rows {
    const T* x;
    int K;
    // row m's values k .. k+7 (k % 8 == 0)
    __device__ __forceinline__ void values8(int m, int k, float (&v)[8]) const {
        load4(x, (long long)m * K + k, *reinterpret_cast<float(*)[4]>(&v[0]));
        load4(x, (long long)m * K + k + 4, *reinterpret_cast<float(*)[4]>(&v[4]));
    }
    __device__ __forceinline__ void values(long long b, int l8, float (&v)[4]) const {
        load4(x, b * 32 + 4 * l8, v);
    }
};

struct Swiglu {
    const float *g, *u;
    long long ldg;
    int K;
    // row m's values k .. k+7 (k % 8 == 0)
    __device__ __forceinline__ void values8(int m, int k, float (&v)[8]) const {
        float gv[8], uv[8];
        load4(g, m * ldg + k, *reinterpret_cast<float(*)[4]>(&gv[0]));
        load4(g, m * ldg + k + 4, *reinterpret_cast<float(*)[4]>(&gv[4]));
        load4(u, m * ldg + k, *reinterpret_cast<float(*)[4]>(&uv[0]));
        load4(u, m * ldg + k + 4, *reinterpret_cast<float(*)[4]>(&uv[4]));
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __half2float(__float2half_rn(swiglu1(gv[j], uv[j])));
    }
    __device__ __forceinline__ void values(long long b, int l8, float (&v)[4]) const {
        const long long i = b / (K / 32) * ldg + b % (K / 32) * 32 + 4 * l8;
        float gv[4], uv[4];
        load4(g, i, gv);
        load4(u, i, uv);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = __half2float(__float2half_rn(swiglu1(gv[k], uv[k])));
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

// A warp's 256 values (8 per lane) of one super-block with amax their warp-wide max: q =
// roundf(x / d), d = amax / 127 (q8_1's rules); returns the 32-chunk's sum of q (lanes 4j..4j+3
// hold chunk j)
// The quotient comes from one reciprocal per lane: y = x (1 / d) is within 2.3e-5 of the IEEE
// x / d (|x / d| <= 127: two roundings of 2^-24 each), so roundf(y) is roundf(x / d) unless
// x / d lies within 1e-4 of a half-integer, where the division decides (about 2 values in
// 10,000; also NaN, and d under 2^-125 where 1 / d would not be finite). rint(y) and the
// integer come from the 1.5 2^23 shift (|y| < 2^22), so a value costs an FMUL, three FADDs, a
// compare and an IADD instead of the division's sequence (this launch was instruction-bound).
__device__ __forceinline__ int q8s_quantize(const float (&v)[8], float amax, int (&q)[8]) {
    const float d = __fdiv_rn(amax, 127.0f);
    const float r = __frcp_rn(d);
    const bool fast = d >= 0x1p-125f;   // (amax == 0 is not fast: q = 0 below)
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float y = __fmul_rn(v[k], r);
        const float t = __fadd_rn(y, 0x1.8p23f);   // rint(y) in the low mantissa bits
        const float off = fabsf(__fsub_rn(y, __fsub_rn(t, 0x1.8p23f)));   // |y - rint(y)|
        q[k] = __float_as_int(t) - 0x4B400000;
        if (!(fast && off <= 0.4999f)) q[k] = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(v[k], d));
        s += q[k];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    return s + __shfl_xor_sync(0xffffffffu, s, 2);
}

// q8s: one scale per 256 values (a super-block, llama.cpp's q8_K grouping) for mmq_sb_q4k.cu,
// with q8_1's rounding rules. One warp per super-block, 8 values per lane (chunk = lane / 4).
template <int BIAS, class T>
__device__ __forceinline__ void quantize_q8s_split(const T* x, uint8_t* Aq, float2* Ta, int M,
                                                   int K, int Mp) {
    const long long nsb = (long long)M * (K / 256);
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int l = threadIdx.x & 31;
    const long long i = (b < nsb ? b : nsb - 1) * 256 + 8 * l;
    float v[8];
    load4(x, i, *reinterpret_cast<float(*)[4]>(&v[0]));
    load4(x, i + 4, *reinterpret_cast<float(*)[4]>(&v[4]));
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    int q[8];
    const int s = q8s_quantize(v, amax, q);
    if (b >= nsb) return;
    const int lo[4] = {q[0], q[1], q[2], q[3]}, hi[4] = {q[4], q[5], q[6], q[7]};
    *reinterpret_cast<uint2*>(Aq + i) = make_uint2(pack4(lo, BIAS), pack4(hi, BIAS));
    if ((l & 3) == 0) {
        const long long m = b / (K / 256), j = b % (K / 256) * 8 + l / 4;
        const float dh = __half2float(__float2half_rn(d));
        Ta[j * Mp + m] = make_float2(dh * 0x1p75f, dh * (float)s);
    }
}

extern "C" __global__ void quantize_q8s_split(const float* x, uint8_t* Aq, float2* Ta, int M,
                                              int K, int Mp) {
    quantize_q8s_split<128>(x, Aq, Ta, M, K, Mp);
}

extern "C" __global__ void quantize_q8s_split_f16(const __half* x, uint8_t* Aq, float2* Ta, int M,
                                                  int K, int Mp) {
    quantize_q8s_split<128>(x, Aq, Ta, M, K, Mp);
}

extern "C" __global__ void quantize_q8_1_raw(const float* x, uint8_t* y, int M, int K) {
    quantize_block<float>(x, y, M, K);
}

extern "C" __global__ void quantize_q8_1_raw_f16(const __half* x, uint8_t* y, int M, int K) {
    quantize_block<__half>(x, y, M, K);
}

// The token tables' entries of token mm % 128 in its operand block ob (mmq_sb_layout.cuh),
// shared by sb_token_tables and q8s_sb_operand: a super-block's unit dc = da 2^75 (1 where the
// block is all zero: dx = 0), chunk c's sum s of q as the min term's f16 (lo, hi) =
// (s mod 64, s div 64) (exact: |s| <= 32 * 127), and r = dc of the previous super-block / dc
// with dc, at the fold's position of mm (16 (i / 2) + 4t + 2 (i % 2) + e for mm = 8i + 2t + e)
__device__ __forceinline__ float token_unit(float dx) { return dx != 0.f ? dx : 1.f; }

__device__ __forceinline__ void put_chunk_sum(uint8_t* ob, int mm, int c, int s) {
    __half* b = reinterpret_cast<__half*>(ob + sbop::table_at(512, sbop::TH0)) + (mm / 8) * 128 +
                (mm % 8) * 8 + c;
    b[0] = __int2half_rn(s & 63);
    b[64] = __int2half_rn(s >> 6);
}

__device__ __forceinline__ void put_token_scales(uint8_t* ob, int mm, float prev, float dc) {
    const int pos = (mm >> 4) * 16 + ((mm >> 1) & 3) * 4 + ((mm >> 3) & 1) * 2 + (mm & 1);
    reinterpret_cast<float*>(ob + sbop::table_at(0, sbop::TH0))[pos] = __fdiv_rn(prev, dc);
    reinterpret_cast<float*>(ob + sbop::table_at(4608, sbop::TH0))[pos] = dc;
}

// mmq_sb_q4k.cu's token operand (mmq_sb_layout.cuh; numpy twin:
// minfer.quants.mmq_sb_ref.sb_tokens_ref) from the q8s split (Aq, Ta; quantize_q8s_split). One
// block of 256 threads per (super-block sb, 128-token tile), the block of the operand: the two
// stage images of the tile's rows (Aq's bytes, zeros for tokens m >= M; thread i of a pass
// moves 16-byte piece i % 16 of token i / 16, so reads and writes run along rows) and the
// tables: dc = da 2^75 of the super-block (1 where its block is all zero) at table byte 4608
// and r = dc of the previous super-block / dc (1 / dc on the first, where z is still 0) at
// byte 0, both f32 [128] at the fold's position of m % 128 (16 (i / 2) + 4t + 2 (i % 2) + e
// for m = 8i + 2t + e); at byte 512 the min term's f16 B operand, the chunk sums s_c = sum of
// q as (lo, hi) = (s_c mod 64, s_c div 64), K-major 8 x 16-byte core matrices ([16 token
// groups][lo | hi][8 tokens][8 chunks]). Grid (K/256 * Mp/128), block 256.
extern "C" __global__ void __launch_bounds__(256)
sb_token_tables(const uint8_t* __restrict__ Aq, const float2* __restrict__ Ta,
                uint8_t* __restrict__ Tt, int M, int K, int Mp) {
    using namespace sbop;
    const int MT = Mp / 128, sb = blockIdx.x / MT, mt = blockIdx.x % MT;
    uint8_t* ob = Tt + (size_t)blockIdx.x * TOP;   // block (sb, mt)
#pragma unroll 2
    for (int i = threadIdx.x; i < 128 * 16; i += 256) {
        const int mm = i >> 4, c = i & 15, m = mt * 128 + mm;   // piece c: chunk c / 2, half c % 2
        uint4 v = make_uint4(0, 0, 0, 0);
        int s = 0;   // this half chunk's sum of q
        if (m < M) {
            v = *reinterpret_cast<const uint4*>(Aq + (size_t)m * K + (size_t)sb * 256 + c * 16);
            for (const uint32_t w : {v.x, v.y, v.z, v.w})
                s += (int)(w & 0xFF) + (int)((w >> 8) & 0xFF) + (int)((w >> 16) & 0xFF) +
                     (int)(w >> 24) - 512;
        }
        *reinterpret_cast<uint4*>(ob + image_at(c >> 3, mm, c & 7, TH0)) = v;
        s += __shfl_xor_sync(0xffffffffu, s, 1);   // the chunk's two halves (lanes 2j, 2j+1)
        if (!(c & 1)) put_chunk_sum(ob, mm, c >> 1, s);
    }
    if (threadIdx.x < 128) {
        const int mm = threadIdx.x, m = mt * 128 + mm;
        const float prev = sb > 0 ? token_unit(Ta[(size_t)(8 * sb - 8) * Mp + m].x) : 1.f;
        put_token_scales(ob, mm, prev, token_unit(Ta[(size_t)(8 * sb) * Mp + m].x));
    }
}

// The q8s split and sb_token_tables in one launch (bit-identical to the two; twin:
// sb_tokens_ref(*split_q8s_ref(x))): one warp per (token m < Mp, super-block sb), w = m K/256
// + sb, 8 values per lane (lane l: k = 8l .. 8l+7 of the super-block, chunk l / 4). The warp
// quantizes its 256 values as quantize_q8s_split does and writes them (q + 128) straight into
// the stage images, the chunk sums into the min term's B block and (lane 0) r and dc. r needs
// the previous super-block's scale: the previous warp of the CTA has it (its amax through
// shared memory); only a CTA's first warp reads the 256 values before its own for their amax
// (the activations are read 1 + 1/8 times; Aq and Ta are never written). Tokens m >= M: zero
// images and sums, r = dc = 1 (what the split's zeroed Ta gives). Grid ceil(Mp * K/256 / 8),
// block 256.
__device__ __forceinline__ float warp_amax(const float (&v)[8]) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) a = fmaxf(a, fabsf(v[k]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// a super-block's unit dc = f16(d) 2^75, 1 for an all-zero block (sb_token_tables' rule)
__device__ __forceinline__ float sb_unit(float amax) {
    return token_unit(__half2float(__float2half_rn(__fdiv_rn(amax, 127.0f))) * 0x1p75f);
}

// Lane l's part of token m's super-block sb in the operand (values v = k 8l .. 8l+7 of it, the
// block's amax, prev = the previous super-block's unit): q + 128 into the stage image, the chunk
// sums and (lane 0) r and dc into the tables. Tokens m >= M: zero image (v, amax are 0 there).
__device__ __forceinline__ void sb_operand_put(uint8_t* Tt, const float (&v)[8], float amax,
                                               float prev, int m, int sb, int M, int Mp) {
    using namespace sbop;
    const int l = threadIdx.x & 31, mm = m % 128;
    int q[8];
    const int s = q8s_quantize(v, amax, q);
    uint8_t* ob = Tt + ((size_t)sb * (Mp / 128) + m / 128) * TOP;
    const int lo[4] = {q[0], q[1], q[2], q[3]}, hi[4] = {q[4], q[5], q[6], q[7]};
    *reinterpret_cast<uint2*>(ob + image_at(l >> 4, mm, (l & 15) >> 1, TH0) + (l & 1) * 8) =
        m < M ? make_uint2(pack4(lo, 128), pack4(hi, 128)) : make_uint2(0, 0);
    if ((l & 3) == 0) put_chunk_sum(ob, mm, l >> 2, s);
    if (l == 0) put_token_scales(ob, mm, prev, sb_unit(amax));
}

template <class Src>
__device__ __forceinline__ void q8s_sb_operand(const Src& src, uint8_t* Tt, int M, int K, int Mp) {
    __shared__ float amaxes[8];   // per warp of the CTA
    const int KS = K / 256, l = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const long long w = (long long)blockIdx.x * 8 + wi;
    const bool live = w < (long long)Mp * KS;   // (no early return: the CTA syncs below)
    const int m = live ? (int)(w / KS) : 0, sb = live ? (int)(w % KS) : 0;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live && m < M) src.values8(m, sb * 256 + 8 * l, v);
    const float amax = warp_amax(v);
    if (l == 0) amaxes[wi] = amax;
    __syncthreads();
    if (!live) return;
    float prev = 1.f;
    if (sb > 0) {
        if (wi > 0) {   // warp w - 1 is (m, sb - 1)
            prev = sb_unit(amaxes[wi - 1]);
        } else {
            float vp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (m < M) src.values8(m, sb * 256 - 256 + 8 * l, vp);
            prev = sb_unit(warp_amax(vp));
        }
    }
    sb_operand_put(Tt, v, amax, prev, m, sb, M, Mp);
}

extern "C" __global__ void q8s_sb_operand(const float* x, uint8_t* Tt, int M, int K, int Mp) {
    q8s_sb_operand(Rows<float>{x, K}, Tt, M, K, Mp);
}

extern "C" __global__ void q8s_sb_operand_f16(const __half* x, uint8_t* Tt, int M, int K, int Mp) {
    q8s_sb_operand(Rows<__half>{x, K}, Tt, M, K, Mp);
}

extern "C" __global__ void q8s_sb_operand_swiglu(const float* g, const float* u, long long ldg,
                                                 uint8_t* Tt, int M, int K, int Mp) {
    q8s_sb_operand(Swiglu{g, u, ldg, K}, Tt, M, K, Mp);
}

// rmsnorm and the token operand in one launch: h = f16(rmsnorm(x) * w) (rmsnorm.cuh, the bits of
// layers.cu rmsnorm_f32_f16), optionally written to h16 [M, K] (for GEMMs of other routes), and
// its SB token operand, bit-identical to rmsnorm_f32_f16 then q8s_sb_operand_f16 (twin:
// sb_tokens_ref(*split_q8s_ref(rmsnorm_f16_ref(x, w, eps)))). One CTA of 256 threads per token
// m < Mp; warp wi takes super-blocks wi, wi + 8, ... (at most SB_NORM_SBW each: K <= 8 * 256 *
// SB_NORM_SBW), 8 values per lane as q8s_sb_operand. The row is read once, into registers in
// that layout, which is rms_scale's summation order (a super-block is one of its chunks), so
// the scale comes from the registers; then the normalized values, their amaxes through shared
// memory (r's previous scale at hand), the quantization. x f32 [M, K] rows 16-byte aligned,
// K % 256 == 0. Grid (Mp), block 256.
#define SB_NORM_SBW 4
extern "C" __global__ void __launch_bounds__(256)
rmsnorm_sb_operand(const float* __restrict__ x, const float* __restrict__ w, float eps,
                   __half* __restrict__ h16, uint8_t* __restrict__ Tt, int M, int K, int Mp) {
    __shared__ float amaxes[8 * SB_NORM_SBW];
    const int m = blockIdx.x, KS = K / 256, l = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const float* xr = x + (size_t)m * K;
    float v[SB_NORM_SBW][8];   // the raw row, then its normalized f16 values
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < SB_NORM_SBW; ++j) {   // (all loads first: rms_load8 zero-fills past K)
        if (m < M && wi + 8 * j < KS) {
            rms_load8(xr, K, wi + 8 * j, l, v[j]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[j][e] = 0.f;
        }
    }
#pragma unroll
    for (int j = 0; j < SB_NORM_SBW; ++j)
        if (wi + 8 * j < KS) s = rms_chunk_sum(s, v[j]);
    const float scale = rms_finish(s, K, eps);   // (rows m >= M: v = 0, so 0 * scale = 0)
#pragma unroll
    for (int j = 0; j < SB_NORM_SBW; ++j) {
        const int sb = wi + 8 * j, k = sb * 256 + 8 * l;
        if (sb >= KS) continue;
        if (m < M) {
            const float4 w0 = *reinterpret_cast<const float4*>(w + k);
            const float4 w1 = *reinterpret_cast<const float4*>(w + k + 4);
            const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            __half2 h[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                h[e] = __floats2half2_rn(rms_value(v[j][2 * e], scale, ws[2 * e]),
                                         rms_value(v[j][2 * e + 1], scale, ws[2 * e + 1]));
                const float2 f = __half22float2(h[e]);
                v[j][2 * e] = f.x;
                v[j][2 * e + 1] = f.y;
            }
            if (h16) *reinterpret_cast<uint4*>(h16 + (size_t)m * K + k) = *reinterpret_cast<uint4*>(h);
        }
        const float amax = warp_amax(v[j]);
        if (l == 0) amaxes[sb] = amax;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < SB_NORM_SBW; ++j) {
        const int sb = wi + 8 * j;
        if (sb >= KS) continue;
        const float prev = sb > 0 ? sb_unit(amaxes[sb - 1]) : 1.f;
        sb_operand_put(Tt, v[j], amaxes[sb], prev, m, sb, M, Mp);
    }
}
