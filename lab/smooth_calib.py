"""SmoothQuant's calibration for lab/down_grids.py's sq-* variants: max |X_j| of each ffn_down
input channel over a text's windows on the exact f32 forward, and max |W_j| of its weight's
columns, into an npz (keys 'NAME|x', 'NAME|w') that down_grids.py's --stats names for the
evaluation run. The text should not be the evaluation's
(docs/perplexity.md calibrates on Apache-2.0's text, evaluates on the GPL).

    python3 lab/smooth_calib.py OUT.npz -m M -f CALIB.txt --chunks 0 -t 1

(runs `minfer perplexity --emulate blk` with every grid replaced by an observer on ffn_down
that records and returns its operands unchanged: the PPL it prints is the exact forward's.)
"""

from __future__ import annotations

import sys

import numpy as np

STATS: dict[str, np.ndarray] = {}


class _Observer:
    name = "observe"

    def weight(self, w, name):
        w = w.reshape(w.shape[0], -1)
        STATS[name + "|w"] = np.abs(w).max(axis=0).astype(np.float32)
        return w

    def act(self, x, name):
        m = np.abs(np.asarray(x, np.float16).astype(np.float32)).reshape(-1, x.shape[-1]).max(0)
        k = name + "|x"
        STATS[k] = np.maximum(STATS[k], m) if k in STATS else m
        # and the sum of squares and the row count (mean square: down_grids.py's -r selection)
        x2 = np.asarray(x, np.float16).astype(np.float64).reshape(-1, x.shape[-1])
        q, n = name + "|x2", name + "|n"
        STATS[q] = STATS[q] + (x2 * x2).sum(0) if q in STATS else (x2 * x2).sum(0)
        STATS[n] = STATS.get(n, 0) + np.float64(x2.shape[0])
        return x


def patch() -> None:
    """Every ffn_down weight (blk routes them to f16) on the observer, nothing else rounded."""
    from minfer.tools.perplexity import emulate

    def emulated_grids(model, label):
        from minfer.cuda.plan.routes import linear_names, weight_kind

        names = (n for n in linear_names(model) if weight_kind(n) == "ffn_down")
        return dict.fromkeys(names, _Observer())

    emulate.emulated_grids = emulated_grids


def main() -> None:
    if len(sys.argv) < 2 or not sys.argv[1].endswith(".npz"):
        sys.exit("usage: smooth_calib.py OUT.npz PERPLEXITY-OPTIONS...")
    out = sys.argv[1]
    patch()
    from minfer.cli import main as cli

    try:  # (with an argv the command returns here by SystemExit)
        cli(["perplexity", "--emulate", "blk", *sys.argv[2:]])
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    np.savez(out, **STATS)
    print(
        f"{out}: {sum(k.endswith('|w') for k in STATS)} weights' max |X_j|, mean X_j^2, max |W_j|"
    )


if __name__ == "__main__":
    main()
