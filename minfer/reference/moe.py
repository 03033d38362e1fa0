"""The mixture-of-experts FFN of the numpy reference (llama.cpp's build_moe_ffn, softmax gating;
minfer.families.moe says which family asks for what).

route(): router logits [T, e] -> the k experts of each token (rank order) and their weights,
plus each token's tie gap: logit of its k-th expert minus that of its (k+1)-th. Two engines
whose router logits differ by less than the gap pick the same experts; a token whose gap is
within the tolerance may route either way (near_ties), and a comparison with llama.cpp says so
rather than failing on what follows from it.

moe_ffn(): per expert that any token chose, its rows of h through that expert's SwiGLU (the
expert's slice of the stacked [e, N, K] weights, dequantized on demand by the caller's
`expert(name, e)`), then the k outputs times their weights summed in rank order, as ggml's
ffn_moe_weighted views are added (slot 0 + slot 1 + ...).

shared_gate(): qwen2moe's shared expert (a dense SwiGLU every token runs, the caller's) is
added to moe_ffn's sum times sigmoid(h . ffn_gate_inp_shexp) per token.
"""

from __future__ import annotations

import numpy as np

from minfer.reference import ops

# |logit_k - logit_k+1| below which a token's routing is called a tie (router logits are O(1);
# minfer's and llama.cpp's hidden states agree to ~1e-3 on an F16 file)
ROUTER_TIE_TOL = 1e-2
W_SUM_MIN = np.float32(6.103515625e-5)  # build_moe_ffn's clamp of the weights' sum (f16 min)


def route(
    logits: np.ndarray, k: int, gating: str = "softmax", norm_w: bool = True, w_scale: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """logits [T, e] -> (sel [T, k] int, weights [T, k] in logits' dtype, gap [T])."""
    if gating != "softmax":
        raise ValueError(f"expert gating {gating!r} is not implemented (softmax only)")
    probs = ops.softmax(logits, axis=-1)
    # descending, lowest index first among equals (a stable sort of -probs)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sel = order[:, :k]
    w = np.take_along_axis(probs, sel, axis=-1)
    lk = np.take_along_axis(logits, order[:, k - 1 : k], axis=-1)[:, 0]
    gap = (
        lk - np.take_along_axis(logits, order[:, k : k + 1], axis=-1)[:, 0]
        if k < logits.shape[-1]
        else np.full(len(logits), np.inf, logits.dtype)
    )
    if norm_w:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), W_SUM_MIN.astype(w.dtype))
    if w_scale not in (0.0, 1.0):
        w = w * w.dtype.type(w_scale)
    return sel, w, gap


def near_ties(gap: np.ndarray, tol: float = ROUTER_TIE_TOL) -> np.ndarray:
    """The tokens (row indices) whose routing is within tol of a tie."""
    return np.flatnonzero(np.abs(gap) <= tol)


def moe_ffn(
    h: np.ndarray, sel: np.ndarray, w: np.ndarray, expert, prefix: str, linear
) -> np.ndarray:
    """h [T, d]; sel, w [T, k] (route's); expert(name, e) -> that expert's weight [N, K];
    linear(x, W, name) -> x @ W.T (the caller's activation rounding) -> [T, d]."""
    T, k = sel.shape
    ys = None
    for e in np.unique(sel):
        tok, slot = np.nonzero(sel == e)  # the (token, rank) pairs that chose expert e
        x = h[tok]
        g = linear(
            x, expert(prefix + "ffn_gate_exps.weight", int(e)), prefix + "ffn_gate_exps.weight"
        )
        u = linear(x, expert(prefix + "ffn_up_exps.weight", int(e)), prefix + "ffn_up_exps.weight")
        y = linear(
            ops.swiglu(g, u),
            expert(prefix + "ffn_down_exps.weight", int(e)),
            prefix + "ffn_down_exps.weight",
        )
        if ys is None:
            ys = np.zeros((T, k, y.shape[-1]), dtype=y.dtype)
        ys[tok, slot] = y
    ys *= w[..., None].astype(ys.dtype)
    out = ys[:, 0].copy()
    for j in range(1, k):  # rank order, as ggml adds the views
        out += ys[:, j]
    return out


def shared_gate(h: np.ndarray, g: np.ndarray) -> np.ndarray:
    """qwen2moe's shared-expert gate: sigmoid(h @ g) [T, 1] for h [T, d], g [d]
    (ffn_gate_inp_shexp). llama.cpp writes it as silu(x) / x, the same number to an ulp (and
    NaN at x == 0 exactly, which a float logit of real weights does not hit)."""
    x = h @ g.astype(h.dtype, copy=False)
    return (1 / (1 + np.exp(-x)))[:, None]


def first_near_tie(router_log, tie: float = ROUTER_TIE_TOL) -> tuple[int | None, int | None]:
    """(the first token that routed within `tie` of a tie in some layer, that layer), or (None,
    None): from that token on (attention is causal) two engines may run different experts."""
    ties = [(int(near_ties(g, tie)[0]), il) for il, g in router_log if len(near_ties(g, tie))]
    return min(ties) if ties else (None, None)


def tie_excused(
    positions, errs, router_log, tol: float, tie: float = ROUTER_TIE_TOL
) -> tuple[bool, str]:
    """The router-tie-aware logits gate: positions [P] (prompt rows) with errs [P] (max
    |dlogit| each) against another engine; router_log: the backend's (layer, gap [T]) list of
    that run. A position beyond tol is excused when some token at or before it (attention is
    causal) routed within `tie` of a tie in some layer: from there the engines may have run
    different experts. -> (ok, one line saying which positions failed or were excused)."""
    first, layer = first_near_tie(router_log, tie)
    bad = [(int(p), float(e)) for p, e in zip(positions, errs) if e > tol]
    hard = [(p, e) for p, e in bad if first is None or p < first]
    n_ties = sum(len(near_ties(g, tie)) for _, g in router_log)
    where = (
        f"first router near-tie (gap <= {tie:g}) at token {first}, layer {layer}; "
        f"{n_ties} near-ties in all"
        if first is not None
        else "no router near-tie"
    )
    if hard:
        return False, (
            f"{len(hard)} position(s) beyond {tol:g} before any router tie "
            f"(first: position {hard[0][0]}, {hard[0][1]:.4f}); {where}"
        )
    if bad:
        return True, (
            f"{len(bad)} position(s) beyond {tol:g}, each after a router near-tie "
            f"(a token that may route either way); {where}"
        )
    return True, f"every position within {tol:g}; {where}"


def positions_before_tie(router_log, T: int, tie: float = ROUTER_TIE_TOL) -> int:
    """How many of T positions come before the first router near-tie (T when none): the
    positions two engines must route alike. (Not `first_near_tie(...)[0] or T`: a tie at token
    0 leaves no position, not all T.)"""
    first = first_near_tie(router_log, tie)[0]
    return T if first is None else first


# The grid reference's spread (minfer.reference.spread): the relative perturbation of the
# experts' input h (each MoE layer's normed activations) that stands for an engine's own
# rounding (~1e-3: minfer's and llama.cpp's hidden states agree to ~1e-3; the GPU's h16 is the
# f16 rounding, 2^-11 relative, of a residual built in f16/f32), the draws, and the margin of
# an engine's distance over that spread.
SPREAD_EPS = 1e-3
SPREAD_DRAWS = 2
SPREAD_MARGIN = 2.0
