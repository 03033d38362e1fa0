"""q8_1 raw activation blocks: what the `quantize_q8_1_raw` prepass writes and MMQ reads.

One block per 32 activations, 40 bytes (pinned by Q8_1_RAW and kernels/quantize_q8_1.cu):
  +0  d   f16     scale = amax/127 (computed in f32, stored rounded to f16)
  +2  pad 2 bytes (zero)
  +4  q   int8[32] round-half-away(x / d) with the f32 d (ggml CUDA quantize_q8_1)
  +36 s   int32   the in-block integer sum of the 32 q's (docs/design.md; ggml stores a float sum
                  instead: MMQ needs the exact integer one for the q4_K min term)
Rows are K/32 consecutive blocks: x f32 [M, K] -> uint8 [M, K/32*40].
"""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput

QK8_1 = 32
BLOCK_BYTES = 40
Q8_1_RAW = np.dtype([("d", "<f2"), ("pad", "<u2"), ("q", "i1", (32,)), ("s", "<i4")])
assert Q8_1_RAW.itemsize == BLOCK_BYTES and Q8_1_RAW.fields["s"][1] == 36


def q8_blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [M, K] (K % block == 0) -> (d f32 [M, K/block] = amax/127, q int8 [M, K]): the
    prepass's quantization of each `block` values (32: q8_1), d unrounded."""
    M, K = x.shape
    xb = x.astype(np.float32, copy=False).reshape(M, K // block, block)
    amax = np.abs(xb).max(axis=-1)  # f32
    d = amax / np.float32(127)  # f32 division, like `amax / 127`
    with np.errstate(divide="ignore", invalid="ignore"):
        v = xb / d[..., None]  # f32 division, like `xi / d`
    # roundf: half away from zero; exact in f64 since |v| <= 127 (+ a rounding ulp)
    v64 = v.astype(np.float64)
    q = np.where(amax[..., None] == 0, 0.0, np.sign(v64) * np.floor(np.abs(v64) + 0.5))
    return d, q.astype(np.int8).reshape(M, K)


def quantize_q8_1_raw(x: np.ndarray) -> np.ndarray:
    """x: f32 [M, K] (K % 32 == 0) -> uint8 [M, K/32*40], bit-identical to the CUDA prepass."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] % QK8_1:
        raise BadInput(
            f"quantize_q8_1_raw: x must be [M, K] with K a multiple of 32, got shape {x.shape}"
        )
    M, K = x.shape
    d, q = q8_blocks(x, QK8_1)
    q = q.reshape(M, K // QK8_1, QK8_1)
    out = np.zeros((M, K // QK8_1), dtype=Q8_1_RAW)
    out["d"] = d.astype(np.float16)
    out["q"] = q
    out["s"] = q.astype(np.int32).sum(axis=-1)
    return out.view(np.uint8).reshape(M, K // QK8_1 * BLOCK_BYTES)


def unpack_q8_1_raw(raw: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 [M, K/32*40] -> (d f32 [M, K/32], q int8 [M, K], s int32 [M, K/32])."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    M = raw.shape[0]
    if raw.ndim != 2 or raw.shape[1] != K // QK8_1 * BLOCK_BYTES or K % QK8_1:
        raise BadInput(
            f"q8_1 raw: expected [M, {K // QK8_1 * BLOCK_BYTES}] uint8 for K={K}, got {raw.shape}"
        )
    b = raw.view(Q8_1_RAW).reshape(M, K // QK8_1)
    return b["d"].astype(np.float32), b["q"].reshape(M, K), b["s"].astype(np.int32)


def dequantize_q8_1_raw(raw: np.ndarray, K: int) -> np.ndarray:
    """uint8 [M, K/32*40] -> f32 [M, K]: d * q."""
    d, q, _ = unpack_q8_1_raw(raw, K)
    M = q.shape[0]
    return (q.reshape(M, K // QK8_1, QK8_1).astype(np.float32) * d[..., None]).reshape(M, K)
