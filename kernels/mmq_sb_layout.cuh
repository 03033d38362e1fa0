// mmq_sb_layout.cuh: the operand blocks of mmq_sb_q4k.cu, written by repack_q4k_sb
// (mmq_repack.cu, the weight) and q8s_sb_operand / sb_token_tables (quantize_q8_1.cu, the
// tokens); numpy twins in minfer.quants.mmq_sb_ref (sb_operand, sb_image; SB_* there match
// the constants here).
// One block per (super-block, 128-row or 128-token tile), laid out so that each of the
// super-block's two 128-k stages is one contiguous piece (one bulk copy into shared memory):
//   [image of k 0..127 | tables[0, H0) | image of k 128..255 | tables[H0, BLK)]
// An image is the 128 rows x 128 bytes exactly as the wgmma reads them (128-byte swizzle: the
// 16-byte chunk c of row r at r * 128 + (c ^ (r % 8)) * 16); rows past the matrix are zero.
// Tables: weights 9216 B (mc of chunks 0..3, b | mc of chunks 4..7, fmin, Am), tokens 5120 B
// (r | B, dc); H0 is the part the first stage needs.
#pragma once

namespace sbop {
constexpr int IMG = 128 * 128;
constexpr int WBLK = 9216, WH0 = 2560;    // weight tables, their first stage's part
constexpr int TBLK = 5120, TH0 = 512;     // token tables, their first stage's part
constexpr int WOP = 2 * IMG + WBLK, TOP = 2 * IMG + TBLK;   // operand block bytes
static_assert(WOP == 41984 && TOP == 37888, "operand blocks");

// byte offset in a block of table byte t (h0: WH0 or TH0)
__host__ __device__ constexpr int table_at(int t, int h0) { return t < h0 ? IMG + t : 2 * IMG + t; }
// byte offset in a block of stage s's 16-byte chunk c (0..7) of row r
__host__ __device__ constexpr int image_at(int s, int r, int c, int h0) {
    return s * (IMG + h0) + r * 128 + ((c ^ (r & 7)) << 4);
}
}  // namespace sbop
