"""The blk path's weight grid, other scale layouts: `minfer perplexity --emulate blk` with the
weight requantized on a variant grid, to find which weight scale layout passes gate 6
(docs/perplexity.md). It chose the kernel's grid, A (one scale per (row, 128)); the kernel
had one scale per row before. An experiment: this patches minfer.cuda.paths.blk.twin.blk_grid
(weight=True) for the one process.

    python3 lab/blk_wgrid.py VARIANT -m M --emulate blk -t 1 --kld-base BASE.logits

Every variant works on the rotated blocks y [R, KB, 128] of the weight [R, K] (blk_ref._rotated)
and keeps the activations as the kernel has them (rotated int8 per (token, 128)):

| variant | weight scale | q |
| --- | --- | --- |
| none | the weight exact (activations alone on the grid; a control) | - |
| row | per row, amax/127 (the kernel's first grid) | rint(y / s) |
| A | per (row, block), amax/127 (the kernel's grid) | rint(y / s) |
| B | per row, c amax/127, c in 0.50..1.00 step 0.02 by the row's squared error | clipped |
| C | per (row, block), c as in B by the block's squared error | clipped |
| D | s_row amax/127 x f per (128-row tile, block), f = max over the tile of blk amax / row amax | rint(y / (s_row f)) |
| Dm | as D, f = c f_max, c as in B by the (tile, block)'s squared error | clipped |

The squared error in the rotated space is 128 times that in the weight's own (H H^T = 128 I).

Measured 2026-12-02 (text gnu-gpl.txt, ctx 512, 8 windows, -t 1; base the exact CPU forward),
Q4_K_M requant of SmolLM2 (gate: KLD <= 0.003, same top-1 >= 97.93 %):

| variant | PPL | mean KLD | 99% KLD | same top-1 % |
| --- | --- | --- | ---: | --- |
| none | 19.0718 | 0.000663 +/- 0.000020 | 0.003867 | 98.48 +/- 0.27 |
| row (docs) | - | 0.003424 | - | 96.72 |
| A | 19.0619 | 0.002276 +/- 0.000072 | 0.012077 | 97.25 +/- 0.36 |
| B | 19.1884 | 0.003284 +/- 0.000095 | 0.017947 | 96.32 +/- 0.42 |
| C | = A (c = 1 wins in every block) | | | |
| D | 19.2008 | 0.003472 +/- 0.000091 | 0.022174 | 96.52 +/- 0.41 |
| Dm | 19.1999 | 0.003360 +/- 0.000093 | 0.021648 | 97.01 +/- 0.38 |

Q4_1, A: PPL 18.3711, KLD 0.002018 +/- 0.000044, 99% 0.009502, same top-1 97.45 +/- 0.35 %.
"""

from __future__ import annotations

import sys

import numpy as np

CANDS = np.round(np.arange(0.50, 1.0001, 0.02), 2).astype(np.float32)  # 26 clip factors


def _q(y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """y / s to int8 values in [-127, 127] (as f32), s broadcast against y; s = 0 -> 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(s > 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
    return np.clip(np.rint(y * inv), -127, 127)


def _mse_scale(y: np.ndarray, s0: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The scale c s0 (c in CANDS) of least squared error over `axes` of y; s0 keeps those axes
    as size 1 (broadcast against y)."""
    best, best_err = s0.copy(), np.full(s0.shape, np.inf, np.float64)
    for c in CANDS:
        s = (s0 * c).astype(np.float32)
        err = ((_q(y, s) * s - y).astype(np.float64) ** 2).sum(axis=axes, keepdims=True)
        better = err < best_err
        best = np.where(better, s, best)
        best_err = np.where(better, err, best_err)
    return best


def weight_grid(y: np.ndarray, variant: str) -> np.ndarray:
    """Rotated weight blocks y f32 [R, KB, 128] -> their values on `variant`'s grid, same shape."""
    R, KB, B = y.shape
    a = np.abs(y)
    if variant == "none":
        return y
    if variant in ("row", "B"):
        s = a.max(axis=(1, 2), keepdims=True) / np.float32(127)
        if variant == "B":
            s = _mse_scale(y, s, (1, 2))
        return _q(y, s) * s
    if variant in ("A", "C"):
        s = a.max(axis=2, keepdims=True) / np.float32(127)
        if variant == "C":
            s = _mse_scale(y, s, (2,))
        return _q(y, s) * s
    if variant in ("D", "Dm"):
        Rp = -(-R // 128) * 128
        yp = np.zeros((Rp, KB, B), np.float32)
        yp[:R] = y
        ap = np.abs(yp)
        row = ap.max(axis=(1, 2))  # [Rp]
        srow = (row / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(row[:, None] > 0, ap.max(axis=2) / row[:, None], 0)  # [Rp, KB]
        f = ratio.reshape(Rp // 128, 128, KB).max(axis=1).astype(np.float32)  # [T, KB]
        yt = yp.reshape(Rp // 128, 128, KB, B)
        s = srow.reshape(Rp // 128, 128, 1, 1) * f[:, None, :, None]  # [T,128,KB,1]
        if variant == "Dm":
            # one factor per (tile, block): search c f over the tile's rows and the block
            best_f = f.copy()
            best_err = np.full(f.shape, np.inf, np.float64)
            for c in CANDS:
                sc = (s * c).astype(np.float32)
                err = ((_q(yt, sc) * sc - yt).astype(np.float64) ** 2).sum(axis=(1, 3))
                better = err < best_err
                best_f = np.where(better, f * c, best_f)
                best_err = np.where(better, err, best_err)
            s = (srow.reshape(Rp // 128, 128, 1, 1) * best_f[:, None, :, None]).astype(np.float32)
        return (_q(yt, s) * s).reshape(Rp, KB, B)[:R]
    raise ValueError(f"unknown weight grid variant {variant!r}")


VARIANTS = ("none", "row", "A", "B", "C", "D", "Dm")


def patch(variant: str) -> None:
    """Route blk_ref.blk_grid(weight=True) through `variant`'s grid (activations unchanged)."""
    from minfer.cuda.paths.blk import twin as blk_ref

    orig = blk_ref.blk_grid

    def blk_grid(x, weight=False, block=blk_ref.BK, **kw):
        if not weight:
            return orig(x, block=block, **kw)
        R, K = np.asarray(x).shape
        y = blk_ref._rotated(x, block)
        back = blk_ref.fwht128(weight_grid(y, variant), block) / np.float32(block)
        return np.ascontiguousarray(back.reshape(R, -1)[:, :K])

    blk_ref.blk_grid = blk_grid


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: blk_wgrid.py {{{','.join(VARIANTS)}}} PERPLEXITY-OPTIONS...")
    patch(sys.argv[1])
    from minfer.cli import main as cli

    sys.argv = ["minfer", "perplexity", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
