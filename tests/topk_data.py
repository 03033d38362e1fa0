"""Logits rows for the top log-probs tests (ops.row_topk and the kernel row_topk_f32): ties
planted at the top and around the k-th place, -inf entries, an all-equal row, an ascending row
(every element a new best), a row with fewer finite logits than k; and a brute-force twin."""

from __future__ import annotations

import numpy as np


def planted(m: int, V: int, seed: int) -> np.ndarray:
    """f32 [m, V] random logits (scale 3) with the rows described above (rows 1, 2, 3 when m is
    large enough: all equal, ascending, three finite values among -inf)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, V)) * 3).astype(np.float32)
    n = min(V, 25)
    for i in range(m):
        top = np.argpartition(-x[i], n - 1)[:n] if n < V else np.arange(V)
        top = top[np.argsort(-x[i, top], kind="stable")]
        x[i, rng.integers(0, V, 3)] = x[i, top[0]]  # ties with the maximum
        x[i, rng.integers(0, V, 3)] = x[i, top[rng.integers(0, n)]]  # ties in the top 25
        x[i, rng.integers(0, V, max(1, V // 7))] = -np.inf  # a mask / soft cap
    if m > 2:
        x[1] = 0.5  # every logit tied: ids 0..k-1
        x[2] = np.arange(V, dtype=np.float32)  # ascending: each new one the best so far
    if m > 3:
        x[3, :] = -np.inf  # fewer finite logits than k
        x[3, [V - 1, V // 2]] = 1.0
        x[3, 0] = -0.0 if V > 2 else 1.0
    return x


def lse_of(x: np.ndarray) -> np.ndarray:
    """f32 [m] logsumexp of each row (f64 inside)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mx = x.max(axis=1).astype(np.float64)
        return (mx + np.log(np.exp(x - mx[:, None]).sum(axis=1))).astype(np.float32)


def brute_topk(x: np.ndarray, lse: np.ndarray, k: int):
    """(ids int32 [m, k], log-probs f32 [m, k]) by a full sort of each row: value descending,
    then index ascending; log-prob = logit - lse in f32."""
    m, V = x.shape
    ids = np.empty((m, k), np.int32)
    for i in range(m):
        ids[i] = np.lexsort((np.arange(V), -x[i].astype(np.float64)))[:k]
    lp = np.take_along_axis(x, ids.astype(np.int64), 1) - lse.astype(np.float32)[:, None]
    return ids, lp


def same_bits(a, b) -> bool:
    """a and b bit for bit (any NaN equal to any NaN: numpy's and the GPU's payloads differ)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    u = a.view(np.uint32) == b.view(np.uint32)
    return bool(np.all(u | (np.isnan(a) & np.isnan(b))))
