"""The engine thread's batching wait (Scheduler(batch_wait=)): under load a prompt-only step
waits for more prompts to fill its forward; an idle server's first request never waits; a
step whose prompts already fill the budget never waits. A fake backend records each forward's
tokens; its forwards take FWD seconds, so the wait's window is min(batch_wait, FWD / 2)."""

from __future__ import annotations

import threading
import time

import numpy as np

from minfer.batch.scheduler import Job, Scheduler

FWD = 0.4  # a forward's time: the window after it is 0.2 s


class FakeBackend:
    def __init__(self):
        self.forwards: list[tuple[float, int]] = []  # (start time, tokens)
        self.hold = threading.Event()
        self.hold.set()

    def packed(self, ids, tok, rows, targets, top=0):
        self.forwards.append((time.perf_counter(), len(ids)))
        self.hold.wait()
        time.sleep(FWD)
        st = np.zeros((len(rows), 4), np.float32)
        return (st, None, None) if top else st

    def copy_kv(self, src, dst, n):
        pass


def _job(n: int, first: int, done: dict, name: str) -> Job:
    def deliver(kind, value):
        if kind in ("done", "error"):
            done[name] = (kind, value, time.perf_counter())

    # distinct first tokens: no prefix sharing between the jobs
    ids = np.full(n, first, np.int32)
    return Job(ids, 0, deliver)


def _sched(be, wait):
    s = Scheduler(be, kv_slots=8192, max_batch_tokens=512, prefix_cache=False, batch_wait=wait)
    s.start()
    return s


def _until(cond, timeout=10.0):
    t = time.perf_counter() + timeout
    while not cond():
        assert time.perf_counter() < t, "timed out"
        time.sleep(0.005)


def _b_and_c(wait: float) -> list[int]:
    """A runs alone; B arrives during A; C 100 ms after A ends: the forwards' token counts."""
    be, done = FakeBackend(), {}
    s = _sched(be, wait)
    try:
        s.submit([_job(64, 1, done, "a")])
        _until(lambda: len(be.forwards) == 1)
        s.submit([_job(64, 2, done, "b")])
        _until(lambda: "a" in done)
        time.sleep(0.1)
        s.submit([_job(64, 3, done, "c")])
        _until(lambda: "b" in done and "c" in done)
    finally:
        s.stop()
    return [t for _, t in be.forwards]


def test_a_step_under_load_waits_for_more_prompts():
    assert _b_and_c(wait=1.0) == [64, 128]  # B and C in one forward


def test_without_the_wait_each_prompt_runs_as_it_comes():
    assert _b_and_c(wait=0.0) == [64, 64, 64]


def test_an_idle_servers_first_request_runs_at_once():
    be, done = FakeBackend(), {}
    s = _sched(be, 1.0)
    try:
        t0 = time.perf_counter()
        s.submit([_job(64, 1, done, "a")])
        _until(lambda: len(be.forwards) == 1)
        assert be.forwards[0][0] - t0 < 0.1  # the window (0.2 s) was not waited
    finally:
        s.stop()


def test_a_full_budget_runs_without_waiting():
    be, done = FakeBackend(), {}
    s = _sched(be, 1.0)
    try:
        s.submit([_job(64, 1, done, "a")])
        _until(lambda: len(be.forwards) == 1)
        s.submit([_job(512, 2, done, "b")])  # fills the 512-token budget alone
        _until(lambda: "a" in done)
        t_a = done["a"][2]
        _until(lambda: len(be.forwards) == 2)
        assert be.forwards[1][0] - t_a < 0.1
        _until(lambda: "b" in done)
    finally:
        s.stop()
