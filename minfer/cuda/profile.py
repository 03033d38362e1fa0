"""OpProfile: CUDA-event timings per labelled op (bench's per-op breakdown).

With `backend.profile = OpProfile(rt)` the backend brackets every op with two events
(`with profile.op(label, flops)`); `collect()` synchronizes and folds the pending pairs into
totals: label -> [ms, flops, count], summed over forwards (and over layers).
"""

from __future__ import annotations

from contextlib import contextmanager


class OpProfile:
    """CUDA-event timings per labelled op, summed over forwards: label -> [ms, flops, count]."""

    def __init__(self, rt):
        self.rt = rt
        self.pending: list[tuple[str, float, object, object]] = []
        self.totals: dict[str, list[float]] = {}

    @contextmanager
    def op(self, label: str, flops: float = 0.0):
        drv = self.rt.drv
        a, b = drv.Event(), drv.Event()
        a.record()
        yield
        b.record()
        self.pending.append((label, flops, a, b))

    def collect(self) -> dict[str, list[float]]:
        self.rt.synchronize()
        for label, flops, a, b in self.pending:
            ms = b.time_since(a)
            t = self.totals.setdefault(label, [0.0, 0.0, 0])
            t[0] += ms
            t[1] += flops
            t[2] += 1
        self.pending.clear()
        return self.totals
