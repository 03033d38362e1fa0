"""The scheduler's overlap (minfer/batch/scheduler.py: forward N+1 launched before N is waited
for) on the CPU reference in float64: the same jobs through overlap on and off give identical
deliveries (scoring with echo log-probs and top, generation, pooled embeddings of each
pooling, prefix-sharing followers of running sequences and of prefix entries, cancels in
flight, a failing forward); a fake backend whose wait sleeps shows the next launch comes
before the previous wait and never two launches outstanding."""

from __future__ import annotations

import time

import numpy as np
import pytest

from minfer.batch.scheduler import Job, Scheduler
from minfer.errors import MinferError

KV = 4096
BUDGET = 64  # tokens a forward: long prompts run in chunks
BAD = 200  # a forward holding this id fails (the failing backend)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model

    meta, tensors = small_parts(7)
    return load_model(write_small(tmp_path_factory.mktemp("overlap") / "m.gguf", meta, tensors))


def _ref(model):
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(model, dtype=np.float64)
    be.reserve_slots(KV)
    return be


class _Failing:
    """The reference behind packed() only (the scheduler's eager fallback), failing any
    forward that holds the id BAD."""

    def __init__(self, be):
        self.be = be

    def packed(self, ids, *a, **kw):
        if BAD in np.asarray(ids):
            raise MinferError("non-finite logits (a fake fault)")
        return self.be.packed(ids, *a, **kw)

    def copy_kv(self, *a):
        self.be.copy_kv(*a)


def _plain(kind: str, v):
    """A delivery as comparable values."""
    if kind == "prompt":
        return (v.argmax.tolist(), v.logprob.tolist(), v.top_ids.tolist(), v.top_lp.tolist())
    if kind == "token":
        top = None if v.top_ids is None else (v.top_ids.tolist(), v.top_lp.tolist())
        return (v.id, v.logprob, top)
    if kind == "pooled":
        return (v.vec.tolist(), v.lse)
    if kind == "error":
        return str(v)
    return v


def _run(backend, overlap: bool, bad: bool = False, gen: bool = True):
    """Two waves of jobs through one scheduler -> (deliveries per job name, the scheduler).
    gen False: no job decodes (max_tokens <= 1), so every step overlaps."""
    rng = np.random.default_rng(3)

    def ids(n):
        return rng.integers(1, 199, n).astype(np.int32)

    got: dict[str, list] = {}
    jobs: dict[str, Job] = {}
    sched = Scheduler(backend, KV, BUDGET, overlap=overlap)

    def job(name, p, max_tokens=0, on=None, **kw):
        got[name] = []

        def deliver(kind, v):
            got[name].append((kind, _plain(kind, v)))
            if on is not None:
                on(kind, v)

        jobs[name] = Job(np.asarray(p, np.int32), max_tokens, deliver, **kw)
        return jobs[name]

    head, qa = ids(30), ids(24)
    a = np.concatenate([head, ids(10)])
    first = [
        job("score", a, prompt_stats=True, top=3),
        job("score-follower", np.concatenate([head, ids(6)]), 1, prompt_stats=True, top=2),
        job("gen", ids(10), 5, gen_logprobs=True, top=2),
        job("gen-stop", ids(20), 6, stop_ids=frozenset(range(1, 260, 3))),
        job("mean", ids(50), pool="mean"),
        job("cls", ids(25), pool="cls"),
        job("last", np.concatenate([qa, ids(8)]), pool="last", lse=True),
        job("last-follower", np.concatenate([qa, ids(12)]), pool="last", keep=False),
        job(
            "cancel-self",
            ids(12),
            6,
            on=lambda k, v: (
                k == "token"
                and len(got["cancel-self"]) == 2
                and sched.cancel([jobs["cancel-self"]])
            ),
        ),
        job("long-cancelled", ids(150), prompt_stats=True, top=1),
        job("long", ids(140), 2, prompt_stats=True, top=1),
    ]
    if bad:
        first.append(job("bad", np.concatenate([ids(3), [BAD], ids(120)]), 3 if gen else 1))
    if not gen:
        first = [j for j in first if j.max_tokens <= 1]
    # the long prompt is cancelled in flight, when the first scoring prompt's numbers arrive
    deliver = jobs["score"].deliver
    jobs["score"].deliver = lambda k, v: (
        deliver(k, v),
        k == "prompt" and sched.cancel([jobs["long-cancelled"]]),
    )
    sched.submit(first)
    _until_idle(sched)
    # a second wave: heads found in the prefix cache (the finished prompts' rows)
    sched.submit(
        [
            job("entry-follower", np.concatenate([a, ids(5)]), 2, prompt_stats=True, top=3),
            job("entry-last", np.concatenate([qa, ids(3)]), pool="last"),
            job("gen-2", ids(33), 4 if gen else 1, gen_logprobs=True),
        ]
    )
    _until_idle(sched)
    return got, sched


def _until_idle(sched, limit=500):
    for _ in range(limit):
        if sched.idle():
            return
        sched.step()
    raise AssertionError("the scheduler did not finish")


