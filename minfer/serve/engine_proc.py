"""`minfer serve --engine process` (the default): the engine in a process of its own, as vLLM's
EngineCore, the HTTP side in the parent (docs/serve.md, "Process layout").

Why: in one interpreter the engine thread and the event loop fight over the GIL; the engine
waits to win it back after each driver call of a forward, and under load the GPU idled ~40 %
of the time (docs/perf.md, "Serving"). Here each has its own GIL.

The child (spawned: CUDA is never initialised in the parent) loads the Engine, prepares it and
runs the Scheduler as start.build_state does in thread mode. The pipes carry:

  parent -> child   lists of commands (all that one iteration of the server's event loop
                    gathered): ("submit", [spec]) with a spec a job's plain fields and its
                    key (the stop strings, not the closure: the child rebuilds stop_check),
                    ("cancel", [key]), ("stop",)
  child -> parent   first ("ready", info) or ("error", exc); then one message a step: the
                    step's (key, kind, value) events and metric operations (key None), with
                    the counts /metrics and the queue-full check read

Each message is one pickle (protocol 5) in Connection.send_bytes' frame. In the parent both
pipes are served by the server's event loop itself (EngineProcess.attach: non-blocking reads
and writes), so a step's events cost one wake-up of the loop and no thread hand-off.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import pickle
import select
import signal
import struct
import sys
import threading

import numpy as np

from minfer.batch.scheduler import Job, Scheduler
from minfer.batch.slots import Rows
from minfer.errors import MinferError, ResourceError

PROTO = 5
_NO_IDS = np.zeros(0, np.int32)


# -- the parent's side ---------------------------------------------------------------------------
class EngineShell:
    """What the HTTP side reads of an Engine (app.py, pooling.py): the GGUF opened by the
    loader (header parsed, tensors memory-mapped and never read but /v1/score's label rows),
    its tokenizer, and what the child reported (kind, KV slots, ubatch)."""

    def __init__(self, model):
        from minfer.text.tokenizer import Tokenizer

        self.model = model
        self.tok = Tokenizer.from_metadata(model.metadata)
        self.kind, self.kv_slots, self.ubatch = "?", 0, 0


class _Slots:
    def __init__(self, n: int):
        self.n = n


class _CacheView:
    """The child's prefix cache as /metrics reads it (len, blocks), from its last message."""

    def __init__(self):
        self.n, self.blocks = 0, 0

    def __len__(self) -> int:
        return self.n


class EngineProcess:
    """The child's handle, with the Scheduler interface app.py and pooling.py use (submit,
    cancel, queued, capacity_blocks, slots.n, cache, start, stop, steps, step_tokens).

    Its pipe I/O runs on the server's event loop (attach), as the requests do: the commands
    a loop iteration gathered leave as one message, written without blocking (the rest when
    the pipe has room: a burst of 256 clients' 128-token prompts, ~150 KB, outgrows its
    64 KB); the child's messages are read when the pipe is readable and their events go to
    the requests' queues directly. No thread of this process shares the GIL with the loop,
    and nothing wakes one per request. Before attach (loading) and after the loop ends
    (stop), commands are written blocking.

    queued() counts in the parent: jobs submitted minus those the child reported gone from
    its waiting queue (admitted, dropped cancelled, failed) with its last message. A job on
    its way through the pipe counts as queued, so the count errs high by at most a step's
    admissions, never low.

    dead: None, or why the child is gone while serving: every live job got the error, /health
    says so, on_death() (start.run's) stops the server."""

    on_loop = True  # (app._Run: events are delivered on the loop, into the request's queue)

    def __init__(self, kw: dict, metrics):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # fork would copy a CUDA context; the parent has none
        self._cmd_r, self._cmd = ctx.Pipe(duplex=False)
        self._ev, self._ev_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=child_main,
            args=(self._cmd_r, self._ev_w, kw, os.getpid()),
            name="minfer-engine",
            daemon=True,
        )
        self.proc.start()
        self._cmd_r.close()  # only the child's copies left open: its death is EOF here
        self._ev_w.close()
        self.metrics = metrics
        self.jobs: dict[int, Job] = {}
        self._keys = itertools.count()
        self.submitted = 0
        self.left = 0  # jobs the child reported gone from its waiting queue
        self.steps = self.step_tokens = 0
        self.cache = _CacheView()
        self.slots = _Slots(0)
        self.dead: str | None = None
        self.stopping = False
        self.on_death = lambda: None
        self.loop = None  # the event loop the pipes are served on (attach)
        self._cmds: list[tuple] = []  # commands gathered in this loop iteration (_post)
        self._out = bytearray()  # framed commands the pipe had no room for yet
        self._in = bytearray()  # the child's bytes not yet a whole message
        self._m: dict = {}  # (name, labels) -> the parent's collector

    def wait_ready(self) -> dict:
        """The child's ("ready", info), or its load error raised here (MinferError)."""
        try:
            msg = pickle.loads(self._ev.recv_bytes())
        except (EOFError, OSError):
            raise ResourceError(
                f"the engine process died while loading the model ({self._exit()})"
            ) from None
        if msg[0] == "error":
            self.proc.join(10)
            raise msg[1]
        info = msg[1]
        self.slots = _Slots(info["capacity_blocks"])
        return info

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

    def _exit(self) -> str:
        self.proc.join(5)
        c = self.proc.exitcode
        if c is None:
            return "it stopped answering"
        if c < 0:
            name = signal.Signals(-c).name if -c in signal.valid_signals() else str(-c)
            oom = "; out of memory? the kernel's OOM killer sends it" if c == -9 else ""
            return f"killed by {name}{oom}"
        return f"exit code {c}"

    # -- Scheduler's interface (the event loop) -----------------------------------------------
    @property
    def capacity_blocks(self) -> int:
        return self.slots.n

    def queued(self) -> int:
        return self.submitted - self.left

    def idle(self) -> bool:
        return not self.jobs

    def submit(self, jobs: list[Job]) -> None:
        if self.dead is None:
            for j in jobs:
                j.key = k = next(self._keys)
                self.jobs[k] = j
            self.submitted += len(jobs)
            self._post(("submit", [_spec(j) for j in jobs]))
            return
        for j in jobs:
            _send(j, "error", MinferError(self.dead))

    def cancel(self, jobs) -> None:
        keys = [j.key for j in jobs if self.jobs.pop(j.key, None) is not None]
        for j in jobs:
            j.cancelled = True
        if keys and self.dead is None:
            self._post(("cancel", keys))

    def start(self) -> None:
        """(The pipes start being served when the server's loop exists: attach.)"""

    def attach(self, loop) -> None:
        """Serve the pipes on loop (the server's, from its startup on): the child's messages
        read as they come, commands written as the pipe takes them."""
        self.loop = loop
        os.set_blocking(self._cmd.fileno(), False)
        os.set_blocking(self._ev.fileno(), False)
        loop.add_reader(self._ev.fileno(), self._on_readable)

    def _post(self, cmd: tuple) -> None:
        """cmd on its way to the child: what a loop iteration gathers leaves as one message."""
        self._cmds.append(cmd)
        if self.loop is None or not self.loop.is_running():  # loading, or the loop ended
            self._flush(blocking=True)
        elif len(self._cmds) == 1:
            self.loop.call_soon(self._flush)

    def _flush(self, blocking: bool = False) -> None:
        if self._cmds:
            data = pickle.dumps(self._cmds, PROTO)
            self._cmds = []
            self._out += _frame(data)
        try:
            if blocking:
                if self.loop is not None:
                    self.loop.remove_writer(self._cmd.fileno())
                while self._out:
                    select.select([], [self._cmd.fileno()], [])
                    self._write_some()
            else:
                self._write_some()
                if self._out:
                    self.loop.add_writer(self._cmd.fileno(), self._flush)
                else:
                    self.loop.remove_writer(self._cmd.fileno())
        except OSError:  # the child is gone: the reader's EOF fails the live jobs, says why
            self._out.clear()
            if self.loop is not None:
                self.loop.remove_writer(self._cmd.fileno())

    def _write_some(self) -> None:
        try:
            n = os.write(self._cmd.fileno(), self._out)
        except BlockingIOError:
            return
        del self._out[:n]

    def stop(self) -> None:
        """The child ends after the step in flight (jobs left get an error) and is reaped.
        (After the loop has ended, or before it ran.)"""
        self.stopping = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self._ev.fileno())
        self._post(("stop",))  # (blocking: the loop is not running)
        self.proc.join(30)
        self.kill()

    # -- the child's messages (the event loop) ------------------------------------------------
    def _on_readable(self) -> None:
        fd, eof = self._ev.fileno(), False
        while True:
            try:
                b = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                b = b""
            if not b:
                eof = True
                break
            self._in += b
        for data in _frames(self._in):
            self._message(pickle.loads(data))
        if eof:
            self.loop.remove_reader(fd)
            self._gone()

    def _message(self, msg) -> None:
        stats, items = msg
        got, self.cache.n, self.cache.blocks, self.steps, self.step_tokens = stats
        jobs = self.jobs
        for key, kind, value in items:
            if key is None:
                self._metric(kind, value)
                continue
            j = jobs.get(key)
            if j is None:  # cancelled in the parent: nobody waits for it
                continue
            if kind == "done" or kind == "error":
                jobs.pop(key, None)
            _send(j, kind, value)
        self.left = got  # after the events: a job is queued until its admission is seen

    def _gone(self) -> None:
        why = (
            "the server is shutting down"
            if self.stopping
            else f"the engine process died ({self._exit()})"
        )
        self.dead = None if self.stopping else why
        jobs, self.jobs = self.jobs, {}
        for j in jobs.values():
            _send(j, "error", MinferError(why))
        if not self.stopping:
            self.on_death()

    def _metric(self, op: str, value) -> None:
        name, labels, v = value
        m = self._m.get((name, labels))
        if m is None:
            m = getattr(self.metrics, name)
            m = self._m[(name, labels)] = m.labels(*labels) if labels else m
        getattr(m, op)(v)


