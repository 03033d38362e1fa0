"""numpy twins of the one-plane super-block q4_K kernel (kernels/mmq_sb1_q4k.cu), its weight
repack (mmq_repack.cu's repack_q4k_sb1) and its per-token tables (quantize_q8_1.cu's
sb1_token_tables).

SB1 keeps the q4_K nibble v as one byte per value and folds the 6-bit sub-scale per 32-chunk
in FP32 (`emulate_sb1` spells the arithmetic out): per C value and chunk z = fma(S_c, mc, z),
S_c the chunk's integer sum sum_k (qa + 128) v read as an f32 denormal, mc = d sc_c 2^74 the
row's factor; z counts in units of the token's da 2^75 of the current super-block (dc), so
each super-block starts with z = z r + b (r = dc_old / dc_new per token, b the row's bias
f32(-128 sum_c sc_c V_c) d 2^-75) and the item ends with y = z dc. The min term is a tf32
product into z: A = -(dmin m_c) per row and chunk (hi, lo), B = da sa_c / dc per token and
chunk (hi, lo). The activations are the SB path's q8s split (mmq_sb_ref.split_q8s_ref).

Layouts (rows / tokens in 128-tiles, tables per (super-block, tile) block):
- weights `repack_q4k_sb1_ref`: Wq uint8 [N, K] = v; Tw [K/256, Np/128, 12800 B] =
  [mc chunks 0..3 | b | mc chunks 4..7 | Tma], mc and b as float2 pairs (row r, row r+8) for
  the rows r % 16 < 8 (pair (r // 16) 8 + r % 8, 512 B a chunk), Tma the min term's register
  operand, per pair and t in 0..3 two uint4 (hi, lo) = (A[r][t], A[r+8][t], A[r][t+4],
  A[r+8][t+4]) (8 KB).
- tokens `sb1_tokens_ref(ta, M, K)`: Tt [K/256, Mp/128, 9216 B] = [r | B | dc], r and dc f32
  [128] in `sb1_pos` order, B the min term's smem operand (`block_tm_sb` layout over tokens).
"""

from __future__ import annotations

import numpy as np

from minfer.quants.mmq_ref import decode_q4k, q4k_scales
from minfer.quants.mmq_sb_ref import QK_SB, block_tm_sb, sb_scales, unblock_tm_sb
from minfer.quants.mmq_wgmma_ref import pad_rows, tf32_split

SB1_WBLK, SB1_TBLK = 12800, 9216   # bytes of a weight / token table block
_S74, _SM75 = np.float32(2.0**74), np.float32(2.0**-75)


def sb1_pos() -> np.ndarray:
    """int [128]: where token m of a 128-token tile sits in the f32 [128] token tables (the
    fold's order): m = 8i + 2t + e at 16 (i // 2) + 4t + 2 (i % 2) + e."""
    m = np.arange(128)
    i, t, e = m >> 3, (m >> 1) & 3, m & 1
    return (i >> 1) * 16 + t * 4 + (i & 1) * 2 + e


def _pairs(a: np.ndarray) -> np.ndarray:
    """a [X, Np] (per row) -> [X, Np/128, 64, 2]: (row r, row r+8) for the rows r % 16 < 8."""
    x = a.reshape(a.shape[0], -1, 8, 2, 8)        # X, tile, 16-row group, +8 half, row % 8
    return np.ascontiguousarray(x.transpose(0, 1, 2, 4, 3)).reshape(a.shape[0], -1, 64, 2)


