"""numpy twins of the super-block MMQ path (kernels/mmq_sb_q4k.cu, the q8s split and
sb_token_tables entries of quantize_q8_1.cu, mmq_repack.cu's repack_q4k_sb) and its parity
oracle (q4_K; its q6_K kernel is retired: slower than f16 on every shape at 3 B per weight).

The SB path quantizes activations per 256 values (q8s: one scale per token and super-block,
llama.cpp's q8_K grouping, with q8_1's rounding), so a super-block's chunks share every float
scale. q4_K keeps its nibble v as one byte per value and folds the 6-bit sub-scale per 32-chunk
in FP32 (`emulate_sb_q4k` spells the arithmetic out): per C value and chunk z = fma(S_c, mc, z),
S_c the chunk's integer sum sum_k (qa + 128) v read as an f32 denormal, mc = d sc_c 2^74 the
row's factor; z counts in units of the token's da 2^75 of the current super-block (dc), so
each super-block starts with z = z r + b (r = dc_old / dc_new per token, b the row's bias
f32(-128 sum_c sc_c V_c) d 2^-75) and a work item ends with y = z dc. The min term is exact
integers on an f16 wgmma (k16): I = sum_c m_c s_c (m_c the 6-bit min, s_c = sum of the chunk's
q, split s_c = 64 hi_c + lo_c so that every operand is an f16 integer: A = [m_c | 64 m_c], B =
[lo_c | hi_c]; |I| < 2^21, exact in the f32 accumulator), then z += I fmin with the row's
fmin = -dmin 2^-75 (da s_c / dc = s_c 2^-75).

- `split_q8s_ref(x)`: Aq uint8 [M, K] = q + 128 and Ta f32 [K/32, Mp, 2] = (da * 2^75, da * sa)
  per chunk (da the 256-block's f16-rounded scale, repeated over its 8 chunks; sa the chunk's
  sum of q). Mp = M rounded up to TPAD; rows >= M zero.
- `sb_q4k_tables_ref(w_raw, N, K)`: (v uint8 [N, K], Tw [K/256, Np/128, 9216 B]) per
  (super-block, 128-row tile) = [mc chunks 0..3 | b | mc chunks 4..7 | fmin | Am], mc, b and
  fmin as float2 pairs (row r, row r+8) for the rows r % 16 < 8 (pair (r // 16) 8 + r % 8,
  512 B a table), Am the min term's f16 register operand: per pair and t in 0..3 a uint4 =
  (A[r][2t, 2t+1], A[r+8][2t, 2t+1], A[r][2t+8, 2t+9], A[r+8][2t+8, 2t+9]), A = [m | 64 m] (4 KB).
- `sb_token_tables_ref(aq, ta, M, K)`: the q4_K kernel's per-token tables, [K/256, Mp/128,
  5120 B] = [r | B | dc], r and dc f32 [128] in `sb_pos` order, B the min term's f16 smem
  operand [lo | hi] of the chunk sums (`block_b16_sb` layout over tokens).
- The kernel's operands put each (super-block, 128-row / 128-token tile) in one block that its
  two 128-k stages copy as two contiguous pieces (one bulk copy each): [image of k 0..127 |
  the tables' first-stage part | image of k 128..255 | the rest of the tables]. An image
  (`sb_image`) is the 128 rows x 128 bytes exactly as the wgmma reads them from shared memory
  (128-byte swizzle: 16-byte chunk c of row r at c ^ (r % 8); rows past the matrix zero).
  `repack_q4k_sb_ref(w_raw, N, K)`: Wb [K/256, Np/128, SB_WOP] from v and Tw;
  `sb_tokens_ref(aq, ta, M, K)`: Tt [K/256, Mp/128, SB_TOP] from Aq and the token tables.
- `mmq_sb_linear_ref(x, w_raw, M, N, K, qtype)`: the oracle, float64: the q8s-dequantized
  activations times the dequantized q4_K / q6_K weight (what the kernels compute, up to f32
  rounding).
"""

from __future__ import annotations

import numpy as np

from minfer.quants.mmq_ref import decode_q4k, decode_q6k, q4k_scales
from minfer.quants.q8_1 import q8_blocks

TPAD = 128   # table rows (Mp, Np) are padded to a multiple of this (the kernel's tile)


def pad_rows(n: int) -> int:
    return (n + TPAD - 1) // TPAD * TPAD

QK_SB = 256
_S74, _S75, _SM75 = np.float32(2.0**74), np.float32(2.0**75), np.float32(2.0**-75)