def _frame(data: bytes) -> bytes:
    """data framed as multiprocessing's Connection.send_bytes frames it (recv_bytes reads it):
    a signed big-endian 4-byte length, or -1 and an 8-byte length past 2**31 - 1."""
    n = len(data)
    head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return head + data


def _frames(buf: bytearray):
    """The whole messages at buf's start, taken out of it (Connection.send_bytes' frames)."""
    while len(buf) >= 4:
        (n,) = struct.unpack_from("!i", buf)
        h = 4
        if n == -1:
            if len(buf) < 12:
                return
            (n,) = struct.unpack_from("!Q", buf, 4)
            h = 12
        if len(buf) < h + n:
            return
        data = bytes(buf[h : h + n])
        del buf[: h + n]
        yield data


def _spec(j: Job) -> tuple:
    return (
        j.key,
        j.ids,
        j.max_tokens,
        j.prompt_stats,
        j.top,
        j.gen_logprobs,
        tuple(j.stop_ids),
        tuple(j.stops),
        j.pool,
        j.lse,
        j.keep,
        j.t_arrival,  # perf_counter is CLOCK_MONOTONIC: one clock for both processes (Linux)
    )


def _send(job: Job, kind: str, value) -> None:
    try:
        job.deliver(kind, value)
    except Exception:  # a front that went away must not stop the reader
        pass


