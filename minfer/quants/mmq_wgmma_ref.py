"""numpy twins of the wgmma MMQ layouts (kernels/mmq_wgmma_q4k.cu, mmq_repack.cu, quantize_q8_1.cu).

The wgmma kernel computes minfer.quants.mmq_ref's q4_K x q8_1 math (that twin stays its parity
oracle); what it needs is operands a wgmma can read from shared memory, made here bit for bit:

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
"""

from __future__ import annotations

import numpy as np

from minfer.quants.mmq_ref import decode_q4k
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
