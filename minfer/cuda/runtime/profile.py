"""OpProfile: CUDA-event timings per labelled op (bench's per-op breakdown).

With `backend.profile = OpProfile(rt)` the backend brackets every op with two events
(`with profile.op(label, flops)`); `collect()` synchronizes and folds the pending pairs into
totals: label -> [ms, flops, count], summed over forwards (and over layers).
With spin_ms > 0 each chunk's launches queue behind a spin kernel of that length (smoke.cu
spin_cycles, launched by `begin_chunk` after the chunk's synchronous uploads), so the events
time the GPU's work alone, not the host's launch rate (eager Python: 10-30 µs a launch).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np


class OpProfile:
    """CUDA-event timings per labelled op, summed over forwards: label -> [ms, flops, count]."""

    def __init__(self, rt, spin_ms: float = 0.0):
        self.rt = rt
        self.spin_ms = spin_ms
        self.spun_ms = 0.0  # the spins' total (a caller timing the wall subtracts it)
        self.pending: list[tuple[str, float, object, object]] = []
        self.totals: dict[str, list[float]] = {}

    def begin_chunk(self) -> None:
        """Called by the backend once a chunk's inputs are on the device."""
        if self.spin_ms > 0:  # (cycles at ~2 GHz: the queue only needs to stay full)
            spin = self.rt.function("smoke", "spin_cycles")  # (built before the clock runs)
            self.rt.launch(spin, (1,), (1,), (np.int64(int(self.spin_ms * 2e6)),))
            self.spun_ms += self.spin_ms

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


def interleaved_us(
    rt,
    runs: dict,
    launches: int = 10,
    groups: int = 7,
    warm: int = 1,
    preroll_ms: float | None = None,
) -> dict[str, list[float]]:
    """µs a launch of each callable of `runs` (name -> fn queueing one launch), the scripts'
    method: each run `warm` times (its kernels built), then (preroll_ms not None) rounds of all
    of them back to back, at least one, until preroll_ms have passed (the board at its power
    state), then `groups` rounds of `launches` launches
    of each, the configs interleaved within a round, timed by CUDA events -> name -> `groups`
    samples (report the median, +- half the spread)."""
    drv = rt.drv
    for fn in runs.values():
        for _ in range(warm):
            fn()
    rt.synchronize()
    t0, t1 = drv.Event(), drv.Event()
    t0.record()
    while preroll_ms is not None:
        for fn in runs.values():
            fn()
        t1.record()
        t1.synchronize()
        if t1.time_since(t0) >= preroll_ms:
            break
    us: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(groups):
        for k, fn in runs.items():
            t0.record()
            for _ in range(launches):
                fn()
            t1.record()
            t1.synchronize()
            us[k].append(t1.time_since(t0) * 1e3 / launches)
    return us
