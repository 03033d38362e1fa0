"""Random, well-formed quantized blocks of a chosen weight scale (for synthetic models).

`random_blocks(qtype, rng, rows, cols, std)` returns the raw bytes, uint8 [rows, row_bytes], of
a [rows, cols] weight whose dequantized values (gguf.quants.dequantize) have mean ~0 and
standard deviation ~`std`. Blocks are written directly, never by quantizing floats, so an
8B-shape model takes seconds per core-GB:

- Q4_K (144 B / 256): w = d*sc*q - dmin*m with q uniform 0..15 (random nibbles), sc and m
  independent uniform 8..63 (6-bit, packed as get_scale_min_k4 reads them: real quantizers use
  the whole 6-bit range), dmin = 7.5*d so that E[w] = d*7.5*(E[sc] - E[m]) = 0.
- Q5_K (176 B / 256): as Q4_K with a fifth bit per value (random qh), q uniform 0..31,
  dmin = 15.5*d (llama.cpp's Q4_K_M gives attn_v this type at 70B's 8:1 GQA).
- Q6_K (210 B / 256): w = d*sc*(q - 32), q uniform 0..63 (random ql / qh bits), |sc| uniform
  32..127 with a random sign (int8, as llama.cpp's quantizer fills them).
- Q5_0 (22 B / 32): w = d*(q - 16), q uniform 0..31, d of random sign (llama.cpp's q5_0 d
  takes the sign of the block's extreme value; a fixed sign would bias every weight by -0.5d).
  Q8_0 (34 B / 32): w = d*q, q from a random byte b: b - 128, except that b = 0 gives 0
  (-128 never occurs in real files): symmetric, 0 twice as likely as other values.
- F16 / F32: normal values.
Per block, d = base * u with u uniform in [0.75, 1.25] (real d vary from block to block); base
is solved from the closed-form std of each design (`_unit_std`, the exact moments of the
discrete distributions above). The d are f16 and, for q6_K at large K, often subnormal, as in
real files. No block is all zero (d > 0 or < 0, never 0); single zero weights occur at the
rate of a uniform code (1/64 for q6_K, 1/32 for q5_0, ...), as they do in real files.
"""

from __future__ import annotations

import math

import numpy as np

from minfer.errors import Unsupported

_U_LO, _U_HI = 0.75, 1.25  # per-block jitter of d
_EU2 = ((_U_HI**3 - _U_LO**3) / 3) / (_U_HI - _U_LO)  # E[u^2] for u ~ U[lo, hi]

Q4K_SC = (8, 63)  # inclusive range of the 6-bit sub-block scales and mins
Q6K_SC = (32, 127)  # inclusive range of |int8 scale|

_DT = {
    "Q4_K": np.dtype(
        [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))]
    ),
    "Q5_K": np.dtype(
        [
            ("d", "<f2"),
            ("dmin", "<f2"),
            ("scales", "u1", (12,)),
            ("qh", "u1", (32,)),
            ("qs", "u1", (128,)),
        ]
    ),
    "Q6_K": np.dtype(
        [("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")]
    ),
    "Q5_0": np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))]),
    "Q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
}
_BLOCK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q5_0": 32, "Q8_0": 32}
_Q8_LUT = np.concatenate([[0], np.arange(-127, 128)]).astype(np.int8)  # random byte -> q8
SUPPORTED = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q8_0", "F16", "F32")


def _moments(values: np.ndarray) -> tuple[float, float]:
    v = values.astype(np.float64)
    return float(v.mean()), float((v * v).mean())


def _unit_std(name: str) -> float:
    """Std of the dequantized weights of the design above for d = 1 (without the jitter)."""
    if name in ("Q4_K", "Q5_K"):
        nq = 16 if name == "Q4_K" else 32
        mid = (nq - 1) / 2  # dmin / d: E[q]
        s1, s2 = _moments(np.arange(Q4K_SC[0], Q4K_SC[1] + 1))
        q1, q2 = _moments(np.arange(nq))
        # E[(sc q - mid m)^2] with sc, q, m independent, m distributed as sc
        return math.sqrt(s2 * q2 - 2 * mid * s1 * q1 * s1 + mid**2 * s2)
    if name == "Q6_K":
        _, s2 = _moments(np.arange(Q6K_SC[0], Q6K_SC[1] + 1))
        _, q2 = _moments(np.arange(64) - 32)
        return math.sqrt(s2 * q2)
    if name == "Q5_0":
        return math.sqrt(_moments(np.arange(32) - 16)[1])
    if name == "Q8_0":
        return math.sqrt(_moments(_Q8_LUT)[1])
    raise Unsupported(f"no synthetic block design for {name}")


