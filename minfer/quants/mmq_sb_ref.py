"""numpy twins of the super-block MMQ path (kernels/mmq_sb_q4k.cu, the q8s split entries of
quantize_q8_1.cu, mmq_repack.cu's repack_q4k_sb) and its parity oracle.

The SB path quantizes activations per 256 values (q8s: one scale per token and q4_K
super-block, llama.cpp's q8_K grouping, with q8_1's rounding), so within a super-block only
q4_K's 6-bit sub-scale changes per 32-chunk; the weight carries it in two byte planes
(sc = 8a + b: P0 = a v, P1 = b v) and the tensor core sums a whole super-block in integers.

- `split_q8s_ref(x)`: Aq uint8 [M, K] = q + 128 and Ta f32 [K/32, Mp, 2] = (da * 2^75, da * sa)
  per chunk (da the 256-block's f16-rounded scale, repeated over its 8 chunks; sa the chunk's
  sum of q). Mp = M rounded up to TPAD; rows >= M zero.
- `repack_q4k_sb_ref(w_raw, N, K)`: Wp uint8 [2, N, K] = (a v, b v) and Tw uint8 =
  [Ts f32 [K/256, Np, 4] = (8 d 2^74, d 2^74, f32(-1024 V0) d 2^-75, f32(-128 V1) d 2^-75) | Tm =
  -(dmin m) as tf32 (hi, lo), blocked (`block_tm_sb`)], V0 / V1 the super-block's sums of a v /
  b v.
- `repack_q6k_sb_ref(w_raw, N, K)`: q6_K for kernels/mmq_sb_q6k.cu: Wp int8 [3, N, K] =
  a_i (q - 32) with sc = a0 + 7 a1 + 49 a2 (balanced base-7 digits in -3..3, `sb6_digits`) and
  Ts f32 [K/256, Np, 4] = (d, 7 d, 49 d, 0) * 2^-75; its activations are the q8s split with
  signed bytes (`split_q8s_ref(x, signed=True)`).
- `mmq_sb_linear_ref(x, w_raw, M, N, K, qtype)`: the oracle, float64: the q8s-dequantized
  activations times the dequantized q4_K / q6_K weight (what the kernels compute, up to f32
  rounding).
"""

from __future__ import annotations

import numpy as np

from minfer.quants.mmq_ref import decode_q4k, decode_q6k, q4k_scales, q6k_scales
from minfer.quants.mmq_wgmma_ref import TPAD, pad_rows, tf32_split
from minfer.quants.q8_1 import q8_blocks

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


def block_tm_sb(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """hi, lo uint32 [K/32, Np] -> Tm uint32 [K/256, Np/128, 2, 16, 2, 8, 4]: per (super-block,
    128-row tile) the min-term wgmma's B operand, [hi | lo][row group][chunk 0..3 | 4..7][row]
    [chunk % 4]: element [sb][tile][s][g][kg][r][kk] = (hi, lo)[s][8 sb + 4 kg + kk][128 tile +
    8 g + r]."""
    kc, n = hi.shape
    x = np.stack([hi, lo]).reshape(2, kc // 8, 2, 4, n // 128, 16, 8)   # s, sb, kg, kk, tile, g, r
    return np.ascontiguousarray(x.transpose(1, 4, 0, 5, 2, 6, 3))


def unblock_tm_sb(tm: np.ndarray, K: int, Np: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of block_tm_sb (any view of the bytes) -> (hi, lo) uint32 [K/32, Np]."""
    x = np.asarray(tm).view(np.uint32).reshape(K // 256, Np // 128, 2, 16, 2, 8, 4)
    x = x.transpose(2, 0, 4, 6, 1, 3, 5).reshape(2, K // 32, Np)
    return x[0], x[1]


def repack_q4k_sb_ref(w_raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """raw q4_K bytes [N, K/256*144] -> (Wp uint8 [2, N, K], Tw uint8 [K/256*Np*16 + K/32*Np*8])."""
    _, dmv, v = decode_q4k(w_raw, N, K)
    d = q4k_scales(w_raw, N, K)[0]                                              # [N, K/256]
    sc = sb_scales(w_raw, N, K)
    a, b = sc >> 3, sc & 7                                                      # [N, K/32]
    vc = v.reshape(N, K // 32, 32).astype(np.int32)
    wp = np.stack([(vc * a[..., None]).reshape(N, K), (vc * b[..., None]).reshape(N, K)])
    V = vc.sum(-1)                                                              # [N, K/32]
    v0 = (a * V).reshape(N, K // QK_SB, 8).sum(-1)
    v1 = (b * V).reshape(N, K // QK_SB, 8).sum(-1)
    Np = pad_rows(N)
    ts = np.zeros((K // QK_SB, Np, 4), np.float32)
    ts[:, :N, 0] = (np.float32(8) * d * _S74).T
    ts[:, :N, 1] = (d * _S74).T
    ts[:, :N, 2] = (((-1024 * v0).astype(np.float32) * d) * _SM75).T
    ts[:, :N, 3] = (((-128 * v1).astype(np.float32) * d) * _SM75).T
    hi, lo = (np.zeros((K // 32, Np), np.uint32) for _ in range(2))
    hi[:, :N], lo[:, :N] = (p.T for p in tf32_split(dmv))
    tw = np.concatenate([ts.view(np.uint8).ravel(), block_tm_sb(hi, lo).view(np.uint8).ravel()])
    return wp.astype(np.uint8), tw


def sb6_digits(sc: np.ndarray) -> np.ndarray:
    """int8 scales -> [3, ...] balanced base-7 digits a_i in -3..3, sc = a0 + 7 a1 + 49 a2."""
    s = np.asarray(sc, np.int32)
    out = []
    for _ in range(3):
        r = (s + 3) % 7 - 3   # numpy's % is floored: the balanced digit
        out.append(r)
        s = (s - r) // 7
    assert not s.any()
    return np.stack(out)


def repack_q6k_sb_ref(w_raw: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """raw q6_K bytes [N, K/256*210] -> (Wp uint8 [3, N, K] = int8 a_i (q - 32) bytes,
    Ts f32 [K/256, Np, 4] = (d, 7 d, 49 d, 0) * 2^-75)."""
    _, qm = decode_q6k(w_raw, N, K)                                            # q - 32 [N, K]
    d, sc = q6k_scales(w_raw, N, K)                                            # [N, K/256]
    a = sb6_digits(sc.reshape(N, K // 16))                                                         # [3, N, K/16]
    wp = (np.repeat(a, 16, axis=2) * qm.astype(np.int32)).astype(np.int8)
    ts = np.zeros((K // QK_SB, pad_rows(N), 4), np.float32)
    for i, m in enumerate((1, 7, 49)):
        ts[:, :N, i] = (np.float32(m) * d * _SM75).T
    return wp.view(np.uint8), ts


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


__all__ = ["QK_SB", "TPAD", "quantize_q8s", "q8s_grid", "split_q8s_ref", "repack_q4k_sb_ref", "sb_scales",
           "block_tm_sb", "unblock_tm_sb", "sb6_digits", "repack_q6k_sb_ref",
           "mmq_sb_linear_ref"]
