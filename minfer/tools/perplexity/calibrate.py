"""The mean square of each input channel of chosen linear weights, over a calibration text on the
exact CPU forward: what a grid that keeps a weight's busiest input channels exact needs
(minfer/cuda/paths/blk/outliers.py, `minfer perplexity --emulate blk-int8down`).

The text, its windows and the cache are minfer.engine.calib's (shared with the GPU calibration
of `--gemm blk-split`): WINDOWS windows of CTX tokens of minfer/data/calib.txt, every position
run through every layer (the forward would cut the last layer to the rows whose logits are
asked for), cached in $MINFER_CACHE/calib/ under the CPU's keys.
"""

from __future__ import annotations

import numpy as np

from minfer.engine.calib import CTX, WINDOWS, cached_stats

__all__ = ["channel_stats"]


class _Recorder:
    """A pass-through 'grid': the sum of squares of each input channel (its f16 values, as the
    kernels read them) and the row count of every weight it is put on."""

    name = "calibrate"

    def __init__(self):
        self.sq: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return w

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        x2 = np.asarray(x, np.float16).astype(np.float64).reshape(-1, x.shape[-1])
        s = (x2 * x2).sum(axis=0)
        self.sq[name] = self.sq[name] + s if name in self.sq else s
        self.rows[name] = self.rows.get(name, 0) + x2.shape[0]
        return x


def channel_stats(
    model, names, windows: int = WINDOWS, ctx: int = CTX, text_path=None, cache: bool = True
) -> dict[str, np.ndarray]:
    """name -> f64 [K]: the mean of X_j^2 over the calibration windows' rows, X the input of
    linear weight `name` in the exact float32 CPU forward (every name a linear weight of
    `model`, a loaded GGUF)."""

    def measure(names, wins):
        from minfer.reference.forward import ReferenceBackend

        rec = _Recorder()
        be = ReferenceBackend(
            model, np.float32, max_tokens=len(wins[0]), grids=dict.fromkeys(names, rec)
        )
        for w in wins:
            be.window_logits(w, 0)
        missing = [n for n in names if n not in rec.sq]
        if missing:
            raise KeyError(f"calibration: no input recorded for {', '.join(missing[:3])}")
        return {n: rec.sq[n] / rec.rows[n] for n in names}

    return cached_stats(
        model, names, measure, "the exact CPU forward", "", windows, ctx, text_path, cache
    )