# -- the child -----------------------------------------------------------------------------------
class _Outbox:
    """Events and metric operations on their way to the parent. Posted by any thread of the
    child; handed to the sender thread by flush() only, at the end of each step and before the
    engine thread waits for work, so a step's events leave as one message. The sender pickles
    and writes outside the engine thread (a slow parent never stalls a forward)."""

    def __init__(self, conn):
        self.conn = conn
        self.cv = threading.Condition()
        self.pending: list = []
        self.ready: list = []
        self.stats = (0, 0, 0, 0, 0)
        self.closed = False
        self.received = 0  # jobs the command reader handed to the scheduler
        self._thread = threading.Thread(target=self._run, name="minfer-sender", daemon=True)

    def post(self, item) -> None:
        with self.cv:
            self.pending.append(item)

    def flush(self, stats) -> None:
        with self.cv:
            self.stats = stats
            if self.pending:
                self.ready += self.pending
                self.pending = []
                self.cv.notify()

    def start(self) -> None:
        self._thread.start()

    def close(self, stats) -> None:
        self.flush(stats)
        with self.cv:
            self.closed = True
            self.cv.notify()
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.ready and not self.closed:
                    self.cv.wait()
                items, self.ready = self.ready, []
                stats, closed = self.stats, self.closed
            if items:
                try:
                    self.conn.send_bytes(pickle.dumps((stats, items), PROTO))
                except OSError:  # the parent is gone (the kernel ends this process too)
                    return
            elif closed:
                return


