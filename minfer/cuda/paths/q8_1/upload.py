"""The raw int8 paths' weight upload (q8_1 family): the GGUF q4_K / q6_K bytes are the weight
the MMQ kernels read, so each chunk goes straight from the pinned staging to its rows (no f16
copy). A fused group is one [rows, row bytes] buffer, its members row ranges of it."""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da


def dest(rt, rows: int, row_bytes: int, what: str):
    """The uint8 [rows, row bytes] a fused group's raw rows are copied into."""
    return da.empty(rt, (rows, row_bytes), np.uint8, what)


def upload(rt, up, parts, name: str, dst=None):
    """(weight, member row views) of `parts` (base.Part) copied raw: a lone tensor as a flat
    uint8 [bytes] (the MMQ launchers' form), a group's members into row ranges of dst (None:
    a new group buffer)."""
    if len(parts) == 1 and dst is None:
        raw = parts[0].raw
        w = da.empty(rt, (raw.size,), np.uint8, f"raw weight {name}")
        _copy_rows(up, raw, da.ptr(w))
        return w, {}
    if dst is None:
        rows = sum(p.N for p in parts)
        dst = dest(rt, rows, parts[0].raw.shape[1], f"fused raw weight {name}")
    views: dict[str, object] = {}
    r0 = 0
    for p in parts:
        views[p.name] = da.rows(dst, r0, p.N)
        _copy_rows(up, p.raw, da.ptr(views[p.name]))
        r0 += p.N
    return dst, views


def _copy_rows(up, raw, dst: int) -> None:
    """raw host rows [N, row bytes] straight into device rows from address dst."""
    for r0, _, part in up.chunks(raw):
        up.put(part, dst + r0 * raw.shape[1])
