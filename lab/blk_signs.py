"""The blk path with a fixed random-sign diagonal before its rotation, x D H on both operands
(exact: D D = I), as QuaRot's randomized Hadamard: `minfer perplexity --emulate blk` with
minfer.cuda.paths.blk.twin patched for the one process. An experiment; the kernel has no signs.

    python3 lab/blk_signs.py perplexity -m M --emulate blk -t 1 --kld-base BASE.logits

Measured 2026-12-02, the Q4_K_M requant of SmolLM2, text gnu-gpl.txt, ctx 512, base the exact
CPU forward (docs/perplexity.md), against the kernel's grid (no signs):

| windows | grid | mean KLD | same top-1 % |
| ---: | --- | --- | --- |
| 8 | blk | 0.002248 +/- 0.000069 | 97.79 +/- 0.33 |
| 8 | blk, signs | 0.002166 +/- 0.000058 | 97.40 +/- 0.35 |
| 22 | blk | 0.002777 +/- 0.000064 | 97.50 +/- 0.21 |
| 22 | blk, signs | 0.002705 +/- 0.000069 | 97.17 +/- 0.22 |

No better: the plain Walsh-Hadamard already spreads this model's activations.
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda.paths.blk import twin as blk_ref

SIGN = np.where(np.random.default_rng(12345).random(128) < 0.5, -1.0, 1.0).astype(np.float32)
_grid = blk_ref.blk_grid


def _rotated(x, block=blk_ref.BK):
    """blk_ref._rotated with the signs: f32 [R, KB, block] of (x D) H."""
    x = np.asarray(x, np.float16).astype(np.float32)
    R, K = x.shape
    xp = np.zeros((R, blk_ref.kblocks(K, block) * block), np.float32)
    xp[:, :K] = x
    return blk_ref.fwht128(xp.reshape(R, -1, block) * SIGN[:block], block)


def blk_grid(x, weight=False, block=blk_ref.BK, per_row=False):
    """x_hat = q s H D / 128: the unpatched grid of x D, times D."""
    y = _grid(x, weight=weight, block=block, per_row=per_row)
    R, K = y.shape
    yp = np.zeros((R, blk_ref.kblocks(K, block) * block), np.float32)
    yp[:, :K] = y
    return np.ascontiguousarray((yp.reshape(R, -1, block) * SIGN[:block]).reshape(R, -1)[:, :K])


def patch() -> None:
    blk_ref._rotated, blk_ref.blk_grid = _rotated, blk_grid


if __name__ == "__main__":
    patch()
    from minfer.cli import main

    main(sys.argv[1:])