class _Rec:
    """A metric operation recorder: what Scheduler calls on a prometheus collector (labels,
    inc, set, observe), posted as (None, op, (name, labels, value)) for the parent's Metrics."""

    __slots__ = ("box", "name", "lab")

    def __init__(self, box: _Outbox, name: str, lab: tuple = ()):
        self.box, self.name, self.lab = box, name, lab

    def labels(self, *lab) -> _Rec:
        return _Rec(self.box, self.name, tuple(lab))

    def inc(self, v=1) -> None:
        self.box.post((None, "inc", (self.name, self.lab, v)))

    def set(self, v) -> None:
        self.box.post((None, "set", (self.name, self.lab, v)))

    def observe(self, v) -> None:
        self.box.post((None, "observe", (self.name, self.lab, v)))


class Recorder:
    """Stands for minfer.serve.metrics.Metrics in the child: any attribute is a _Rec."""

    def __init__(self, box: _Outbox):
        self._box = box

    def __getattr__(self, name: str) -> _Rec:
        r = _Rec(self._box, name)
        setattr(self, name, r)  # (once a name)
        return r


class _FlushingCondition(threading.Condition):
    """The scheduler's condition: the engine thread flushes the outbox before it waits for
    work (events of an idle moment, a failed step's errors, leave then)."""

    def __init__(self, flush):
        super().__init__()
        self._flush = flush

    def wait(self, timeout=None):
        self._flush()
        return super().wait(timeout)


class _ChildScheduler(Scheduler):
    def __init__(self, *a, box: _Outbox, **kw):
        super().__init__(*a, metrics=Recorder(box), **kw)
        self.box = box
        self.cv = _FlushingCondition(lambda: box.flush(self.stats()))

    def stats(self) -> tuple:
        """(jobs gone from the waiting queue, prefix entries, their blocks, steps, tokens)."""
        got = self.box.received - len(self.waiting)
        return (got, len(self.cache), self.cache.blocks, self.steps, self.step_tokens)

    def step(self) -> bool:
        try:
            return super().step()
        finally:
            self.box.flush(self.stats())


def portable(e: BaseException) -> MinferError:
    """e as an exception that crosses the pipe: itself when it pickles back to its type, else
    a MinferError of its message (a subclass whose constructor takes other arguments)."""
    if isinstance(e, MemoryError):
        return ResourceError("out of host memory in the engine process")
    if not isinstance(e, MinferError):
        return MinferError(f"internal error in the engine process ({type(e).__name__}: {e})")
    try:
        back = pickle.loads(pickle.dumps(e, PROTO))
        if type(back) is type(e) and str(back) == str(e):
            return e
    except Exception:
        pass
    return MinferError(str(e))


