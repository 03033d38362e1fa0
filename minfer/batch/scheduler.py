"""The server's engine thread: continuous batching over the packed forward.

One thread owns the backend and loops; each step is one packed() call (docs/serve.md):

  drop    cancelled sequences (a client that went away): their slots go back
  admit   waiting jobs, first come first served, while their slots can be had (least recently
          used prefix entries are evicted for them); a job whose prompt starts like a prefix
          entry or a running sequence (>= MIN_SHARE tokens) will copy those rows, not compute
  copy    followers whose owner has written the shared rows take them (copy_kv, statistics too)
  pack    one decode token for every generating sequence, then the next prompt tokens of the
          prefilling ones (oldest first) up to max_batch_tokens; segments in slot order (the
          packed layout's rule), padded to a bucket size by repeating the last token
  hand    each row's numbers back: prompt rows' log-probs, new greedy tokens; a finished
          sequence's prompt rows stay in the KV cache as a prefix entry

Pooled jobs (issue 52: embeddings, score, rerank; max_tokens 0 and `pool` set) ride the same
steps: packed(hidden=) hands back their rows' final hidden states (the last row, row 0, or
every row summed for the mean) and, with `lse`, the last row's full-vocabulary logsumexp; no
LM head runs for them otherwise. They get ("pooled", Pooled) before ("done", "length"). A
mean or cls job never copies its head from another (it needs those rows' hidden states); a
pooled job that did copy (a rerank document after its query) is not kept as a prefix entry:
the entry it copied from holds that head.

A request never waits for another's whole completion: a long prompt is cut into chunks and
decode tokens ride along with every chunk. A failing forward (non-finite numbers, a GPU fault)
is retried one sequence at a time, so only the sequences that fail alone get the error.

Overlap (on by default; Scheduler(overlap=False) turns it off): the forward is launched
(minfer.batch.launch: packed_launch) and the step ends without waiting for it; the next step
admits, copies and packs forward N+1 from the state as it will be after N (a prompt's `done`
advances when its chunk is packed), launches it, and only then waits for N and hands its
numbers back, so the GPU has N+1 queued while the host works. What N's numbers decide waits
for them: a sequence in N is never packed for a decode row in N+1 (its token is N's), a
follower copies only rows its owner has had handed (Rows.handed: their statistics travel with
them), slots of sequences that N finishes come free when N is handed, a cancelled sequence
leaves when it is not in flight. A step whose forward in flight gives a token to a sequence
that will decode again hands it before packing (no overlap that step): otherwise a generating
sequence would get a token every other forward. If N fails, N+1 is waited for and dropped
(its prompt chunks packed again later) and N is retried one sequence at a time as above.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from minfer.batch.launch import Ready, launch
from minfer.batch.run import DECODE_BUCKETS
from minfer.batch.schedule import ALIGN, MIN_SHARE, bucket
from minfer.batch.slots import PrefixCache, Rows, SlotMap, blocks, common_prefix, head_key
from minfer.errors import MinferError


@dataclass(eq=False)
class Job:
    """One prompt of a request, as the front hands it over. deliver(kind, value) is called on
    the engine thread: ("prompt", Rows) once the prompt is scored (prompt_stats only),
    ("token", Token) per generated token, then ("done", finish_reason) or ("error", exc)."""

    ids: np.ndarray  # int32 [n]
    max_tokens: int
    deliver: Callable[[str, object], None]
    prompt_stats: bool = False  # every prompt row's log-prob (echo with logprobs)
    top: int = 0  # top log-probs per scored row
    gen_logprobs: bool = False  # each generated token's log-prob
    stop_ids: frozenset = frozenset()
    stop_check: Callable[[list[int]], bool] | None = None  # True: a stop string was met
    stops: tuple = ()  # the stop strings stop_check tests (an engine process rebuilds it)
    pool: str | None = None  # "last" | "mean" | "cls": a pooled job (max_tokens 0)
    lse: bool = False  # pooled: the last row's full-vocabulary logsumexp too
    keep: bool = True  # its prompt rows may stay as a prefix entry
    cancelled: bool = False
    key: int = -1  # its handle in an engine process (minfer.serve.engine_proc)
    t_arrival: float = field(default_factory=time.perf_counter)
    t_admit: float = 0.0
    t_first: float = 0.0

    def footprint(self) -> int:
        return blocks(len(self.ids) + max(self.max_tokens - 1, 0))


@dataclass
class Token:
    id: int
    logprob: float | None
    top_ids: np.ndarray | None  # int32 [k]
    top_lp: np.ndarray | None  # f32 [k]


@dataclass
class Pooled:
    vec: np.ndarray  # f32 [d_model]: the pooled final-normed hidden state
    lse: float | None  # the last row's logsumexp over the vocabulary (Job.lse)


@dataclass(eq=False)
class Seq:
    job: Job
    rows: Rows
    owner: Rows | None = None  # waiting to copy `share` rows from it
    share: int = 0
    gen: list[int] = field(default_factory=list)
    done: bool = False
    shared: int = 0  # rows copied from another (copy_kv)
    pool: np.ndarray | None = None  # f64 [d_model]: the pooled row, or the mean's running sum
    lse: float | None = None

    head: bytes | None = None  # its prompt's head_key (the sharing search's key)


_NONE = np.zeros(0, np.int64)


@dataclass
class Segment:
    seq: Seq
    p0: int  # first position of its tokens in this step
    ids: np.ndarray  # int32 [t]
    rows: np.ndarray  # int64 [m] positions scored (in the sequence)
    targets: np.ndarray  # int64 [m] their next tokens, or -1
    hid: np.ndarray = field(default_factory=lambda: _NONE)  # positions pooled


@dataclass(eq=False)
class Flight:
    """A launched forward: its segments, the backend's handle, what the call asked for."""

    segs: list[Segment]
    handle: object  # .wait() -> packed()'s value
    T: int  # tokens (padding excluded)
    top: int
    hidden: bool
    seqs: set = field(default_factory=set)  # id() of its sequences

    def __post_init__(self):
        self.seqs = {id(g.seq) for g in self.segs}


