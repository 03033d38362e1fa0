"""ffn_down on blk's int8 grid with its busiest input channels kept on f16: LLM.int8()'s
decomposition (Dettmers et al. 2022) with the channels fixed per weight by a calibration, the
grid that takes ffn_down off f16 within gate 6 on the CPU emulation (docs/perplexity.md,
"ffn_down off f16"; `minfer perplexity --emulate blk-int8down`). Its GPU side: split_path.py
(`--gemm blk-split`, opt-in, not yet run on a GPU).

Why it works where finer scales did not: on ffn_down most of int8's KL divergence comes from the
weight's grid, not the activations' (SmolLM2's Q4_K_M: 0.00354 with the weight alone on int8,
0.00290 with the activations alone), and a weight's rounding error on input channel j reaches
the output times X_j: the few channels with the largest activations (SwiGLU's massive ones)
carry most of it. Kept exact, the rest rounds as blk does.

    y[M, N] = int8(X with columns O zeroed) @ int8(W with columns O zeroed).T + X[:, O] @ W[:, O].T

O: the N_OUTLIERS input channels of the largest mean square X_j^2 over the calibration text
(mean square, not max: the largest |X_j| of 1,024 tokens picks 35 of the 64 channels that
5,632 tokens do, the mean square 52). 128, one K block: 64 passes on SmolLM2 by 0.2 % only
(0.002995), 128 by 4 % (0.002880). On the GPU the second term would be a K = 128 f16 GEMM beside
blk's int8 one (0.9 % of an 8B ffn_down's K).
"""

from __future__ import annotations

import numpy as np

# input channels a weight keeps on f16: one K block (SmolLM2: KLD 0.00367 -> 0.00288)
N_OUTLIERS = 128


def busiest(mean_square: np.ndarray, n: int = N_OUTLIERS) -> np.ndarray:
    """The n channels of the largest mean square (int32, ascending: a kernel's gather order);
    all of them when K <= n."""
    ms = np.asarray(mean_square, np.float64)
    n = min(n, ms.size)
    top = np.argsort(-ms, kind="stable")[:n]
    return np.sort(top).astype(np.int32)


class OutlierGrid:
    """`inner`'s grid (blk's) on every input channel but a weight's `channels[name]`, which stay
    exact (f16 values) on both operands. Emulated as the operand with those columns zeroed put
    on `inner`'s grid, then the columns set back: the product is the kernel's but for the
    int8 GEMM's own noise x noise term on those columns (zero operands there: the int8 rotation
    leaves rounding noise in them, times the other side's noise).

    The channels come from a calibration (minfer perplexity's emulate binds them: `bound`,
    name -> busiest(mean square)); fallback(K): a weight's channels where it has none (blk-split's
    uncalibrated upload: the first ones), else such a weight is an error."""

    def __init__(self, inner, channels: dict | None = None, n: int = N_OUTLIERS, fallback=None):
        self.inner, self.channels, self.n, self.fallback = inner, channels, n, fallback
        self.name = f"{inner.name}-o{n}"

    def bound(self, channels: dict) -> OutlierGrid:
        """This grid with each weight's kept channels (name -> int array)."""
        return OutlierGrid(self.inner, dict(channels), self.n, self.fallback)

    def cols(self, name: str, K: int | None = None) -> np.ndarray:
        """The input channels weight `name` (of K inputs) keeps exact."""
        if self.channels is not None and name in self.channels:
            return self.channels[name]
        if self.fallback is not None and K is not None:
            return self.fallback(K)
        raise KeyError(f"{self.name}: no calibrated channels for {name} (bound() first)")

    def _split(self, a: np.ndarray, grid, name: str) -> np.ndarray:
        o = self.cols(name, a.shape[1])
        rest = np.array(a, np.float32)
        rest[:, o] = 0
        out = np.array(grid(rest, name), np.float32)
        out[:, o] = np.asarray(a, np.float16).astype(np.float32)[:, o]
        return out

    def weight(self, w: np.ndarray, name: str) -> np.ndarray:
        return self._split(w.reshape(w.shape[0], -1), self.inner.weight, name)

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        x2 = x.reshape(-1, x.shape[-1])
        return self._split(x2, self.inner.act, name).reshape(x.shape)


def split_linear_ref(x: np.ndarray, w: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The split GEMM a kernel would compute, in float64: x [M, K] (its f16 values), w [N, K]
    (the dequantized weight), cols the kept channels -> blk's GEMM of both operands with those
    columns zeroed (blk_linear_ref, activations per (token, 128) as ffn_down's) plus the f16
    product of those columns. OutlierGrid's emulation equals it but for the int8 GEMM's noise x
    noise term on the zeroed columns (tests/test_outlier_grid.py bounds it)."""
    from minfer.cuda.paths.blk.twin import blk_linear_ref

    f16 = lambda a: np.asarray(a, np.float16).astype(np.float64)  # noqa: E731
    xr, wr = np.array(x, np.float32), np.array(w, np.float32)
    xr[:, cols] = 0
    wr[:, cols] = 0
    return blk_linear_ref(xr, wr) + f16(x)[:, cols] @ f16(w)[:, cols].T


def check_cols(cols, K: int, what: str = "cols") -> np.ndarray:
    """cols as the kernels take them (int32, strictly ascending, within [0, K), at least one);
    ValueError in one line otherwise (the split kernel zeroes each column once: a repeat
    would read a zero back)."""
    c = np.asarray(cols)
    if c.ndim != 1 or c.size == 0 or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"{what}: need a non-empty 1-D integer array, got {c.dtype} {c.shape}")
    if c[0] < 0 or c[-1] >= K or (c.size > 1 and np.any(np.diff(c) <= 0)):
        raise ValueError(f"{what}: need distinct ascending channels in [0, {K}), got {c.size}")
    return c.astype(np.int32)


def blk_split_cols_ref(A: np.ndarray, cols: np.ndarray, out: np.ndarray) -> np.ndarray:
    """kernels/blk_split.cu's blk_split_cols on numpy arrays, in place: out f16 [M, n] =
    A[:, cols], then A[:, cols] = 0 (A f16 [M, K])."""
    out[...] = A[:, cols]
    A[:, cols] = 0
    return out


def col_sumsq_ref(A: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """kernels/blk_split.cu's col_sumsq_f16 on numpy arrays: acc f32 [K] += the column sums of
    squares of A f16 [M, K], in f32 row by row (the kernel's order: bit for bit)."""
    s = np.zeros(A.shape[1], np.float32)
    for row in np.asarray(A, np.float16).astype(np.float32):
        s += row * row
    acc += s
    return acc
