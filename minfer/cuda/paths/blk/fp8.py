"""FP8 e4m3 with block scales on both operands (DeepSeek-V3's recipe, DeepGEMM's GEMM), as a
CPU emulation grid only: no kernel runs it (`minfer perplexity --emulate blk-fp8down...`,
docs/perplexity.md, measures whether it would pass gate 6 on ffn_down / attn_output).

e4m3 is OCP's E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; normals
(1 + m/8) 2^(e-7) for e = 1..15 (e = 15, m = 7 is NaN: no infinities), subnormals m 2^-9;
largest 448, smallest normal 2^-6. Conversion rounds to nearest, ties to even, and saturates
to +-448 (PTX cvt.rn.satfinite.e4m3x2.f32). `e4m3` here is exact for f32 / f64 inputs
(frexp and power-of-two scaling, no other rounding); `e4m3_table` is the 256 codes decoded
from the definition above, the tests' independent oracle.

Block scales: an [R, K] operand is cut into blocks of `rows` x 128 along K (the last one zero-
padded): activations per (token, 128) (rows = 1), weights per (row, 128) (rows = 1) or per
(128 x 128) tile (rows = 128). Scale s = amax / 448 in f32 and q = e4m3(x * (448 / amax)) (one
division a block, a multiply a value); pow2: s = the smallest power of two with amax / s <=
448, q = e4m3(x / s), both exact. The GEMM (fp8_gemm) is DeepGEMM's: per 128 of K the e4m3
products summed in f32 (the tensor core's partial sum; Hopper keeps ~14 bits of it, not
emulated: 2^-14 against e4m3's 2^-4), then promoted into the f32 accumulator times sa sw.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6  # 2^-6
E4M3_MANT = 3
FB = 128  # K per scale block


def e4m3(x: np.ndarray) -> np.ndarray:
    """x (f32 or f64) -> the nearest e4m3 value (ties to even, saturating to +-448, NaN kept),
    in x's float dtype. Exact: |x| = m 2^E (frexp), the grid step at |x| is 2^(max(E-1, -6) -
    3), and x / step is a power-of-two scaling."""
    x = np.asarray(x)
    dt = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    a = np.abs(x.astype(np.float64))
    _, E = np.frexp(a)
    e = np.maximum(E - 1, E4M3_MIN_NORMAL_EXP) - E4M3_MANT  # log2 of the step at |x|
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.minimum(np.ldexp(np.rint(np.ldexp(a, -e)), e), E4M3_MAX)
    q = np.where(np.isnan(a), np.nan, q)
    return np.copysign(q, x).astype(dt)


def e4m3_table() -> np.ndarray:
    """The 256 codes' values (f64), decoded from the format's definition; NaN at 0x7f, 0xff."""
    c = np.arange(256)
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(s == 1, -v, v)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """x -> uint8 e4m3 codes of e4m3(x) (NaN: 0x7f; -0 keeps its sign bit)."""
    q = e4m3(np.asarray(x, np.float64))
    a = np.abs(q)
    _, E = np.frexp(a)
    normal = a >= 2.0**E4M3_MIN_NORMAL_EXP
    ef = np.where(normal, E - 1 + 7, 0)
    with np.errstate(invalid="ignore"):
        m = np.where(normal, np.ldexp(a, -(E - 1 - 3)) - 8, np.ldexp(a, 9))
    code = (ef << 3) | np.nan_to_num(m).astype(np.int64)
    code = np.where(np.isnan(a), 0x7F, code) | (np.signbit(q).astype(np.int64) << 7)
    return code.astype(np.uint8)


def _pow2_ceil(r: np.ndarray) -> np.ndarray:
    """The smallest power of two >= r > 0 (f64, exact)."""
    m, E = np.frexp(r)
    return np.ldexp(1.0, np.where(m == 0.5, E - 1, E))


def quantize_fp8(
    x: np.ndarray, rows: int = 1, pow2: bool = False, block: int = FB
) -> tuple[np.ndarray, np.ndarray]:
    """x [R, K] (its f16 values: the kernels would read f16) -> (q [R, KB * block] f32 e4m3
    values, s f32 [R, KB]): one scale per (`rows` rows, `block` of K), repeated over the rows
    of its group; q * s ~= x (zero padded past K)."""
    x = np.asarray(x, np.float16).astype(np.float32)
    R, K = x.shape
    KB, Rg = -(-K // block), -(-R // rows)
    xp = np.zeros((Rg * rows, KB * block), np.float32)
    xp[:R, :K] = x
    amax = np.abs(xp.reshape(Rg, rows, KB, block)).max(axis=(1, 3))  # [Rg, KB]
    if pow2:
        s = np.where(amax > 0, _pow2_ceil(amax.astype(np.float64) / E4M3_MAX), 0.0)
        with np.errstate(divide="ignore"):
            inv = np.where(s > 0, 1 / s, 0.0)  # exact (a power of two)
        s, inv = s.astype(np.float32), inv
    else:
        s = (amax / np.float32(E4M3_MAX)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, np.float32(E4M3_MAX) / amax, np.float32(0))
        inv = inv.astype(np.float32)
    inv_r = np.repeat(inv, rows, axis=0)[:R]
    y = xp[:R].reshape(R, KB, block) * inv_r[..., None]  # f32 (pow2: exact)
    q = e4m3(y.astype(np.float32)).reshape(R, KB * block)
    return q, np.ascontiguousarray(np.repeat(s, rows, axis=0)[:R])


def fp8_gemm(qa: np.ndarray, sa: np.ndarray, qw: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """DeepGEMM's math in f32: y = sum_b (qa_b @ qw_b^T, summed in f32) * sa_b sw_b^T, the
    partial sum of each block of K promoted into the f32 accumulator -> f32 [M, N]. The
    blocks: K / sa.shape[1] of K for the activations, K / sw.shape[1] for the weights (128,
    or 32 on one side or both: the MX-like grids); the promotion runs per the finer of the
    two (per 32 when either is 32), each partial sum times its blocks' sa sw."""
    M, KA = sa.shape
    KW = sw.shape[1]
    ba, bw = qa.shape[1] // KA, qw.shape[1] // KW
    p = min(ba, bw)
    y = np.zeros((M, sw.shape[0]), np.float32)
    for b in range(qa.shape[1] // p):
        P = qa[:, b * p : (b + 1) * p].astype(np.float32) @ qw[:, b * p : (b + 1) * p].T
        s = sa[:, b * p // ba, None] * sw[None, :, b * p // bw]
        y += P.astype(np.float32) * s.astype(np.float32)
    return y


def fp8_grid(x: np.ndarray, rows: int = 1, pow2: bool = False, block: int = FB) -> np.ndarray:
    """x [R, K] -> f32 [R, K]: the values the FP8 GEMM sees, q * s, so that
    fp8_grid(x) @ fp8_grid(w).T equals fp8_gemm up to f32 rounding: the CPU emulation.
    block: K per scale (128; 32: the MX-like grids)."""
    x = np.asarray(x)
    R, K = x.shape
    q, s = quantize_fp8(x, rows=rows, pow2=pow2, block=block)
    y = q.reshape(R, -1, block) * s[..., None]
    return np.ascontiguousarray(y.reshape(R, -1)[:, :K]).astype(np.float32)


class Fp8Grid:
    """FP8 e4m3 on the CPU reference (ReferenceBackend(grids=...)): activations per (token,
    ablock), weights per (row, wblock) (wrows = 1) or per (128 x 128) tile (wrows = 128);
    pow2: power-of-two scales on both sides. ablock, wblock: 128 (DeepSeek-V3's) or 32 (as
    the MX formats: the kernel would promote per 32 of K)."""

    def __init__(self, wrows: int = 1, pow2: bool = False, ablock: int = FB, wblock: int = FB):
        self.wrows, self.pow2, self.ablock, self.wblock = wrows, pow2, ablock, wblock
        self.name = (
            "fp8"
            + ("-tile" if wrows > 1 else "")
            + ("-p2" if pow2 else "")
            + (f"-a{ablock}" if ablock != FB else "")
            + (f"-w{wblock}" if wblock != FB else "")
        )

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        w = w.reshape(w.shape[0], -1)
        return fp8_grid(w, rows=self.wrows, pow2=self.pow2, block=self.wblock)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        y = fp8_grid(x.reshape(-1, x.shape[-1]), pow2=self.pow2, block=self.ablock)
        return y.reshape(x.shape)


__all__ = [
    "E4M3_MAX",
    "FB",
    "Fp8Grid",
    "e4m3",
    "e4m3_encode",
    "e4m3_table",
    "fp8_gemm",
    "fp8_grid",
    "quantize_fp8",
]