class Scheduler:
    """backend: packed(ids, tok, rows, targets, top=, hidden=) (and packed_launch, the overlap's:
    minfer.batch.launch) and copy_kv(src, dst, n) over kv_slots slots. metrics: a
    minfer.serve.metrics.Metrics or None. overlap: launch forward N+1 before waiting for N
    (the module docstring); False: each step waits for its own forward."""

    def __init__(
        self,
        backend,
        kv_slots: int,
        max_batch_tokens: int,
        *,
        prefix_cache: bool = True,
        max_entries: int = 4096,
        metrics=None,
        min_share: int = MIN_SHARE,
        overlap: bool = True,
    ):
        self.be = backend
        self.overlap = bool(overlap)
        self._flight: Flight | None = None  # the forward launched and not yet handed
        # the engine thread's device context (CUDA: the runtime's context, current on one
        # thread at a time in pycuda; the CPU reference needs none)
        self.thread_context = getattr(backend, "thread_context", contextlib.nullcontext)
        self.slots = SlotMap(kv_slots)
        self.min_share = max(1, int(min_share))
        self.cache = PrefixCache(max_entries, enabled=prefix_cache, key_len=self.min_share)
        self.budget = int(max_batch_tokens)
        self.metrics = metrics
        self.waiting: deque[Job] = deque()
        self.running: list[Seq] = []
        self._heads: dict[bytes, list[Seq]] = {}  # running sequences by head_key (_owner's index)
        self.cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.step_tokens = 0
        self.dropped = 0  # forwards launched and dropped (drain: after a failure, at a stop)
        self._t_done = 0.0  # (the time waiting for and handing forwards, in the step under way)

    # -- the front's side (any thread) -----------------------------------------------------
    @property
    def capacity_blocks(self) -> int:
        return self.slots.n

    def queued(self) -> int:
        return len(self.waiting)

    def submit(self, jobs: list[Job]) -> None:
        with self.cv:
            self.waiting.extend(jobs)
            self.cv.notify()
        if self.metrics:
            self.metrics.queue_depth.set(len(self.waiting))

    def cancel(self, jobs) -> None:
        for j in jobs:
            j.cancelled = True
        with self.cv:
            self.cv.notify()

    def idle(self) -> bool:
        return not self.waiting and not self.running and self._flight is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="minfer-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop after the step in flight; jobs left get an error."""
        with self.cv:
            self._stop = True
            self.cv.notify()
        if self._thread is not None:
            self._thread.join()  # (the loop dropped its forward in flight)
        elif self._flight is not None:  # stepped by the caller (minfer.batch.jobs)
            with self.thread_context():
                self.drain()
        for j in list(self.waiting) + [s.job for s in self.running]:
            _send(j, "error", MinferError("the server is shutting down"))
        self.waiting.clear()
        self.running.clear()
        self._heads.clear()

    # -- the engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        with self.thread_context():
            self._serve()

    def _serve(self) -> None:
        while True:
            t0 = time.perf_counter()
            with self.cv:
                while not self._stop and self.idle():
                    self.cv.wait()
                if self._stop:
                    self.drain()
                    return
            self._phase("idle", t0)
            try:
                if not self.step():
                    t0 = time.perf_counter()
                    with self.cv:
                        self.cv.wait(0.01)
                    self._phase("idle", t0)
            except Exception as e:  # a bug: fail what is in flight, keep serving
                err = MinferError(f"internal error in the engine step ({type(e).__name__}: {e})")
                self.drain()
                for s in list(self.running):
                    self._finish(s, None, err)
                with self.cv:
                    jobs = list(self.waiting)
                    self.waiting.clear()
                for j in jobs:
                    _send(j, "error", err)

    def step(self) -> bool:
        """One scheduling step: at most one forward launched, at most one handed (overlap: the
        one launched by the step before); False when nothing ran or was handed."""
        t0, self._t_done = time.perf_counter(), 0.0
        handed = False
        if self._flight is not None and self._decodes_next(self._flight):
            self._complete(self._take())  # its tokens first: they are the next decode rows
            handed = True
        for s in [s for s in self.running if s.job.cancelled and not self._in_flight(s)]:
            self._finish(s, None, None)
        self._admit()
        self._copy()
        segs = self._pack()
        nxt = self._launch(segs) if segs else None
        self._gauges()
        prev, self._flight = self._take(), nxt
        if not self.overlap:
            prev = self._take()
        if prev is not None:
            self._complete(prev)
            self._gauges()  # after too: the last step before idling must not leave them stale
            handed = True
        self._phase("schedule", t0 + self._t_done)
        return handed or nxt is not None

    def drain(self) -> None:
        """The forward in flight waited for and dropped (its prompt chunks packed again by a
        later step), so the backend has nothing outstanding (a stop, an engine error, a
        caller that leaves with jobs unfinished)."""
        f = self._take()
        if f is None:
            return
        with contextlib.suppress(Exception):
            f.handle.wait()
        self.dropped += 1
        for g in f.segs:
            r = g.seq.rows
            if g.p0 < len(r.ids):
                r.done = min(r.done, g.p0)

    def _take(self) -> Flight | None:
        f, self._flight = self._flight, None
        return f

    def _in_flight(self, s: Seq) -> bool:
        return self._flight is not None and id(s) in self._flight.seqs

    @staticmethod
    def _decodes_next(f: Flight) -> bool:
        """Whether f gives a token to a sequence that will then need a decode row."""
        for g in f.segs:
            s, job = g.seq, g.seq.job
            n = len(s.rows.ids)
            if (
                job.max_tokens > len(s.gen) + 1
                and g.p0 + len(g.ids) >= n
                and not job.cancelled
                and not s.done
            ):
                return True
        return False

    def _phase(self, name: str, t0: float) -> float:
        """The engine thread's time since t0 counted under name; -> now."""
        t = time.perf_counter()
        if self.metrics:
            self.metrics.engine_time.labels(name).inc(t - t0)
        return t

    def _timed(self, name: str, t0: float) -> float:
        """_phase, and the time counted in this step's _t_done (not "schedule"); -> now."""
        t = self._phase(name, t0)
        self._t_done += t - t0
        return t

    def _gauges(self) -> None:
        if self.metrics:
            self.metrics.queue_depth.set(len(self.waiting))
            self.metrics.running.set(len(self.running))

    def _admit(self) -> None:
        while True:
            with self.cv:
                while self.waiting and self.waiting[0].cancelled:
                    self.waiting.popleft()
                if not self.waiting:
                    return
                job = self.waiting[0]
            key = head_key(job.ids, self.min_share)  # (None: too short to share min_share)
            owner, share = self._owner(job, key)
            if owner is not None:
                owner.pins += 1
            base = self._alloc(job.footprint())
            if base is None:
                if owner is not None:
                    owner.pins -= 1
                return  # first come first served: the head waits for slots
            with self.cv:
                self.waiting.popleft()
            job.t_admit = time.perf_counter()
            rows = Rows(job.ids, base, job.footprint())
            if job.prompt_stats:
                rows.alloc_stats(job.top)
            seq = Seq(job, rows, owner, share, head=key)
            self.running.append(seq)
            if key is not None:
                self._heads.setdefault(key, []).append(seq)
            if self.metrics:
                self.metrics.queue_time.observe(job.t_admit - job.t_arrival)

    def _owner(self, job: Job, key: bytes | None) -> tuple[Rows | None, int]:
        """The rows to copy a prompt's head from (a prefix entry or a running sequence's prompt)
        and how many: all shared tokens but the prompt's last (its logits are needed), one
        fewer when its prompt rows are scored (the owner's row share - 1 predicts the same
        next token); statistics are shared only from an owner that kept as many top ids."""
        n = len(job.ids)
        if job.pool in ("mean", "cls"):  # every row's (row 0's) hidden state is needed
            return None, 0
        if key is None:  # (job's head_key)
            return None, 0
        cands = self.cache.with_head(key) + [s.rows for s in self._heads.get(key, ())]
        best, best_n = None, 0
        for r in cands:
            if r.freed or (job.prompt_stats and r.top < job.top):
                continue
            c = common_prefix(r.ids, job.ids)
            if c > best_n:
                best, best_n = r, c
        share = min(best_n - (1 if job.prompt_stats else 0), n - 1)
        if best is None or share < self.min_share:
            return None, 0
        if id(best) in self.cache.entries:
            self.cache.entries.move_to_end(id(best))
        return best, share

    def _alloc(self, nblk: int) -> int | None:
        while True:
            base = self.slots.alloc(nblk)
            if base is not None:
                return base
            if not self._evict():
                return None

    def _evict(self) -> bool:
        """The least recently used prefix entry out and its blocks back (False: none could go)."""
        e = self.cache.evict()
        if e is not None:
            self._free(e)
        return e is not None

    def _free(self, rows: Rows) -> None:
        if not rows.freed:
            self.slots.release(rows.base, rows.nblk)
            rows.freed = True

    def _copy(self) -> None:
        for s in self.running:
            o = s.owner
            if o is None:
                continue
            if o.freed:  # the owner went away before its rows were written: compute them
                o.pins -= 1
                s.owner, s.share = None, 0
            elif o.handed >= s.share:
                self.be.copy_kv(o.base, s.rows.base, s.share)
                r, k = s.rows, s.share
                if r.top >= 0:  # rows 0..k-1 predict the same tokens as the owner's
                    r.argmax[:k], r.logprob[:k] = o.argmax[:k], o.logprob[:k]
                    r.top_ids[:k], r.top_lp[:k] = o.top_ids[:k, : r.top], o.top_lp[:k, : r.top]
                r.done = r.handed = k
                s.shared = k
                o.pins -= 1
                s.owner = None
                self.cache.hits += 1
                self.cache.hit_tokens += k
                if self.metrics:
                    self.metrics.prefix_hits.inc()
                    self.metrics.prefix_hit_tokens.inc(k)

    def _pack(self) -> list[Segment]:
        segs, budget = [], self.budget
        f = self._flight  # (its sequences' next tokens are not known yet)
        for s in self.running:  # decode tokens first: each costs one row
            if (
                budget
                and s.gen
                and not s.done
                and s.owner is None
                and not s.job.cancelled
                and (f is None or id(s) not in f.seqs)
            ):
                n = len(s.rows.ids)
                segs.append(
                    Segment(
                        s,
                        n + len(s.gen) - 1,
                        np.array(s.gen[-1:], np.int32),
                        np.array([n + len(s.gen) - 1]),
                        np.array([-1]),
                    )
                )
                budget -= 1
        for s in self.running:  # then prompt tokens, oldest sequence first
            r = s.rows
            n = len(r.ids)
            if not budget or s.done or s.owner is not None or r.done >= n or s.job.cancelled:
                continue
            p0, p1 = r.done, min(n, r.done + budget)
            rows, tg = _NONE, _NONE
            if s.job.prompt_stats:
                rows = np.arange(p0, min(p1, n - 1))
                tg = r.ids[p0 + 1 : p0 + 1 + len(rows)].astype(np.int64)
            if p1 == n and (s.job.max_tokens > 0 or s.job.lse):
                rows, tg = np.append(rows, n - 1), np.append(tg, -1)
            pool = s.job.pool
            hid = (
                np.arange(p0, p1)
                if pool == "mean"
                else np.array([0])
                if pool == "cls" and p0 == 0
                else np.array([n - 1])
                if pool == "last" and p1 == n
                else _NONE
            )
            segs.append(Segment(s, p0, r.ids[p0:p1], rows, tg, hid))
            r.done = p1  # (packed: the next step packs on from there)
            budget -= p1 - p0
        segs.sort(key=lambda g: g.seq.rows.base)
        return segs

    def _launch(self, segs: list[Segment]) -> Flight:
        """packed_launch() over segs (a launch that fails at once: its error at the wait)."""
        ids = np.concatenate([g.ids for g in segs])
        T = len(ids)
        n = np.fromiter((len(g.ids) for g in segs), np.int64, len(segs))
        off = np.cumsum(n) - n  # each segment's first row in this call
        base = np.fromiter((g.seq.rows.base for g in segs), np.int64, len(segs))
        p0 = np.fromiter((g.p0 for g in segs), np.int64, len(segs))
        tok = np.empty((T, 2), np.int32)  # a row's (slot, its sequence's first slot)
        tok[:, 0] = np.arange(T) + np.repeat(base + p0 - off, n)
        tok[:, 1] = np.repeat(base, n)
        shift = (off - p0).tolist()  # positions -> rows of this call
        rows = np.concatenate([g.rows + d for g, d in zip(segs, shift)]).astype(np.int32)
        tg = np.concatenate([g.targets for g in segs]).astype(np.int32)
        hid = np.concatenate([g.hid + d for g, d in zip(segs, shift)]).astype(np.int32)
        pad = bucket(T, DECODE_BUCKETS, self.budget) - T if T < self.budget else 0
        if pad > 0:  # the padding repeats the last token: same slot, same values
            ids = np.concatenate([ids, np.repeat(ids[-1:], pad)])
            tok = np.concatenate([tok, np.repeat(tok[-1:], pad, axis=0)])
        top = max((g.seq.job.top if g.seq.job.prompt_stats else 0) for g in segs)
        top = max(top, max((max(g.seq.job.top, 1) if g.seq.job.gen_logprobs else 0) for g in segs))
        kw = {"hidden": hid} if len(hid) else {}  # (plain backends: no kw)
        t0 = time.perf_counter()
        try:  # (a host backend computes here: the launch counts as "forward" too)
            handle = launch(self.be, ids, tok, rows, tg, top=top, **kw)
        except MinferError as e:
            handle = Ready(error=e)
        finally:
            self._timed("forward", t0)
        return Flight(segs, handle, T, top, bool(len(hid)))

    def _result(self, f: Flight):
        """f's numbers, waited for (counted as "forward") -> (stats [m, 4], top ids
        [m, k] | None, top lp | None, hidden f32 [h, d_model] of the segments' hid rows |
        None)."""
        t0 = time.perf_counter()
        try:
            out = f.handle.wait()
        finally:
            self._timed("forward", t0)
        h = None
        if f.hidden:
            out, h = out
        if self.metrics:
            self.metrics.tokens_per_forward.observe(f.T)
        self.steps += 1
        self.step_tokens += f.T
        return (*(out if f.top else (out, None, None)), h)

    def _complete(self, f: Flight) -> None:
        """Wait for f and hand its numbers back. If it failed: the forward launched after it
        (overlap) is waited for and dropped, and f's sequences run again one at a time, so
        only those that fail alone get the error."""
        segs = f.segs
        try:
            results = [(segs, self._result(f))]
        except MinferError as e:
            self.drain()
            if len(segs) == 1:
                self._finish(segs[0].seq, None, e)
                return
            results = []
            for g in segs:  # alone, each sequence either runs or gets the error
                if g.seq.done:
                    continue
                try:
                    results.append(([g], self._result(self._launch([g]))))
                except MinferError as e1:
                    self._finish(g.seq, None, e1)
        t0 = time.perf_counter()
        for gs, (st, ti, tl, h) in results:
            i = j = 0
            for g in gs:
                if g.seq.done:  # (gone meanwhile: nothing to hand it)
                    i += len(g.rows)
                    j += len(g.hid)
                    continue
                if len(g.hid):
                    self._pool(g.seq, h[j : j + len(g.hid)])
                self._hand(g, st, ti, tl, i)
                i += len(g.rows)
                j += len(g.hid)
        self._timed("hand", t0)

    def _pool(self, s: Seq, h: np.ndarray) -> None:
        """A pooled job's hidden rows h f32 [k, d_model] of this step: summed (mean) or kept."""
        if s.job.pool == "mean":
            acc = h.sum(axis=0, dtype=np.float64)
            s.pool = acc if s.pool is None else s.pool + acc
        else:
            s.pool = h[-1].astype(np.float64)

    def _hand(self, g: Segment, st, ti, tl, i: int) -> None:
        s, r, job = g.seq, g.seq.rows, g.seq.job
        n, m = len(r.ids), len(g.rows)
        prefill = g.p0 < n
        # scored prompt rows (< n - 1): a leading run p0, p0 + 1, ... of a prefill segment's
        # rows (_pack), at the call's rows i, i + 1, ...: handed over as slices
        k = int(np.searchsorted(g.rows, n - 1)) if prefill else 0
        if k:
            a = int(g.rows[0])
            ps, rs = slice(a, a + k), slice(i, i + k)
            r.argmax[ps] = st[rs, 0]  # (f32 ids, exact: cast on assignment)
            r.logprob[ps] = st[rs, 2]
            if r.top > 0:
                r.top_ids[ps], r.top_lp[ps] = ti[rs, : r.top], tl[rs, : r.top]
        new = list(range(i + k, i + m))  # rows giving a new id: a prompt's last, a decode row
        if prefill:  # the prompt's numbers go out before its first token
            r.handed = g.p0 + len(g.ids)
            if r.handed == n and job.prompt_stats:
                _send(job, "prompt", r)
        kk = max(job.top, 1)
        if job.max_tokens == 0:  # a pooled job's last row: its logsumexp, no token
            if new:
                s.lse = float(st[new[-1], 3])
            new = []
        for row in new:
            lp = job.gen_logprobs
            self._token(
                s,
                Token(
                    int(st[row, 0]),
                    float(tl[row, 0]) if lp else None,
                    ti[row, :kk].copy() if lp and job.top else None,
                    tl[row, :kk].copy() if lp and job.top else None,
                ),
            )
        if prefill and r.handed == n and job.max_tokens == 0:
            if job.pool:
                vec = s.pool / n if job.pool == "mean" else s.pool
                _send(job, "pooled", Pooled(vec.astype(np.float32), s.lse))
            self._finish(s, "length", None)

    def _token(self, s: Seq, t: Token) -> None:
        job = s.job
        if not s.gen:
            job.t_first = time.perf_counter()
            if self.metrics:
                self.metrics.prefill_time.observe(job.t_first - job.t_admit)
        s.gen.append(t.id)
        _send(job, "token", t)
        if t.id in job.stop_ids or (job.stop_check is not None and job.stop_check(s.gen)):
            self._finish(s, "stop", None)
        elif len(s.gen) >= job.max_tokens:
            self._finish(s, "length", None)

    def _finish(self, s: Seq, reason: str | None, err: Exception | None) -> None:
        """A sequence leaves: its answer (or error) sent, its prompt rows kept as a prefix
        entry when whole, its other slots back."""
        if s.done:
            return
        s.done = True
        self.running.remove(s)
        if s.head is not None:
            same = self._heads[s.head]
            same.remove(s)
            if not same:
                del self._heads[s.head]
        if s.owner is not None:
            s.owner.pins -= 1
        if err is not None:
            _send(s.job, "error", err)
        elif reason is not None and not s.job.cancelled:
            if self.metrics and s.job.t_first:
                self.metrics.decode_time.observe(time.perf_counter() - s.job.t_first)
            _send(s.job, "done", reason)
        r = s.rows
        keep = (
            err is None
            and r.handed == len(r.ids)
            and not r.freed
            and s.job.keep
            and not (s.job.pool and s.shared)
        )  # (a follower: its owner's entry holds the head)
        if keep:
            need = blocks(len(r.ids))
            if need < r.nblk:  # the generated tokens' blocks go back now
                self.slots.release(r.base + need * ALIGN, r.nblk - need)
                r.nblk = need
            keep = self.cache.add(r)
        if not keep:
            self._free(r)
        while self.cache.over() and self._evict():
            pass


def _send(job: Job, kind: str, value) -> None:
    try:
        job.deliver(kind, value)
    except Exception:  # a front that went away must not stop the engine
        pass
