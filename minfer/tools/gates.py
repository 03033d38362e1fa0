"""The tie-aware greedy-32 gate (docs/design.md, gate 3) and logit-difference helpers.

Two engines with different rounding can legitimately pick different tokens where the
reference's top-1/top-2 margin is below their logit difference. tau = 2 * max|logit diff|
measured at the last prompt position. The gate: ids equal at every step before the first step
whose reference margin is < tau; from that step on nothing is compared. A divergence at a step
whose reference margin is >= tau (before any near-tie) is a bug.

Steps are counted from 1 in messages ("identical through step k" = the first k ids equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def logit_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| (computed in float64)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logit_error: shapes {a.shape} and {b.shape} differ")
    return float(np.max(np.abs(a - b)))


def tau_from(a: np.ndarray, b: np.ndarray) -> float:
    """The near-tie threshold: twice the largest logit difference between two engines."""
    return 2.0 * logit_error(a, b)


@dataclass(frozen=True)
class GreedyVerdict:
    n: int  # steps compared (len of the reference)
    exact: int  # position-wise equal ids
    identical_through: int  # k: the first k ids are equal
    near_tie: float | None  # reference margin at the first step with margin < tau
    near_tie_step: int | None  # that step, counted from 1
    tau: float
    ok: bool  # no divergence before the first near-tie
    diverged_margin: float | None  # reference margin at the first divergence (if any)

    def describe(self) -> str:
        if self.exact == self.n:
            return f"{self.n}/{self.n} exact"
        head = f"{self.exact}/{self.n} exact; identical through step {self.identical_through}"
        if not self.ok:
            return (
                f"{head}, then a DIVERGENCE at step {self.identical_through + 1} where the "
                f"reference margin {self.diverged_margin:.4g} >= tau {self.tau:.4g} (a bug)"
            )
        if self.diverged_margin < self.tau:
            return (
                f"{head}, then a near-tie of margin {self.diverged_margin:.4g} < tau {self.tau:.4g}"
            )
        return (
            f"{head}, then a divergence at margin {self.diverged_margin:.4g}, after the "
            f"first near-tie (margin {self.near_tie:.4g} < tau {self.tau:.4g} at step "
            f"{self.near_tie_step}) from which nothing is compared"
        )


def compare_greedy(
    ids: Sequence[int], ref_ids: Sequence[int], ref_margins: Sequence[float], tau: float
) -> GreedyVerdict:
    ids, ref_ids = [int(i) for i in ids], [int(i) for i in ref_ids]
    n = len(ref_ids)
    if len(ids) != n or len(ref_margins) != n:
        raise ValueError(
            f"compare_greedy: {len(ids)} ids, {n} reference ids, "
            f"{len(ref_margins)} margins: lengths must agree"
        )
    exact = sum(a == b for a, b in zip(ids, ref_ids))
    k = next((i for i in range(n) if ids[i] != ref_ids[i]), n)
    j = next((i for i in range(n) if ref_margins[i] < tau), None)
    ok = k == n or (j is not None and j <= k)
    return GreedyVerdict(
        n=n,
        exact=exact,
        identical_through=k,
        near_tie=None if j is None else float(ref_margins[j]),
        near_tie_step=None if j is None else j + 1,
        tau=float(tau),
        ok=ok,
        diverged_margin=None if k == n else float(ref_margins[k]),
    )
