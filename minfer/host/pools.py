"""A process pool that is never left half-started.

multiprocessing.Pool() forks its workers, then starts three threads. When a fork or a thread
fails halfway (`Cannot allocate memory`, `can't start new thread`: a tight `ulimit -v`), the
constructor raises with workers already running, and its worker-handler thread alive,
re-forking any that die. minfer's workers ignore SIGTERM (minfer.host.signals.ignore_in_worker),
so Pool's own cleanup (terminate, then join) and the interpreter's exit would wait on them
forever. start_pool stops the handler first, then kills the workers (they hold no task yet).
Uses Pool's private attributes (_pool, _worker_handler, _change_notifier), as of CPython 3.11.
"""

from __future__ import annotations

from multiprocessing.pool import TERMINATE, Pool


class _Pool(Pool):
    def __init__(self, *args, **kwargs):
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._abandon()
            raise

    def _repopulate_pool(self):
        try:
            return super()._repopulate_pool()
        except BaseException:  # Pool's own cleanup would SIGTERM and join: kill them here
            self._abandon()
            raise

    def _abandon(self) -> None:
        handler = getattr(self, "_worker_handler", None)
        if handler is not None:
            handler._state = TERMINATE  # no more re-forking
            try:
                self._change_notifier.put(None)
                if handler.is_alive():
                    handler.join(5)
            except (OSError, RuntimeError):
                pass
        for p in self._pool:
            try:
                if p.exitcode is None:
                    p.kill()
                p.join(5)
            except (OSError, ValueError, AssertionError):
                pass
        del self._pool[:]


def start_pool(ctx, processes: int, initializer=None, initargs=()) -> Pool:
    """ctx.Pool(processes, initializer, initargs), stopped entirely if it fails to start."""
    return _Pool(processes, initializer, initargs, context=ctx)


def stop_strays() -> None:
    """Kill the pool workers still running when a command is over (a pool whose start failed
    halfway, as a bare ctx.Pool leaves it); their pools' handlers first, so none is re-forked."""
    import multiprocessing
    import threading

    handle = Pool._handle_workers.__func__  # a classmethod: the thread's target is bound
    handlers = [
        t
        for t in threading.enumerate()
        if getattr(getattr(t, "_target", None), "__func__", None) is handle
    ]
    for t in handlers:
        t._state = TERMINATE
        try:
            t._args[-1].put(None)  # its change_notifier: wake it to see TERMINATE
        except (OSError, IndexError, AttributeError):
            pass
    for t in handlers:
        t.join(5)  # it may be forking a worker right now: let that finish first
    for p in multiprocessing.active_children():
        try:
            p.kill()
            p.join(5)
        except (OSError, ValueError, AssertionError):
            pass