def quantize_q8s(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [M, K] (K % 256 == 0) -> (da f32 [M, K/256], f16-rounded, q int8 [M, K])."""
    d, q = q8_blocks(np.asarray(x, np.float32), QK_SB)
    return d.astype(np.float16).astype(np.float32), q


def q8s_grid(x: np.ndarray) -> np.ndarray:
    """x f32 [M, K] -> f32 [M, K]: x as the SB kernels see it, da * q per 256 values."""
    d, q = quantize_q8s(x)
    M, K = q.shape
    return (q.reshape(M, K // QK_SB, QK_SB).astype(np.float32) * d[..., None]).reshape(M, K)


def split_q8s_ref(x: np.ndarray, signed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [M, K] -> (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]); signed: Aq holds q as int8
    bytes (the q6_K kernel's signed wgmma), else q + 128."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    d, q = quantize_q8s(x)
    s = q.reshape(M, K // 32, 32).astype(np.int32).sum(-1)           # [M, K/32]
    dc = np.repeat(d, 8, axis=1)                                      # da per chunk
    ta = np.zeros((K // 32, pad_rows(M), 2), np.float32)
    ta[:, :M, 0] = (dc * _S75).T
    ta[:, :M, 1] = (dc * s.astype(np.float32)).T
    aq = q.view(np.uint8).copy() if signed else (q.astype(np.int16) + 128).astype(np.uint8)
    return aq, ta


def sb_scales(w_raw: np.ndarray, N: int, K: int) -> np.ndarray:
    """The 6-bit sub-scales sc int32 [N, K/32] of a raw q4_K weight (from its block bytes)."""
    return q4k_scales(w_raw, N, K)[2].reshape(N, K // 32).astype(np.int32)


def block_b16_sb(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """lo, hi [K/32, Mp] (integers < 2^11 in magnitude) -> f16 [K/256, Mp/128, 16, 2, 8, 8]: per
    (super-block, 128-token tile) the min term's B operand, K-major 8 x 16-byte core matrices:
    [token group g][k 0..7 = lo of chunks 0..7 | k 8..15 = hi][token][k % 8]."""
    kc, n = lo.shape
    x = np.stack([lo, hi]).astype(np.float16).reshape(2, kc // 8, 8, n // 128, 16, 8)
    return np.ascontiguousarray(x.transpose(1, 3, 4, 0, 5, 2))   # sb, tile, g, kk, r, c


def unblock_b16_sb(b: np.ndarray, K: int, Mp: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of block_b16_sb (any view of the bytes) -> (lo, hi) f16 [K/32, Mp]."""
    x = np.asarray(b).view(np.float16).reshape(K // 256, Mp // 128, 16, 2, 8, 8)
    x = x.transpose(3, 0, 5, 1, 2, 4).reshape(2, K // 32, Mp)
    return x[0], x[1]


SB_WBLK, SB_TBLK = 9216, 5120    # bytes of a weight / token table block
SB_WH0, SB_TH0 = 2560, 512       # their first stage's part: mc of chunks 0..3 and b; r
SB_IMG = 128 * 128               # a stage's image: 128 rows x 128 k
SB_WOP, SB_TOP = 2 * SB_IMG + SB_WBLK, 2 * SB_IMG + SB_TBLK   # the kernel's operand blocks


def sb_pos() -> np.ndarray:
    """int [128]: where token m of a 128-token tile sits in the f32 [128] token tables (the
    fold's order): m = 8i + 2t + e at 16 (i // 2) + 4t + 2 (i % 2) + e."""
    m = np.arange(128)
    i, t, e = m >> 3, (m >> 1) & 3, m & 1
    return (i >> 1) * 16 + t * 4 + (i & 1) * 2 + e


def _pairs(a: np.ndarray) -> np.ndarray:
    """a [X, Np] (per row) -> [X, Np/128, 64, 2]: (row r, row r+8) for the rows r % 16 < 8."""
    x = a.reshape(a.shape[0], -1, 8, 2, 8)        # X, tile, 16-row group, +8 half, row % 8
    return np.ascontiguousarray(x.transpose(0, 1, 2, 4, 3)).reshape(a.shape[0], -1, 64, 2)


def sb_q4k_tables_ref(w_raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """raw q4_K bytes [N, K/256*144] -> (v uint8 [N, K], Tw uint8 [K/256, Np/128, 9216])."""
    _, _, v = decode_q4k(w_raw, N, K)
    d, dmin = (q4k_scales(w_raw, N, K)[i] for i in (0, 1))                    # [N, K/256]
    sc = sb_scales(w_raw, N, K)                                                 # [N, K/32]
    mq = q4k_scales(w_raw, N, K)[3].reshape(N, K // 32).astype(np.int32)       # 6-bit mins
    V = v.reshape(N, K // 32, 32).astype(np.int32).sum(-1)
    KS, Np = K // QK_SB, pad_rows(N)
    NT = Np // 128
    mc = np.zeros((K // 32, Np), np.float32)
    mc[:, :N] = ((np.repeat(d, 8, axis=1) * sc.astype(np.float32)) * _S74).T
    b = np.zeros((KS, Np), np.float32)
    bsum = (sc * V).reshape(N, KS, 8).sum(-1)
    b[:, :N] = (((-128 * bsum).astype(np.float32) * d) * _SM75).T
    fmin = np.zeros((KS, Np), np.float32)
    fmin[:, :N] = (-dmin * _SM75).T
    # Am: per (sb, tile, pair, t) f16 (A[r][2t], A[r][2t+1], A[r+8][2t], A[r+8][2t+1], then
    # the same at k 2t+8, 2t+9), A[row][k] = m_k (k < 8), 64 m_(k-8) (k >= 8)
    am = np.zeros((KS, 16, Np), np.float16)                                     # [sb, k, row]
    m3 = mq.reshape(N, KS, 8).transpose(1, 2, 0)
    am[:, :8, :N], am[:, 8:, :N] = m3, 64 * m3
    x = am.reshape(KS, 2, 4, 2, NT, 8, 2, 8)         # sb, k hi, t, e, tile, group, +8, row % 8
    am = x.transpose(0, 4, 5, 7, 2, 1, 6, 3).reshape(KS, NT, 64 * 4 * 8)       # pair, t, a_i
    mp = _pairs(mc).view(np.uint32).reshape(KS, 2, 4, NT, 128).transpose(0, 3, 1, 2, 4)
    bp = _pairs(b).view(np.uint32).reshape(KS, NT, 128)
    fp = _pairs(fmin).view(np.uint32).reshape(KS, NT, 128)
    tw = np.concatenate([mp[:, :, 0].reshape(KS, NT, 512), bp, mp[:, :, 1].reshape(KS, NT, 512),
                         fp, am.view(np.uint32)], axis=-1)
    return v.astype(np.uint8), np.ascontiguousarray(tw).view(np.uint8)


def sb_token_tables_ref(aq: np.ndarray, ta: np.ndarray, M: int, K: int) -> np.ndarray:
    """The q8s split (Aq uint8 [M, K] = q + 128, Ta f32 [K/32, Mp, 2]) -> uint8 [K/256, Mp/128,
    5120]: dc = da 2^75 of the super-block (1 where its block is all zero), r = dc of the
    previous super-block / dc (1 / dc on the first, where z is still 0), B = the chunk sums
    s_c = sum of q as f16 (lo, hi) = (s_c mod 64, s_c div 64)."""
    ta = np.asarray(ta, np.float32)
    KS, Mp = K // QK_SB, ta.shape[1]
    MT = Mp // 128
    dx = ta[0::8, :, 0]                                                         # [KS, Mp]
    dc = np.where(dx != 0, dx, np.float32(1)).astype(np.float32)
    prev = np.concatenate([np.ones((1, Mp), np.float32), dc[:-1]])
    r = (prev / dc).astype(np.float32)
    sq = np.zeros((K // 32, Mp), np.int32)
    sq[:, :M] = (np.asarray(aq, np.int32) - 128).reshape(M, K // 32, 32).sum(-1).T
    bb = block_b16_sb(sq & 63, sq >> 6).reshape(KS, MT, 2048).view(np.uint32)
    pos = sb_pos()

    def fold_order(a: np.ndarray) -> np.ndarray:   # [KS, Mp] -> [KS, MT, 128] u32
        out = np.zeros((KS, MT, 128), np.float32)
        out[:, :, pos] = a.reshape(KS, MT, 128)
        return out.view(np.uint32)

    tt = np.concatenate([fold_order(r), bb, fold_order(dc)], axis=-1)
    return np.ascontiguousarray(tt).view(np.uint8)


def sb_image(a: np.ndarray, Rp: int) -> np.ndarray:
    """a uint8 [R, K] -> [K/256, Rp/128, 2, 16384]: per (super-block, 128-row tile, stage) the
    shared-memory image of rows x 128 k with the 128-byte swizzle (16-byte chunk c of row r at
    c ^ (r % 8)); rows R..Rp-1 zero."""
    R, K = a.shape
    x = np.zeros((Rp, K), np.uint8)
    x[:R] = a
    x = x.reshape(Rp // 128, 128, K // QK_SB, 2, 8, 16)        # tile, r, sb, stage, chunk, byte
    return np.ascontiguousarray(_swizzle(x).transpose(2, 0, 3, 1, 4, 5)).reshape(
        K // QK_SB, Rp // 128, 2, SB_IMG)


def _swizzle(x: np.ndarray) -> np.ndarray:
    """[tile, r, ..., 8 chunks, 16] -> position p holds chunk p ^ (r % 8) (an involution)."""
    p = np.arange(8)[None, :] ^ (np.arange(128)[:, None] & 7)             # [r, p]
    idx = p.reshape(1, 128, *([1] * (x.ndim - 4)), 8, 1)
    return np.take_along_axis(x, np.broadcast_to(idx, x.shape), axis=x.ndim - 2)


def sb_unimage(img: np.ndarray, R: int) -> np.ndarray:
    """Inverse of sb_image: [K/256, Rp/128, 2, 16384] -> uint8 [R, K]."""
    KS, T = img.shape[:2]
    y = np.asarray(img, np.uint8).reshape(KS, T, 2, 128, 8, 16).transpose(1, 3, 0, 2, 4, 5)
    return _swizzle(y).reshape(T * 128, KS * QK_SB)[:R]


def sb_operand(img: np.ndarray, tab: np.ndarray, h0: int) -> np.ndarray:
    """Stage images [KS, T, 2, 16384] and table blocks [KS, T, B] -> the kernel's blocks
    [KS, T, 32768 + B] = [image 0 | tab[:h0] | image 1 | tab[h0:]]."""
    return np.ascontiguousarray(np.concatenate(
        [img[:, :, 0], tab[:, :, :h0], img[:, :, 1], tab[:, :, h0:]], axis=-1))


def sb_operand_parts(op: np.ndarray, h0: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of sb_operand -> (images [KS, T, 2, 16384], tables [KS, T, B])."""
    a = SB_IMG + h0
    img = np.stack([op[..., :SB_IMG], op[..., a:a + SB_IMG]], axis=2)
    return img, np.concatenate([op[..., SB_IMG:a], op[..., a + SB_IMG:]], axis=-1)


def repack_q4k_sb_ref(w_raw: np.ndarray, N: int, K: int) -> np.ndarray:
    """raw q4_K bytes [N, K/256*144] -> Wb uint8 [K/256, Np/128, SB_WOP], mmq_sb_q4k's weight."""
    v, tw = sb_q4k_tables_ref(w_raw, N, K)
    return sb_operand(sb_image(v, pad_rows(N)), tw, SB_WH0)


def sb_tokens_ref(aq: np.ndarray, ta: np.ndarray, M: int, K: int) -> np.ndarray:
    """The q8s split (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2]) -> Tt uint8 [K/256, Mp/128,
    SB_TOP], mmq_sb_q4k's token operand."""
    return sb_operand(sb_image(aq, np.asarray(ta).shape[1]), sb_token_tables_ref(aq, ta, M, K),
                      SB_TH0)


def emulate_sb_q4k(tt_op: np.ndarray, wb: np.ndarray, M: int, N: int, K: int,
                   rescale: bool = True) -> np.ndarray:
    """mmq_sb_q4k.cu's arithmetic from the twins' operand blocks (Tt, Wb; float64 sums, the
    kernel rounds to f32 at every FMA): one work item over all of K. rescale=False drops the
    per-super-block z = z r + b (a test that the algebra needs it)."""
    KS, Np, Mp = K // QK_SB, pad_rows(N), pad_rows(M)
    wimg, tw = sb_operand_parts(np.asarray(wb, np.uint8), SB_WH0)
    timg, tt = sb_operand_parts(np.asarray(tt_op, np.uint8), SB_TH0)
    wq, aq = sb_unimage(wimg, N), sb_unimage(timg, M)
    tw, tt = np.ascontiguousarray(tw), np.ascontiguousarray(tt)
    w = tw.view(np.uint32).reshape(KS, Np // 128, 2304)
    t = tt.view(np.uint32).reshape(KS, Mp // 128, 1280)
    unp = np.argsort(np.arange(Np).reshape(-1, 2, 8).transpose(0, 2, 1).ravel())

    def rows(p: np.ndarray) -> np.ndarray:   # [X, NT, 64 pairs x 2] f32 -> [X, Np]
        return p.view(np.float32).reshape(p.shape[0], -1)[:, unp]

    pos = sb_pos()

    def toks(a: np.ndarray) -> np.ndarray:   # [KS, MT, 128] fold order -> [KS, Mp]
        return a.view(np.float32)[:, :, pos].reshape(KS, Mp)

    mc = [rows(np.ascontiguousarray(w[:, :, o + 128 * c:o + 128 * (c + 1)]))
          for o in (0, 640) for c in range(4)]                                  # 8 x [KS, Np]
    b = rows(np.ascontiguousarray(w[:, :, 512:640]))
    fmin = rows(np.ascontiguousarray(w[:, :, 1152:1280]))
    # Am [sb, tile, pair, t, (a0..a3) x 2 f16] -> A [sb, 16 k, Np]
    am = np.ascontiguousarray(w[:, :, 1280:]).view(np.float16).reshape(KS, -1, 64, 4, 2, 2, 2)
    am = am.transpose(0, 4, 3, 6, 1, 2, 5).reshape(KS, 16, -1)[:, :, unp]      # k hi, t, e | +8
    r, dc = toks(np.ascontiguousarray(t[:, :, :128])), toks(np.ascontiguousarray(t[:, :, 1152:]))
    lo, hi = unblock_b16_sb(np.ascontiguousarray(t[:, :, 128:1152]), K, Mp)    # [K/32, Mp]
    bt = np.concatenate([lo.reshape(KS, 8, Mp), hi.reshape(KS, 8, Mp)], axis=1)  # [sb, 16, Mp]
    z = np.zeros((M, N))
    for s in range(KS):
        if rescale:
            z = z * r[s, :M, None] + b[s, None, :N]
        for c in range(8):
            k = slice(256 * s + 32 * c, 256 * s + 32 * c + 32)
            D = aq[:, k].astype(np.int64) @ wq[:, k].astype(np.int64).T
            assert D.min() >= 0 and D.max() < 2**23
            z += D.astype(np.int32).view(np.float32).astype(np.float64) * mc[c][s, None, :N]
        # min term: the f16 integers' product (exact), then the row's factor
        Im = bt[s, :, :M].astype(np.float64).T @ am[s, :, :N].astype(np.float64)
        assert np.abs(Im).max() < 2**21
        z += Im * fmin[s, None, :N]
    return (z * dc[KS - 1, :M, None]).astype(np.float32)


def _dequant(w_raw: np.ndarray, qtype: int, N: int, K: int) -> np.ndarray:
    """float64 [N, K]: the q4_K / q6_K weight as the kernels' math sees it."""
    if int(qtype) == 14:
        dsv16, qm = decode_q6k(w_raw, N, K)
        return (qm.reshape(N, K // 16, 16).astype(np.float64) * dsv16[..., None]).reshape(N, K)
    dsv, dmv, v = decode_q4k(w_raw, N, K)
    return (v.reshape(N, K // 32, 32).astype(np.float64) * dsv[..., None]
            + dmv[..., None]).reshape(N, K)


def mmq_sb_linear_ref(x: np.ndarray, w_raw: np.ndarray, M: int, N: int, K: int,
                      qtype: int = 12) -> np.ndarray:
    """The SB path's oracle: (da * q) @ W.T in float64, W the dequantized q4_K / q6_K weight."""
    xq = q8s_grid(np.asarray(x, np.float32).reshape(M, K)).astype(np.float64)
    return xq @ _dequant(w_raw, qtype, N, K).T


__all__ = ["QK_SB", "TPAD", "SB_WBLK", "SB_TBLK", "SB_WH0", "SB_TH0", "SB_IMG", "SB_WOP",
           "SB_TOP", "sb_pos", "sb_tokens_ref", "sb_token_tables_ref", "sb_q4k_tables_ref",
           "sb_image", "sb_unimage", "sb_operand", "sb_operand_parts", "emulate_sb_q4k",
           "quantize_q8s", "q8s_grid", "split_q8s_ref", "repack_q4k_sb_ref", "sb_scales",
           "block_b16_sb", "unblock_b16_sb",
           "mmq_sb_linear_ref"]
