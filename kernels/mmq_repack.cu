// mmq_repack.cu: q4_K / q6_K weights -> the wgmma MMQ layouts (kernels/mmq_wgmma_q4k.cu,
// mmq_wgmma_q6k.cu), once at load. Bit-identical to minfer.quants.mmq_wgmma_ref's
// repack_q4k_ref / repack_q6k_ref.
// Entry: repack_q4k_wgmma(const uint8_t* W, uint8_t* Wq, uint2* Tw, int N, int K, int Np)
//   W   raw q4_K rows [N, K/256 * 144] (16-byte aligned: 144 = 9 * 16)
//   Wq  uint8 [N, K]       the nibbles v, one per byte, natural k order
//   Tw  [Tb | Tm]:
//     Tb  float2 [K/32, Np]  (dsv * 2^74, f32(-128 * V) * dsv * 2^-75), V = sum of the chunk's v
//     Tm  uint2 [K/32, Np]   dmv = -(dmin * m) as tf32 (hi, lo) by truncation
// Entry: repack_q4k_sb(const uint8_t* W, uint8_t* Wb, int N, int K, int Np): the operand
//   blocks of mmq_sb_q4k.cu (at the entry below, mmq_sb_layout.cuh).
// Entry: repack_q6k_sb(const uint8_t* W, int8_t* Wp, float4* Ts, int N, int K, int Np): the
//   three-plane layout of mmq_sb_q6k.cu (at the entry below).
// Entry: repack_q6k_wgmma(const uint8_t* W, uint8_t* Wq, uint8_t* Tw, int N, int K)
//   W   raw q6_K rows [N, K/256 * 210] (any alignment: 210 B blocks)
//   Wq  uint8 [N, K]       q (0..63), natural k order
//   Tw  one 16 KB block per (128-row tile nt, 128-k stage kt), at (nt * K/128 + kt) * 16384:
//     TB float4 [4 chunks][128 rows]  (c0, c1, b, 0): c_h = d*sc_h * 2^74,
//                                     b = (f32(sc0*Q0 + sc1*Q1) * d) * -2^-68, Q_h = sum of q
//     TM uint4 [8 halves][64 row pairs] -32 * d * sc_h as tf32 (hi, lo) by truncation, for the
//                                     rows r, r+8 of each 16-row group (pair 8 * (r/16) + r%8):
//                                     (hi_r, hi_r+8, lo_r, lo_r+8), an mma A fragment per load
// One thread per (row n, 32-chunk j); grid ceil(N * K/32 / 256), block 256. Rows >= N of the
// tables are not written (the launcher zeroes them).
#include "mmq_common.cuh"
#include "mmq_sb_layout.cuh"

extern "C" __global__ void repack_q4k_wgmma(const uint8_t* __restrict__ W, uint8_t* __restrict__ Wq,
                                            uint2* __restrict__ Tw, int N, int K, int Np) {
    const int KC = K / 32;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * KC) return;
    const int n = (int)(i / KC), j = (int)(i % KC), jj = j & 7;
    const uint8_t* blk = W + ((size_t)n * (K / 256) + j / 8) * 144;
    const uint32_t* s = reinterpret_cast<const uint32_t*>(blk + 4);
    int sc, m;
    q4k_scale_min(jj, s[0], s[1], s[2], sc, m);
    const float d = mmq_h2f(*reinterpret_cast<const uint16_t*>(blk));
    const float dmin = mmq_h2f(*reinterpret_cast<const uint16_t*>(blk + 2));
    const uint4* qs = reinterpret_cast<const uint4*>(blk + 16 + (jj >> 1) * 32);
    const int shift = 4 * (jj & 1);
    uint4 v[2];
    int V = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint4 q = qs[h];
        uint32_t* o = reinterpret_cast<uint32_t*>(&v[h]);
        const uint32_t* in = reinterpret_cast<const uint32_t*>(&q);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            o[w] = (in[w] >> shift) & 0x0F0F0F0Fu;
            V += (int)((o[w] & 0xFF) + ((o[w] >> 8) & 0xFF) + ((o[w] >> 16) & 0xFF) +
                                   (o[w] >> 24));
        }
    }
    uint4* dst = reinterpret_cast<uint4*>(Wq + (size_t)n * K + 32 * j);
    dst[0] = v[0];
    dst[1] = v[1];
    const float dsv = d * (float)sc;                    // exact: f16 d times a 6-bit integer
    const float dmv = -(dmin * (float)m);
    float2* Tb = reinterpret_cast<float2*>(Tw);
    uint2* Tm = Tw + (size_t)KC * Np;
    Tb[(size_t)j * Np + n] = make_float2(dsv * 0x1p74f, ((float)(-128 * V) * dsv) * 0x1p-75f);
    uint32_t hi, lo;
    tf32_split(dmv, hi, lo);
    Tm[(size_t)j * Np + n] = make_uint2(hi, lo);
}

