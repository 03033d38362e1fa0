"""Random q4_K / q6_K weight rows for kernel and twin tests (finite scales, every other byte
random)."""

from __future__ import annotations

import numpy as np


def rand_q4k(rng, N, K):
    w = rng.integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
    for off in (0, 2):  # finite d / dmin
        w[..., off : off + 2] = (
            rng.uniform(1e-3, 2e-2, (N, K // 256))
            .astype(np.float16)
            .view(np.uint8)
            .reshape(N, K // 256, 2)
        )
    return w.reshape(N, -1)


def rand_q6k(rng, N, K):
    """Random q6_K rows: any ql / qh bytes, int8 scales over the full range, finite f16 d."""
    w = rng.integers(0, 256, (N, K // 256, 210), dtype=np.uint8)
    w[..., 208:210] = (
        rng.uniform(1e-4, 2e-3, (N, K // 256))
        .astype(np.float16)
        .view(np.uint8)
        .reshape(N, K // 256, 2)
    )
    return w.reshape(N, -1)


def rand_q8_0(rng, N, K):
    """Random q8_0 rows (34 B per 32: f16 d, 32 int8) with realistic scales."""
    w = rng.integers(0, 256, (N, K // 32, 34), dtype=np.uint8)
    w[..., 0:2] = (
        rng.uniform(1e-3, 2e-2, (N, K // 32))
        .astype(np.float16)
        .view(np.uint8)
        .reshape(N, K // 32, 2)
    )
    return w.reshape(N, -1)


def rand_weights(rng, qtype, N, K):
    """Random rows of q4_K (12), q6_K (14) or q8_0 (8)."""
    return {12: rand_q4k, 14: rand_q6k, 8: rand_q8_0}[int(qtype)](rng, N, K)