@pytest.mark.parametrize("bad,gen", [(False, True), (True, True), (False, False), (True, False)])
def test_overlap_on_and_off_deliver_the_same(model, bad, gen):
    be = _ref(model)
    backend = _Failing(be) if bad else be

    on, s_on = _run(backend, True, bad, gen)
    off, s_off = _run(backend, False, bad, gen)
    assert on.keys() == off.keys()
    for name in on:
        assert on[name] == off[name], name
    assert on["long-cancelled"] == []
    assert [k for k, _ in on["score"]] == ["prompt", "done"]
    assert [k for k, _ in on["mean"]] == ["pooled", "done"]
    if gen:
        assert [k for k, _ in on["gen"]] == ["token"] * 5 + ["done"]
        assert on["cancel-self"][-1][0] == "token"
        assert len([k for k, _ in on["cancel-self"] if k == "token"]) == 2
    if bad:
        assert on["bad"][0][0] == "error" and "fake fault" in on["bad"][0][1]
    if bad and not gen:  # the forward after the failed one was dropped, its chunks packed again
        assert s_on.dropped == 1 and s_off.dropped == 0
    for s in (s_on, s_off):  # every slot back but the prefix entries'; nothing in flight
        assert s.idle() and s._flight is None and not s.running
        assert s.slots.free_blocks + s.cache.blocks == s.slots.n
        assert s.cache.hits >= 4  # the followers of running sequences and of entries


def test_overlap_numbers_equal_each_prompt_alone(model):
    """The overlapped scheduler's scored rows equal the prompt run alone through the reference
    (a busy batch changes speed, never answers)."""
    got, _ = _run(_ref(model), True)
    rng = np.random.default_rng(3)
    head = rng.integers(1, 199, 30).astype(np.int32)
    rng.integers(1, 199, 24)  # (qa)
    a = np.concatenate([head, rng.integers(1, 199, 10).astype(np.int32)])  # the "score" prompt
    prompt = [v for k, v in got["score"] if k == "prompt"][0]
    st = _ref(model).window_logits(a, 0).astype(np.float64)
    lse = np.log(np.exp(st - st.max(1, keepdims=True)).sum(1)) + st.max(1)
    want = st[np.arange(len(a) - 1), a[1:]] - lse[:-1]
    np.testing.assert_allclose(prompt[1], want, rtol=1e-6, atol=0)  # (kept as f32)


class _Slow:
    """A backend whose launch returns at once and whose wait sleeps (the GPU's time): it
    records the order of launches and waits and how many launches were outstanding."""

    def __init__(self, d: int = 8, sleep: float = 0.01):
        self.log: list[tuple[str, int]] = []
        self.out = self.most = 0
        self.d, self.sleep = d, sleep

    def packed_launch(self, ids, tok, rows, targets, top=0, hidden=None):
        k = sum(1 for e, _ in self.log if e == "launch")
        self.out += 1
        assert self.out <= 2, "two launches outstanding"
        self.most = max(self.most, self.out)
        self.log.append(("launch", k))
        m = len(rows)
        st = np.zeros((m, 4), np.float32)
        res = (st, np.zeros((m, top), np.int32), np.zeros((m, top), np.float32)) if top else st
        if hidden is not None:
            res = (res, np.zeros((len(hidden), self.d), np.float32))
        be = self

        class H:
            def wait(self):
                time.sleep(be.sleep)
                be.out -= 1
                be.log.append(("wait", k))
                return res

        return H()

    def copy_kv(self, src, dst, n):
        pass


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_launch_comes_before_the_previous_wait(overlap):
    be = _Slow()
    sched = Scheduler(be, KV, BUDGET, overlap=overlap)
    rng = np.random.default_rng(0)
    done = []
    jobs = [
        Job(rng.integers(1, 199, 100).astype(np.int32), 0, lambda k, v: done.append(k), pool=p)
        for p in ("last", "mean", "last", "cls", "last", "mean")
    ] + [Job(rng.integers(1, 199, 90).astype(np.int32), 1, lambda k, v: done.append(k))]
    sched.submit(jobs)
    _until_idle(sched)
    assert done.count("done") == len(jobs) and be.out == 0
    launches = [k for e, k in be.log if e == "launch"]
    pos = {e: i for i, e in enumerate(be.log)}
    assert len(launches) >= 10  # 690 tokens at 64 a forward
    before = [pos[("launch", k)] < pos[("wait", k - 1)] for k in launches[1:]]
    if overlap:  # every forward but the first was queued while the one before it ran
        assert all(before) and be.most == 2
    else:
        assert not any(before) and be.most == 1


def test_a_stop_drops_the_forward_in_flight():
    """stop() (and drain()) with a forward in flight: it is waited for, the backend has
    nothing outstanding, the jobs get the shutdown error."""
    be = _Slow()
    sched = Scheduler(be, KV, BUDGET)
    got = []
    sched.submit([Job(np.arange(1, 150, dtype=np.int32), 0, lambda k, v: got.append(k))])
    sched.step()
    assert sched._flight is not None and be.out == 1
    sched.stop()
    assert be.out == 0 and got == ["error"]
