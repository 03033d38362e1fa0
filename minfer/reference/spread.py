"""The grid reference's own spread: how far its logits move when each MoE layer's input moves by
a relative `eps` (an engine's rounding), the routing held at the unperturbed run's.

Why: the blk grids (int8 after a Hadamard rotation, one scale per token or per 128) make the
reference a discontinuous function of its activations: a perturbation of relative size eps
moves the values near a rounding boundary by a whole int8 step (~1/127 of the block's max), so
the logits move ~10x more than the continuous forward's (measured on the tiny qwen3moe and
Mixtral files, eps = 1e-3, routing held: rel 1.2e-2..1.6e-2 and max |dlogit| 0.07..0.11 with
the grids, 1.4e-3 and 0.01 without). An engine that rounds exactly as the grids do, but whose
own arithmetic differs by ~eps (the GPU: f16 activations, other summation orders), sits that
far from the reference, however exact its kernels: the bound of a comparison with the grid
reference is that spread (times a margin), not the continuous forward's 3e-2 / 0.05. The
routing is held so the spread measures the grids alone; router near-ties are the tie-aware
gate's (minfer.reference.moe.tie_excused).
"""

from __future__ import annotations

import numpy as np

from minfer.reference import moe
from minfer.reference.forward import ReferenceBackend


class PerturbedReference(ReferenceBackend):
    """ReferenceBackend whose MoE layers see h * (1 + eps N(0, 1)) (seeded), routed as
    `sels` (per layer, [T, k], an earlier run's) when given, else by their own logits; each
    layer's selection goes to self.sels."""

    def __init__(self, model, eps: float, seed: int = 0, sels=None, **kw):
        super().__init__(model, **kw)
        self.eps, self.rng = float(eps), np.random.default_rng(seed)
        self.forced, self.sels = sels, []

    def _moe_input(self, il: int, h: np.ndarray) -> np.ndarray:
        if not self.eps:
            return h
        return h * (1 + self.eps * self.rng.standard_normal(h.shape)).astype(h.dtype)

    def _route(self, il: int, logits: np.ndarray):
        sel, w, gap = super()._route(il, logits)
        if self.forced is not None:  # the given experts, weighted by this run's softmax
            c = self.cfg
            sel = self.forced[len(self.sels)]
            probs = np.take_along_axis(moe.ops.softmax(logits, axis=-1), sel, axis=-1)
            w = (
                probs / np.maximum(probs.sum(-1, keepdims=True), moe.W_SUM_MIN)
                if c.moe_norm_w
                else probs
            )
            if c.moe_w_scale not in (0.0, 1.0):
                w = w * w.dtype.type(c.moe_w_scale)
        self.sels.append(sel)
        return sel, w, gap


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def grid_spread(
    model,
    grids: dict,
    ids,
    n: int,
    eps: float = moe.SPREAD_EPS,
    draws: int = moe.SPREAD_DRAWS,
    max_tokens: int = 512,
) -> tuple[float, float, np.ndarray]:
    """The reference with `grids` on ids (window_logits from 0), then `draws` runs with each MoE
    layer's input perturbed by eps (routing held) -> (max rel err over the first n positions,
    max |dlogit| there, the unperturbed logits)."""
    base = PerturbedReference(model, 0.0, grids=grids, max_tokens=max_tokens)
    want = base.window_logits(ids, 0)
    r = d = 0.0
    for s in range(draws):
        be = PerturbedReference(
            model, eps, seed=s, sels=base.sels, grids=grids, max_tokens=max_tokens
        )
        got = be.window_logits(ids, 0)
        r = max(r, rel(got[:n], want[:n]))
        d = max(d, float(np.abs(got[:n] - want[:n]).max()))
    return r, d, want
