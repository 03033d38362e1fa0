"""numpy twins of the wgmma MMQ layouts (kernels/mmq_wgmma_q4k.cu, mmq_wgmma_q6k.cu,
mmq_repack.cu, quantize_q8_1.cu).

The wgmma kernels compute minfer.quants.mmq_ref's q4_K / q6_K x q8_1 math (that twin stays their
parity oracle); what they need is operands a wgmma can read from shared memory, made here bit for
bit. q4_K:

- `split_q8_1_ref(x)`: the q8_1 prepass, split: Aq uint8 [M, K] = q + 128 and Ta f32
  [K/32, Mp, 2] = (da * 2^75, da * sa) (da the f16-rounded scale, sa the block sum; rows >= M
  zero). Mp = M rounded up to TPAD.
- `repack_q4k_ref(w_raw, N, K)`: the q4_K weight, once at load: Wq uint8 [N, K] = the nibbles
  v (natural k order) and Tw uint32 [2, K/32, Np, 2], the two weight tables in one buffer:
  Tw[0] = Tb, f32 bits of (dsv * 2^74, f32(-128 * V) * dsv * 2^-75) with V the chunk's sum of
  v; Tw[1] = Tm, dmv = -(dmin*m) as tf32 (hi, lo) by truncation. Np = N rounded up to TPAD;
  rows >= N zero.

Why the scalings: the kernel feeds u8 x u8, so its integer result D = S + 128 V is >= 0 and
< 2^23 and reads, bit for bit, as the f32 denormal D * 2^-149; fma(D * 2^-149, dsv * 2^74,
-128 V dsv 2^-75) is S * dsv * 2^-75 and fma(that, da * 2^75, y) adds da * dsv * S to y, two
FFMA per C value and chunk with no int-to-float conversion.

q6_K (scales per 16 values: each wgmma half-step sees one 16-half through zero padding):

- `split6_q8_1_ref(x)`: Xq uint8 [M, 2K], per 32-chunk 64 B = [q+128 of half 0 | 32 zeros |
  q+128 of half 1], and Tx uint8 [Mp/64, K/128, 5120]: per (64-token tile, 128-k stage) a block
  TD f32 [4][64] = da * 2^75, then TS uint32 [8][64][2] = da * A_h (A_h the half's sum of q) as
  tf32 (hi, lo). Mp = M rounded up to 64; rows >= M zero.
- `split_swiglu_ref(qtype, g, u=None)`: the split / split6 operand of x = f16(silu(g) * u), the
  ffn_down input that the swiglu launch quantizes itself (u None: g = [gate | up]).
- `repack_q6k_ref(w_raw, N, K)`: Wq uint8 [N, K] = q (0..63) and Tw uint8 [Np/128, K/128, 16384]:
  per (128-row tile, stage) TB f32 [4][128][4] = (d*sc0 * 2^74, d*sc1 * 2^74,
  (f32(sc0*Q0 + sc1*Q1) * d) * -2^-68, 0) with Q_h the half's sum of q, then TM uint32
  [8][64][4] = -32 * d * sc_h as tf32 (hi, lo), rows r and r+8 of each 16-row group side by
  side: (hi_r, hi_r+8, lo_r, lo_r+8). Np = N rounded up to 128; rows >= N zero.

The kernel reads D_h = sum (qa+128) q = S_h + 128 Q_h as a denormal like q4_K, chains
t = fma(D_0, c0, b), t = fma(D_1, c1, t), y = fma(t, da 2^75, y) (3 FFMA per value and chunk),
and adds -32 d sc_h da A_h (the q - 32 offset) on tf32 mma.
"""

from __future__ import annotations

import numpy as np

from minfer.quants.mmq_ref import decode_q4k, decode_q6k
from minfer.quants.q8_1 import quantize_q8_1_raw, unpack_q8_1_raw

TPAD = 128   # table rows (Mp, Np) are padded to a multiple of this (the kernel's tile)
_S74, _S75, _SM75 = np.float32(2.0**74), np.float32(2.0**75), np.float32(2.0**-75)


def pad_rows(n: int) -> int:
    return (n + TPAD - 1) // TPAD * TPAD


def tf32_split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 x -> (hi, lo) uint32 tf32 bit patterns by truncation, as the kernels' tf32_split."""
    x = np.asarray(x, np.float32)
    hi = x.view(np.uint32) & np.uint32(0xFFFFE000)
    lo = (x - hi.view(np.float32)).astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return hi, lo