extern "C" __global__ void repack_q6k_wgmma(const uint8_t* __restrict__ W, uint8_t* __restrict__ Wq,
                                            uint8_t* __restrict__ Tw, int N, int K) {
    const int KC = K / 32;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * KC) return;
    const int n = (int)(i / KC), j = (int)(i % KC), jj = j & 7;
    const uint8_t* blk = W + ((size_t)n * (K / 256) + j / 8) * 210;
    const int half = jj >> 2, quad = jj & 3;            // 128-value half, 32-value quadrant
    const uint8_t* ql = blk + half * 64 + (quad & 1) * 32;
    const uint8_t* qh = blk + 128 + half * 32;
    const int sl = 4 * (quad >> 1), sh = 2 * quad;
    uint8_t* dst = Wq + (size_t)n * K + 32 * j;
    int Q[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        const int q = ((ql[k] >> sl) & 0xF) | (((qh[k] >> sh) & 3) << 4);
        dst[k] = (uint8_t)q;
        Q[k >> 4] += q;
    }
    const int sc0 = (int8_t)blk[192 + 2 * jj], sc1 = (int8_t)blk[192 + 2 * jj + 1];
    const float d = mmq_h2f((uint32_t)blk[208] | ((uint32_t)blk[209] << 8));
    const int nt = n / 128, rn = n % 128, kt = j / 4, cc = j % 4;
    uint8_t* blkt = Tw + ((size_t)nt * (K / 128) + kt) * 16384;
    const float ds0 = d * (float)sc0, ds1 = d * (float)sc1;   // exact: f16 d times an int8
    reinterpret_cast<float4*>(blkt)[cc * 128 + rn] =
        make_float4(ds0 * 0x1p74f, ds1 * 0x1p74f, ((float)(sc0 * Q[0] + sc1 * Q[1]) * d) * -0x1p-68f,
                    0.f);
    // TM: per half a uint4 per row pair (r, r+8) of each 16-row group: (hi_r, hi_r8, lo_r, lo_r8)
    uint32_t* tm = reinterpret_cast<uint32_t*>(blkt + 8192);
    const int slot = (rn >> 4) * 8 + (rn & 7), side = (rn >> 3) & 1;
    uint32_t hi, lo;
    tf32_split(-32.f * ds0, hi, lo);
    tm[((2 * cc) * 64 + slot) * 4 + side] = hi;
    tm[((2 * cc) * 64 + slot) * 4 + 2 + side] = lo;
    tf32_split(-32.f * ds1, hi, lo);
    tm[((2 * cc + 1) * 64 + slot) * 4 + side] = hi;
    tm[((2 * cc + 1) * 64 + slot) * 4 + 2 + side] = lo;
}

