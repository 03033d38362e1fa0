// mmq_repack.cu: q4_K weights -> the operand blocks of the super-block kernel
// (kernels/mmq_sb_q4k.cu), once at load. Bit-identical to
// minfer.quants.mmq_sb_ref.repack_q4k_sb_ref.
// Entry: repack_q4k_sb(const uint8_t* W, uint8_t* Wb, int N, int K, int Np) (at the entry,
//   mmq_sb_layout.cuh); W raw q4_K rows [N, K/256 * 144] (16-byte aligned: 144 = 9 * 16).
#include "mmq_common.cuh"
#include "mmq_sb_layout.cuh"

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
