"""The packed token layout's contract, checked alike by both backends' packed() (the CPU
reference and minfer.cuda.backend): ids int32 [T], tok int32 [T, 2] = (KV slot, first slot of
the token's sequence), rows int32 [m] (chunk rows to score), targets int32 [m] (next token or
-1). A token sits at position slot - lo and attends slots lo..slot; slot and lo never decrease
within a call (the GPU's attention takes a block's key range from its first and last tokens);
a repeated slot repeats its token (a padded decode step)."""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput

TOP_MAX = 20  # top log-probs per row at most (OpenAI's logprobs / top_logprobs cap)


def check_packed(
    ids,
    tok,
    rows,
    targets,
    *,
    vocab: int,
    kv_slots: int,
    n_pos: int,
    what_pos: str,
    max_tokens: int | None = None,
    max_rows: bool = False,
):
    """(ids, tok, rows, targets) as int64 arrays, or BadInput naming what cannot run.
    n_pos: positions below it (what_pos names the limit: "the model's context of 256");
    max_tokens: T at most (the GPU's ubatch); max_rows: m <= T (the GPU's head buffers)."""
    arrs = [np.asarray(a) for a in (ids, tok, rows, targets)]
    for name, a in zip(("ids", "tok", "rows", "targets"), arrs):
        if a.size and a.dtype.kind not in "iu":
            raise BadInput(f"packed: {name} must be integers, not {a.dtype}")
    ids, tok, rows, targets = (a.astype(np.int64) for a in arrs)
    T = ids.shape[0] if ids.ndim == 1 else 0
    if T == 0 or (max_tokens is not None and T > max_tokens):
        raise BadInput(
            "packed: ids must be a non-empty 1-D array"
            + (f" of 1..{max_tokens} tokens" if max_tokens else "")
            + f", got shape {ids.shape}"
        )
    if tok.shape != (T, 2) or rows.ndim != 1 or targets.shape != rows.shape:
        raise BadInput(
            f"packed: tok {tok.shape}, rows {rows.shape}, targets "
            f"{targets.shape} for {T} tokens (expected [T, 2], [m], [m])"
        )
    if ids.min() < 0 or ids.max() >= vocab:
        raise BadInput(f"packed: token id out of range [0, {vocab})")
    slot, lo = tok[:, 0], tok[:, 1]
    if (lo < 0).any() or (slot < lo).any() or slot.max() >= kv_slots:
        raise BadInput(
            f"packed: slots must satisfy 0 <= lo <= slot < {kv_slots} (the KV "
            f"cache's slots), got slot {int(slot.max())}, lo {int(lo.min())}"
        )
    if (np.diff(slot) < 0).any() or (np.diff(lo) < 0).any():
        raise BadInput("packed: slots and sequence starts must be non-decreasing")
    same = np.flatnonzero(np.diff(slot) == 0)
    if same.size and ((ids[same] != ids[same + 1]).any() or (lo[same] != lo[same + 1]).any()):
        raise BadInput("packed: a repeated slot must repeat its token (same id and lo)")
    if (slot - lo).max() >= n_pos:
        raise BadInput(f"packed: position {int((slot - lo).max())} past {what_pos}")
    if max_rows and rows.size > T:
        raise BadInput(f"packed: {rows.size} rows for {T} tokens (at most one per token)")
    if rows.size and (rows.min() < 0 or rows.max() >= T):
        raise BadInput(
            f"packed: rows must be in [0, {T}), got {int(rows.min())}..{int(rows.max())}"
        )
    if rows.size and (targets.max() >= vocab or targets.min() < -1):
        raise BadInput(f"packed: targets must be -1 or token ids below {vocab}")
    return ids, tok, rows, targets


def check_top(top, vocab: int) -> int:
    """packed()'s `top` (top log-probs per row) as an int in [0, min(TOP_MAX, vocab)], or
    BadInput."""
    if (
        isinstance(top, bool)
        or not isinstance(top, (int, np.integer))
        or not 0 <= int(top) <= min(TOP_MAX, vocab)
    ):
        raise BadInput(f"packed: top must be an integer in [0, {min(TOP_MAX, vocab)}], got {top!r}")
    return int(top)


def check_hidden(hidden, T: int):
    """packed()'s `hidden` (chunk rows whose final-normed hidden state is wanted) as int64
    [h] in [0, T) (at most T of them: the GPU's row buffer), or None; BadInput otherwise."""
    if hidden is None:
        return None
    h = np.asarray(hidden)
    if h.ndim != 1 or (h.size and h.dtype.kind not in "iu"):
        raise BadInput(
            f"packed: hidden must be a 1-D integer array of chunk rows, got "
            f"shape {h.shape} {h.dtype}"
        )
    h = h.astype(np.int64)
    if h.size > T or (h.size and (h.min() < 0 or h.max() >= T)):
        raise BadInput(
            f"packed: hidden must be at most {T} rows in [0, {T}), got {h.size} "
            f"rows" + (f" in {int(h.min())}..{int(h.max())}" if h.size else "")
        )
    return h