def base_scale(name: str, std: float) -> float:
    """The d around which blocks of `name` are drawn to give dequantized std `std`."""
    return std / (_unit_std(name) * math.sqrt(_EU2))


def _rand_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    # 64-bit draws viewed as bytes: ~2x faster than drawing uint8 directly
    words = rng.integers(0, 2**64 - 1, size=(n + 7) // 8, dtype=np.uint64, endpoint=True)
    return words.view(np.uint8)[:n]


def _d(rng: np.random.Generator, nb: int, base: float) -> np.ndarray:
    return base * rng.uniform(_U_LO, _U_HI, nb)


def pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """sc, m: uint8 [nb, 8] (6-bit) -> the 12 q4_K scale bytes [nb, 12] (get_scale_min_k4)."""
    q = np.empty((sc.shape[0], 12), np.uint8)
    q[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    q[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    q[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return q


def random_blocks(
    name: str, rng: np.random.Generator, rows: int, cols: int, std: float
) -> np.ndarray:
    """Raw bytes uint8 [rows, row_bytes] of a random `name` weight [rows, cols] (see module)."""
    if name == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)
    if name == "F16":
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)).astype(
            np.float16
        )
    if name not in _DT:
        raise Unsupported(
            f"synthetic weights of type {name} are not supported "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    bs = _BLOCK[name]
    if cols % bs:
        raise Unsupported(f"{name}: row length {cols} is not a multiple of its block size {bs}")
    nb = rows * cols // bs
    dt = _DT[name]
    b = np.empty(nb, dt)
    d = _d(rng, nb, base_scale(name, std))
    if name in ("Q4_K", "Q5_K"):
        b["d"] = d.astype(np.float16)
        b["dmin"] = ((7.5 if name == "Q4_K" else 15.5) * d).astype(np.float16)
        if name == "Q5_K":
            b["qh"] = _rand_bytes(rng, nb * 32).reshape(nb, 32)
        sc = rng.integers(Q4K_SC[0], Q4K_SC[1] + 1, (nb, 8), dtype=np.uint8)
        m = rng.integers(Q4K_SC[0], Q4K_SC[1] + 1, (nb, 8), dtype=np.uint8)
        b["scales"] = pack_scale_min_k4(sc, m)
        b["qs"] = _rand_bytes(rng, nb * 128).reshape(nb, 128)
    elif name == "Q6_K":
        b["ql"] = _rand_bytes(rng, nb * 128).reshape(nb, 128)
        b["qh"] = _rand_bytes(rng, nb * 64).reshape(nb, 64)
        mag = rng.integers(Q6K_SC[0], Q6K_SC[1] + 1, (nb, 16), dtype=np.int16)
        sign = np.where(rng.integers(0, 2, (nb, 16), dtype=np.uint8) == 1, -1, 1).astype(np.int16)
        b["scales"] = (mag * sign).astype(np.int8)
        b["d"] = d.astype(np.float16)
    elif name == "Q5_0":
        sign = np.where(rng.integers(0, 2, nb, dtype=np.uint8) == 1, -1.0, 1.0)
        b["d"] = (d * sign).astype(np.float16)
        b["qh"] = _rand_bytes(rng, nb * 4).reshape(nb, 4)
        b["qs"] = _rand_bytes(rng, nb * 16).reshape(nb, 16)
    elif name == "Q8_0":
        b["d"] = d.astype(np.float16)
        b["qs"] = _Q8_LUT[_rand_bytes(rng, nb * 32)].reshape(nb, 32)
    return b.view(np.uint8).reshape(rows, -1)
