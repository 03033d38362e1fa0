"""Pooled jobs through the server's scheduler on the calling thread (Engine.embed / score /
rerank): one Job per prompt, steps until every job is done. The same code as the server's
(minfer.batch.scheduler: continuous batching over packed(hidden=), a query's prefix computed
once and copied to its other documents), run synchronously, so the API and the endpoints give
the same numbers."""

from __future__ import annotations

import numpy as np

from minfer.batch.schedule import MIN_SHARE, footprint
from minfer.errors import MinferError


def run_pooled(
    engine,
    prompts: list[np.ndarray],
    pool: str,
    *,
    lse: bool = False,
    share: bool = True,
    keep: bool = True,
    max_entries: int = 64,
    overlap: bool = True,
) -> list:
    """prompts: int32 id arrays -> a scheduler.Pooled per prompt, in order. share: copy common
    prefixes (>= MIN_SHARE tokens) between the prompts; keep: finished prompts may serve as
    prefix entries (at most max_entries) for later ones of this call; overlap: the scheduler's
    (each forward launched before the one before it is waited for)."""
    from minfer.batch.scheduler import Job, Scheduler

    lengths = [len(p) for p in prompts]
    engine.check(lengths, 0)
    if not prompts:
        return []
    engine.prepare(
        max(footprint(n, 0) for n in lengths), sum(footprint(n, 0) for n in lengths), max(lengths)
    )
    sched = Scheduler(
        engine.backend,
        engine.kv_slots,
        engine.ubatch,
        prefix_cache=share,
        max_entries=max_entries,
        min_share=MIN_SHARE if share else 1 << 30,
        overlap=overlap,
    )
    out: list = [None] * len(prompts)
    errs: list[Exception] = []
    left = [0]  # jobs submitted and not yet done

    def deliver(i: int):
        def f(kind: str, value) -> None:
            if kind == "pooled":
                out[i] = value
            elif kind == "error":
                errs.append(value)
            if kind in ("done", "error"):
                left[0] -= 1

        return f

    # a window of jobs in flight, a few forwards' worth: the scheduler's per-step loops and
    # slot search stay short (thousands of waiting prompts would cost ~5 % of an 8B prefill)
    window = max(64, 4 * engine.ubatch // max(1, sum(lengths) // len(lengths)))
    nxt, idle = 0, 0
    try:
        while (nxt < len(prompts) or not sched.idle()) and not errs:
            if nxt < len(prompts) and left[0] < window:
                k = min(len(prompts), nxt + window - left[0])
                sched.submit(
                    [
                        Job(
                            np.asarray(prompts[i], np.int32),
                            0,
                            deliver(i),
                            pool=pool,
                            lse=lse,
                            keep=keep,
                        )
                        for i in range(nxt, k)
                    ]
                )
                left[0] += k - nxt
                nxt = k
            idle = 0 if sched.step() else idle + 1
            if idle > 3:  # nothing can run and nothing will change
                raise MinferError(
                    "internal error: the pooled jobs made no progress "
                    f"({sched.queued()} waiting, {len(sched.running)} running)"
                )
    finally:
        sched.drain()  # (an error left a forward in flight: the backend keeps none)
    if errs:
        sched.cancel(list(sched.waiting) + [s.job for s in sched.running])
        raise errs[0]
    return out