// q4_K -> mmq_sb_q4k.cu's operand blocks (mmq_sb_layout.cuh; numpy twin:
// minfer.quants.mmq_sb_ref.repack_q4k_sb_ref). One thread per (row n, super-block sb), in the
// block of (sb, n / 128): v, the nibbles, into the two stage images, and the tables: mc =
// d sc_c 2^74 of chunks 0..3 (float2 [4][64]), b = (f32(-128 sum_c sc_c V_c) d) 2^-75
// (float2 [64]), mc of chunks 4..7, fmin = -dmin 2^-75 (float2 [64]), then Am (4 KB): the min
// term's f16 A operand [m_c | 64 m_c], per row pair and t in 0..3 a uint4 = (A[r][2t, 2t+1],
// A[r+8][2t, 2t+1], A[r][2t+8, 2t+9], A[r+8][2t+8, 2t+9]). Row r = n % 128 is half r / 8 % 2
// of pair (r / 16) 8 + r % 8. Rows >= N are not written (the launcher zeroes the blocks).
extern "C" __global__ void repack_q4k_sb(const uint8_t* __restrict__ W, uint8_t* __restrict__ Wb,
                                         int N, int K, int Np) {
    using namespace sbop;
    const int KS = K / 256;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * KS) return;
    const int n = (int)(i / KS), sb = (int)(i % KS), r = n % 128;
    const uint8_t* blk = W + ((size_t)n * KS + sb) * 144;
    const uint32_t* s = reinterpret_cast<const uint32_t*>(blk + 4);
    const float d = mmq_h2f(*reinterpret_cast<const uint16_t*>(blk));
    const float dmin = mmq_h2f(*reinterpret_cast<const uint16_t*>(blk + 2));
    uint8_t* ob = Wb + ((size_t)sb * (Np / 128) + n / 128) * WOP;
    const int at = ((r >> 4) * 8 + (r & 7)) * 2 + ((r >> 3) & 1);   // in a float2 [64] table
    const int half = (r >> 3) & 1;
    __half* am = reinterpret_cast<__half*>(ob + table_at(5120, WH0)) +
                 ((r >> 4) * 8 + (r & 7)) * 32 + half * 2;   // [pair][t][k >= 8][half][e]
    int bsum = 0;
    for (int c = 0; c < 8; ++c) {
        int sc, m;
        q4k_scale_min(c, s[0], s[1], s[2], sc, m);
        const uint4* qs = reinterpret_cast<const uint4*>(blk + 16 + (c >> 1) * 32);
        const int shift = 4 * (c & 1);
        int V = 0;
        for (int h = 0; h < 2; ++h) {
            uint4 o;
            const uint32_t* in = reinterpret_cast<const uint32_t*>(&qs[h]);
            uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
            for (int w = 0; w < 4; ++w) {
                ow[w] = (in[w] >> shift) & 0x0F0F0F0Fu;
                V += (int)((ow[w] & 0xFF) + ((ow[w] >> 8) & 0xFF) + ((ow[w] >> 16) & 0xFF) +
                           (ow[w] >> 24));
            }
            *reinterpret_cast<uint4*>(ob + image_at(c >> 2, r, (c & 3) * 2 + h, WH0)) = o;
        }
        bsum += sc * V;
        float* mc = reinterpret_cast<float*>(ob + table_at(c < 4 ? c * 512 : 2560 + (c - 4) * 512,
                                                           WH0));
        mc[at] = (d * (float)sc) * 0x1p74f;
        am[(c >> 1) * 8 + (c & 1)] = __int2half_rn(m);          // exact: 6 bits
        am[(c >> 1) * 8 + 4 + (c & 1)] = __int2half_rn(64 * m);
    }
    reinterpret_cast<float*>(ob + table_at(2048, WH0))[at] = ((float)(-128 * bsum) * d) * 0x1p-75f;
    reinterpret_cast<float*>(ob + table_at(4608, WH0))[at] = -dmin * 0x1p-75f;
}

// q6_K -> the three s8 planes of mmq_sb_q6k.cu. One thread per (row n, 16-value sub-block j):
// sc_j = a0 + 7 a1 + 49 a2 in balanced base-7 digits (a_i in -3..3), P_i = a_i (q - 32) as int8;
// the thread of sub-block 0 writes the row's Ts[b][n] = (d, 7 d, 49 d, 0) * 2^-75.
// Wp int8 [3, N, K]; Ts float4 [K/256, Np] (rows >= N not written: the launcher zeroes them).
extern "C" __global__ void repack_q6k_sb(const uint8_t* __restrict__ W, int8_t* __restrict__ Wp,
                                         float4* __restrict__ Ts, int N, int K, int Np) {
    const int KJ = K / 16;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * KJ) return;
    const int n = (int)(i / KJ), j = (int)(i % KJ), jj = j & 15;   // sub-block in its block
    const uint8_t* blk = W + ((size_t)n * (K / 256) + j / 16) * 210;
    // q of values 16 jj .. 16 jj + 15: 128-value half h, 32-value quadrant (jj/2) % 4
    const int h = jj >> 3, quad = (jj >> 1) & 3, off = (jj & 1) * 16;
    const uint8_t* ql = blk + h * 64 + (quad & 1) * 32 + off;
    const uint8_t* qh = blk + 128 + h * 32 + off;
    const int sl = 4 * (quad >> 1), sh = 2 * quad;
    int sc = (int8_t)blk[192 + jj];
    int a[3];
    for (int k = 0; k < 3; ++k) {
        const int r = ((sc % 7) + 7 + 3) % 7 - 3;   // balanced digit in -3..3
        a[k] = r;
        sc = (sc - r) / 7;
    }
    for (int k = 0; k < 16; ++k) {
        const int q = ((ql[k] >> sl) & 0xF) | (((qh[k] >> sh) & 3) << 4);
        for (int p = 0; p < 3; ++p)
            Wp[(size_t)p * N * K + (size_t)n * K + 16 * j + k] = (int8_t)(a[p] * (q - 32));
    }
    if (jj == 0) {
        const float d = mmq_h2f((uint32_t)blk[208] | ((uint32_t)blk[209] << 8));
        Ts[(size_t)(j / 16) * Np + n] = make_float4(d * 0x1p-75f, 7.f * d * 0x1p-75f,
                                                    49.f * d * 0x1p-75f, 0.f);
    }
}