def _die_with(ppid: int) -> None:
    """Linux: SIGKILL this process when the parent goes (PR_SET_PDEATHSIG), whatever the
    parent died of; a parent gone before this call is seen by getppid."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != ppid:
        os._exit(1)


def child_main(cmd, ev, kw: dict, ppid: int) -> None:
    """The engine process: load, say ready, then serve the parent's commands until ("stop",)
    or the parent's end of the pipe closes."""
    _die_with(ppid)
    # a terminal's Ctrl-C or hangup reaches the whole process group: the parent decides
    # (drains, then stops this process). SIGTERM kills (minfer.__main__, imported here by the
    # spawn as __mp_main__, made it raise).
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:  # tqdm's default lock is a multiprocessing semaphore: a child killed holding one
        # makes the resource tracker warn on stderr at the parent's exit (a second line)
        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
    except ImportError:
        pass
    from minfer.serve.engine_load import SWITCH_S, load_engine

    # the engine thread shares this interpreter with the command reader and the sender
    sys.setswitchinterval(SWITCH_S)
    try:
        eng, n_ctx = load_engine(**kw["engine"])
        box = _Outbox(ev)
        sched = _ChildScheduler(
            eng.backend,
            eng.kv_slots,
            eng.ubatch,
            prefix_cache=kw["prefix_cache"],
            overlap=kw.get("overlap", True),
            box=box,
        )
    except BaseException as e:
        ev.send_bytes(pickle.dumps(("error", portable(e)), PROTO))
        sys.exit(getattr(e, "exit_code", 1))
    info = {
        "kind": eng.kind,
        "kv_slots": eng.kv_slots,
        "ubatch": eng.ubatch,
        "n_ctx": n_ctx,
        "capacity_blocks": sched.capacity_blocks,
    }
    ev.send_bytes(pickle.dumps(("ready", info), PROTO))
    box.start()
    sched.start()
    _commands(cmd, sched, box, eng.tok)
    sched.stop()  # jobs left get "the server is shutting down"
    box.close(sched.stats())


def _commands(cmd, sched: _ChildScheduler, box: _Outbox, tok) -> None:
    from minfer.serve.protocol import stop_checker

    live: dict[int, Job] = {}
    while True:
        try:
            msgs = pickle.loads(cmd.recv_bytes())  # a list of commands, in their order
        except (EOFError, OSError):  # the parent is gone
            return
        for msg in msgs:
            if msg[0] == "submit":
                jobs = [_job(s, live, box, tok, stop_checker) for s in msg[1]]
                sched.submit(jobs)
                box.received += len(jobs)  # after: a job counts as gone once it was waiting
            elif msg[0] == "cancel":
                sched.cancel([live.pop(k) for k in msg[1] if k in live])
            else:
                return


def _job(spec, live: dict, box: _Outbox, tok, stop_checker) -> Job:
    key, ids, mt, ps, top, glp, stop_ids, stops, pool, lse, keep, t_arr = spec

    def deliver(kind: str, value) -> None:
        if kind == "prompt":  # the statistics only: ids and slots stay here
            value = Rows(_NO_IDS, 0, 0, value.done, value.top, value.argmax, value.logprob,
                         value.top_ids, value.top_lp)  # fmt: skip
        elif kind == "done" or kind == "error":
            live.pop(key, None)
            if kind == "error":
                value = portable(value)
        box.post((key, kind, value))

    j = Job(
        ids,
        mt,
        deliver,
        prompt_stats=ps,
        top=top,
        gen_logprobs=glp,
        stop_ids=frozenset(stop_ids),
        stop_check=stop_checker(tok, stops),
        stops=stops,
        pool=pool,
        lse=lse,
        keep=keep,
        t_arrival=t_arr,
        key=key,
    )
    live[key] = j
    return j