def split_q8_1_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [M, K] -> (Aq uint8 [M, K], Ta f32 [K/32, Mp, 2])."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    d, q, s = unpack_q8_1_raw(quantize_q8_1_raw(x), K)       # d f32 (from f16), q int8, s int32
    aq = (q.astype(np.int16) + 128).astype(np.uint8)
    ta = np.zeros((K // 32, pad_rows(M), 2), np.float32)
    ta[:, :M, 0] = (d * _S75).T
    ta[:, :M, 1] = (d * s.astype(np.float32)).T
    return aq, ta


def repack_q4k_ref(w_raw: np.ndarray, N: int, K: int):
    """raw q4_K bytes [N, K/256*144] -> (Wq uint8 [N, K], Tw uint32 [2, K/32, Np, 2])."""
    dsv, dmv, v = decode_q4k(w_raw, N, K)                       # [N, K/32] f32 x2, v [N, K]
    V = v.reshape(N, K // 32, 32).astype(np.int32).sum(-1)
    Np = pad_rows(N)
    tb = np.zeros((K // 32, Np, 2), np.float32)
    tb[:, :N, 0] = (dsv * _S74).T
    tb[:, :N, 1] = (((-128 * V).astype(np.float32) * dsv) * _SM75).T
    tm = np.zeros((K // 32, Np, 2), np.uint32)
    hi, lo = tf32_split(dmv)
    tm[:, :N, 0], tm[:, :N, 1] = hi.T, lo.T
    return np.ascontiguousarray(v, np.uint8), np.stack([tb.view(np.uint32), tm])


# q6_K geometry (kernels/mmq_wgmma_q6k.cu): 64-token x 128-row tiles, stages of 128 k
Q6_BT, Q6_BN, Q6_BK = 64, 128, 128
Q6_TXB, Q6_TWB = 5120, 16384   # table bytes per (token tile, stage) / (row tile, stage)


def _tiles(n: int, t: int) -> int:
    return (n + t - 1) // t


def _pair_rows(t: np.ndarray) -> np.ndarray:
    """[..., 128 rows, 2 (hi, lo)] -> [..., 64 pairs, 4]: pair 8 * (r // 16) + r % 8 holds rows
    r and r + 8 as (hi_r, hi_r+8, lo_r, lo_r+8) (the kernel's mma A fragment in one load)."""
    g = t.reshape(*t.shape[:-2], 8, 2, 8, 2)          # [..., group, side, r % 8, hi/lo]
    return np.ascontiguousarray(np.swapaxes(np.swapaxes(g, -3, -2), -2, -1)).reshape(
        *t.shape[:-2], 64, 4)


def _unpair_rows(t: np.ndarray) -> np.ndarray:
    """Inverse of _pair_rows: [..., 64, 4] -> [..., 128, 2]."""
    g = t.reshape(*t.shape[:-2], 8, 8, 2, 2)          # [..., group, r % 8, hi/lo, side]
    return np.ascontiguousarray(np.swapaxes(np.swapaxes(g, -1, -2), -2, -3)).reshape(
        *t.shape[:-2], 128, 2)


def split6_q8_1_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [M, K] (K % 128 == 0) -> (Xq uint8 [M, 2K], Tx uint8 [Mp/64, K/128, 5120])."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    d, q, _ = unpack_q8_1_raw(quantize_q8_1_raw(x), K)        # d f32 (from f16), q int8
    u = (q.astype(np.int16) + 128).astype(np.uint8).reshape(M, K // 32, 2, 16)
    xq = np.zeros((M, K // 32, 64), np.uint8)
    xq[..., 0:16], xq[..., 48:64] = u[:, :, 0], u[:, :, 1]
    A = q.reshape(M, K // 32, 2, 16).astype(np.int32).sum(-1)  # [M, K/32, 2]
    MT, KT = _tiles(M, Q6_BT), K // Q6_BK
    td = np.zeros((MT * Q6_BT, K // 32), np.float32)
    td[:M] = d * _S75
    xs = np.zeros((MT * Q6_BT, K // 32, 2), np.float32)
    xs[:M] = d[..., None] * A.astype(np.float32)
    hi, lo = tf32_split(xs)
    ts = np.stack([hi, lo], -1)                                # [Mp, K/32, 2, 2]
    # blocks: TD [tile][kt][4 chunks][64], TS [tile][kt][8 halves][64][2]
    td_b = td.reshape(MT, Q6_BT, KT, 4).transpose(0, 2, 3, 1)
    ts_b = ts.reshape(MT, Q6_BT, KT, 8, 2).transpose(0, 2, 3, 1, 4)
    tx = np.concatenate([td_b.reshape(MT, KT, -1).view(np.uint8),
                         np.ascontiguousarray(ts_b).reshape(MT, KT, -1).view(np.uint8)], -1)
    assert tx.shape[-1] == Q6_TXB
    return xq.reshape(M, 2 * K), tx


def split_swiglu_ref(qtype: int, g: np.ndarray, u: np.ndarray | None = None):
    """Twin of minfer.cuda.mmq_wgmma.split_swiglu: the split (q4_K, 12) / split6 (q6_K, 14)
    operand of x = f16(silu(g) * u), g, u f32 [M, F] (u None: g = [gate | up], [M, 2F]).
    The device rounds silu with expf, so a value within an ulp of an f16 rounding boundary can
    land on the other side; tests/gpu compare the device bytes to the device swiglu + prepass
    bitwise, and to this twin value by value."""
    from minfer.reference.ops import swiglu

    g = np.asarray(g, np.float32)
    if u is None:
        g, u = np.split(g, 2, axis=1)
    x = swiglu(g, np.asarray(u, np.float32)).astype(np.float16).astype(np.float32)
    return split6_q8_1_ref(x) if int(qtype) == 14 else split_q8_1_ref(x)


def repack_q6k_ref(w_raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """raw q6_K bytes [N, K/256*210] -> (Wq uint8 [N, K], Tw uint8 [Np/128, K/128, 16384])."""
    dsv16, qm = decode_q6k(w_raw, N, K)                        # d*sc [N, K/16], q-32 int8
    q = (qm.astype(np.int16) + 32).astype(np.uint8)
    w = np.ascontiguousarray(w_raw, np.uint8).reshape(N, K // 256, 210)
    sc = w[..., 192:208].view(np.int8).astype(np.int32).reshape(N, K // 16)
    d = np.repeat(w[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32), 8, axis=1)
    Q = q.reshape(N, K // 16, 16).astype(np.int32).sum(-1)     # [N, K/16]
    I = (sc * Q).reshape(N, K // 32, 2).sum(-1)                # sc0*Q0 + sc1*Q1, [N, K/32]
    NT, KT = _tiles(N, Q6_BN), K // Q6_BK
    tb = np.zeros((NT * Q6_BN, K // 32, 4), np.float32)
    ds = dsv16.reshape(N, K // 32, 2)
    tb[:N, :, 0], tb[:N, :, 1] = ds[..., 0] * _S74, ds[..., 1] * _S74
    tb[:N, :, 2] = (I.astype(np.float32) * d) * np.float32(-2.0**-68)
    tm = np.zeros((NT * Q6_BN, K // 16, 2), np.uint32)
    hi, lo = tf32_split(np.float32(-32) * dsv16)
    tm[:N, :, 0], tm[:N, :, 1] = hi, lo
    tb_b = tb.reshape(NT, Q6_BN, KT, 4, 4).transpose(0, 2, 3, 1, 4)
    tm_b = _pair_rows(tm.reshape(NT, Q6_BN, KT, 8, 2).transpose(0, 2, 3, 1, 4))
    tw = np.concatenate([np.ascontiguousarray(tb_b).reshape(NT, KT, -1).view(np.uint8),
                         np.ascontiguousarray(tm_b).reshape(NT, KT, -1).view(np.uint8)], -1)
    assert tw.shape[-1] == Q6_TWB
    return q, tw


def unblock_q6k_tables(tx: np.ndarray, tw: np.ndarray, M: int, N: int, K: int):
    """The blocked tables back as plain arrays (tests and the kernel emulation):
    td [M, K/32], xs [M, K/16] (hi + lo), tb [N, K/32, 4], wm [N, K/16] (hi + lo)."""
    MT, NT, KT = tx.shape[0], tw.shape[0], K // Q6_BK
    td = tx[..., :1024].copy().view(np.float32).reshape(MT, KT, 4, Q6_BT)
    td = td.transpose(0, 3, 1, 2).reshape(MT * Q6_BT, K // 32)[:M]
    ts = tx[..., 1024:].copy().view(np.float32).reshape(MT, KT, 8, Q6_BT, 2)
    ts = ts.transpose(0, 3, 1, 2, 4).reshape(MT * Q6_BT, K // 16, 2)[:M]
    tb = tw[..., :8192].copy().view(np.float32).reshape(NT, KT, 4, Q6_BN, 4)
    tb = tb.transpose(0, 3, 1, 2, 4).reshape(NT * Q6_BN, K // 32, 4)[:N]
    tm = _unpair_rows(tw[..., 8192:].copy().view(np.float32).reshape(NT, KT, 8, 64, 4))
    tm = tm.transpose(0, 3, 1, 2, 4).reshape(NT * Q6_BN, K // 16, 2)[:N]
    xs = ts[..., 0].astype(np.float64) + ts[..., 1]
    wm = tm[..., 0].astype(np.float64) + tm[..., 1]
    return td, xs, tb, wm