def repack_q4k_sb1_ref(w_raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """raw q4_K bytes [N, K/256*144] -> (Wq uint8 [N, K], Tw uint8 [K/256, Np/128, 12800])."""
    _, dmv, v = decode_q4k(w_raw, N, K)                                         # dmv [N, K/32]
    d = q4k_scales(w_raw, N, K)[0]                                              # [N, K/256]
    sc = sb_scales(w_raw, N, K)                                                 # [N, K/32]
    V = v.reshape(N, K // 32, 32).astype(np.int32).sum(-1)
    KS, Np = K // QK_SB, pad_rows(N)
    NT = Np // 128
    mc = np.zeros((K // 32, Np), np.float32)
    mc[:, :N] = ((np.repeat(d, 8, axis=1) * sc.astype(np.float32)) * _S74).T
    b = np.zeros((KS, Np), np.float32)
    bsum = (sc * V).reshape(N, KS, 8).sum(-1)
    b[:, :N] = (((-128 * bsum).astype(np.float32) * d) * _SM75).T
    hi, lo = (np.zeros((K // 32, Np), np.uint32) for _ in range(2))
    hi[:, :N], lo[:, :N] = (p.T for p in tf32_split(dmv))
    # Tma: per (sb, tile, pair, t): hi (A[r][t], A[r+8][t], A[r][t+4], A[r+8][t+4]), then lo
    tma = np.stack([_pairs(x) for x in (hi, lo)])                  # [2, K/32, NT, 64, 2]
    tma = tma.reshape(2, KS, 2, 4, NT, 64, 2)                      # s, sb, t+4?, t, tile, pair, +8
    tma = tma.transpose(1, 4, 5, 3, 0, 2, 6).reshape(KS, NT, 2048)
    mp = _pairs(mc).view(np.uint32).reshape(KS, 2, 4, NT, 128).transpose(0, 3, 1, 2, 4)
    bp = _pairs(b).view(np.uint32).reshape(KS, NT, 128)
    tw = np.concatenate([mp[:, :, 0].reshape(KS, NT, 512), bp,
                         mp[:, :, 1].reshape(KS, NT, 512), tma], axis=-1)
    return v.astype(np.uint8), np.ascontiguousarray(tw).view(np.uint8)


def sb1_tokens_ref(ta: np.ndarray, M: int, K: int) -> np.ndarray:
    """Ta f32 [K/32, Mp, 2] (the q8s split) -> Tt uint8 [K/256, Mp/128, 9216]: dc = da 2^75 of
    the super-block (1 where its block is all zero), r = dc of the previous super-block / dc
    (1 on the first), B = da sa_c / dc as tf32 (hi, lo)."""
    ta = np.asarray(ta, np.float32)
    KS, Mp = K // QK_SB, ta.shape[1]
    MT = Mp // 128
    dx = ta[0::8, :, 0]                                                         # [KS, Mp]
    dc = np.where(dx != 0, dx, np.float32(1)).astype(np.float32)
    prev = np.concatenate([np.ones((1, Mp), np.float32), dc[:-1]])
    r = (prev / dc).astype(np.float32)
    bv = (ta[:, :, 1].reshape(KS, 8, Mp) / dc[:, None, :]).astype(np.float32).reshape(K // 32, Mp)
    hi, lo = tf32_split(bv)
    bb = block_tm_sb(hi, lo).reshape(KS, MT, 2048)
    pos = sb1_pos()

    def fold_order(a: np.ndarray) -> np.ndarray:   # [KS, Mp] -> [KS, MT, 128] u32
        out = np.zeros((KS, MT, 128), np.float32)
        out[:, :, pos] = a.reshape(KS, MT, 128)
        return out.view(np.uint32)

    tt = np.concatenate([fold_order(r), bb, fold_order(dc)], axis=-1)
    return np.ascontiguousarray(tt).view(np.uint8)


def emulate_sb1(aq: np.ndarray, tt: np.ndarray, wq: np.ndarray, tw: np.ndarray, M: int,
                N: int, K: int, rescale: bool = True) -> np.ndarray:
    """mmq_sb1_q4k.cu's arithmetic from the twins' operands (float64 sums; the kernel rounds to
    f32 at every FMA): one work item over all of K. rescale=False drops the per-super-block
    z = z r + b (a test that the algebra needs it)."""
    KS, Np, Mp = K // QK_SB, pad_rows(N), pad_rows(M)
    w = tw.view(np.uint32).reshape(KS, Np // 128, 3200)
    t = tt.view(np.uint32).reshape(KS, Mp // 128, 2304)
    unp = np.argsort(np.arange(Np).reshape(-1, 2, 8).transpose(0, 2, 1).ravel())

    def rows(p: np.ndarray) -> np.ndarray:   # [X, NT, 64 pairs x 2] f32 -> [X, Np]
        return p.view(np.float32).reshape(p.shape[0], -1)[:, unp]

    pos = sb1_pos()

    def toks(a: np.ndarray) -> np.ndarray:   # [KS, MT, 128] fold order -> [KS, Mp]
        return a.view(np.float32)[:, :, pos].reshape(KS, Mp)

    mc = [rows(np.ascontiguousarray(w[:, :, o + 128 * c:o + 128 * (c + 1)]))
          for o in (0, 640) for c in range(4)]                                  # 8 x [KS, Np]
    b = rows(np.ascontiguousarray(w[:, :, 512:640]))
    tma = w[:, :, 1152:].reshape(KS, Np // 128, 64, 4, 2, 4)                    # pair, t, hi|lo
    r, dc = toks(np.ascontiguousarray(t[:, :, :128])), toks(np.ascontiguousarray(t[:, :, 2176:]))
    bh, bl = unblock_tm_sb(np.ascontiguousarray(t[:, :, 128:2176]), K, Mp)      # [K/32, Mp]
    z = np.zeros((M, N))
    for s in range(KS):
        if rescale:
            z = z * r[s, :M, None] + b[s, None, :N]
        for c in range(8):
            k = slice(256 * s + 32 * c, 256 * s + 32 * c + 32)
            D = aq[:, k].astype(np.int64) @ wq[:, k].astype(np.int64).T
            assert D.min() >= 0 and D.max() < 2**23
            z += D.astype(np.int32).view(np.float32).astype(np.float64) * mc[c][s, None, :N]
        # min term: A (rows) hi / lo from Tma, B (tokens) hi / lo
        for c in range(8):
            tt_, kk = c % 4, c // 4
            ah = tma[s, :, :, tt_, 0, 2 * kk:2 * kk + 2].reshape(-1, 64, 2)      # (r, r+8)
            al = tma[s, :, :, tt_, 1, 2 * kk:2 * kk + 2].reshape(-1, 64, 2)
            a = [rows(np.ascontiguousarray(x).reshape(1, -1))[0] for x in (ah, al)]
            bt = [x[8 * s + c].view(np.float32).astype(np.float64) for x in (bh, bl)]
            ah64, al64 = (x.view(np.float32).astype(np.float64) for x in a)
            z += (bt[0][:M, None] * ah64[None, :N] + bt[1][:M, None] * ah64[None, :N]
                  + bt[0][:M, None] * al64[None, :N])
    return (z * dc[KS - 1, :M, None]).astype(np.float32)


__all__ = ["SB1_WBLK", "SB1_TBLK", "sb1_pos", "repack_q4k_sb1_ref", "sb1_tokens_ref",
           "emulate_sb1"]
