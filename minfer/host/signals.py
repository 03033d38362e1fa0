"""SIGINT, SIGTERM and SIGHUP as one exception, installed before any slow import.

`install()` (called first thing by minfer.cli.main and minfer/__main__.py) makes each of the
three signals (unless inherited as ignored: nohup, a background job) raise `Interrupted`, a
KeyboardInterrupt, so every `except BaseException` / `finally` cleanup that already handles
Ctrl-C handles SIGTERM and SIGHUP too. Only the first signal raises: a second one during
cleanup is dropped, so removing a temporary file cannot itself be interrupted. `deferred()`
holds a signal over a step that must not be cut (starting or stopping a process pool).
`late()` ends the process after the command has finished, in place of the interpreter's
shutdown: a signal there prints its one line and exits at once, up to the last instruction.
Stdlib only: this module is imported before numpy, click or anything that takes time.
"""

from __future__ import annotations

import os
import signal
import sys

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A handled signal: exit code 128 + signum, one line `interrupted` / `terminated`."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def word(self) -> str:
        return "interrupted" if self.signum == signal.SIGINT else "terminated"


_raised: int | bool = False  # the first handled signal's number, once one came


_defer_depth = 0
_pending: int | None = None
_final: tuple[int, bool] | None = None  # (exit code, line printed) once late() runs
_owner = os.getpid()  # the process install() ran in


def _raise(signum, frame):
    global _raised, _pending
    if os.getpid() != _owner:  # a forked child before its own setup: just end, silently
        os._exit(128 + signum)
    if _final is not None:  # the command is over (late()): its line and exit, now
        _exit_now(signum)
    if _raised:  # cleanup of the first signal is running: let it finish
        return
    _raised = signum
    if _defer_depth:  # inside `deferred()`: raised when the block ends
        _pending = signum
        return
    raise Interrupted(signum)


def install() -> dict:
    """Make SIGINT/SIGTERM/SIGHUP raise Interrupted (main thread only; a no-op elsewhere).
    Returns what `restore()` needs to put the previous handlers back."""
    global _raised, _pending, _final, _owner
    prev = {"hook": sys.unraisablehook}
    for s in HANDLED:
        try:
            prev[s] = signal.getsignal(s)
        except (ValueError, OSError):
            pass
    _raised, _pending, _final, _owner = False, None, None, os.getpid()
    sys.unraisablehook = _unraisable
    for s in HANDLED:
        try:
            if signal.getsignal(s) == signal.SIG_IGN:  # nohup, a shell's background job
                continue
            signal.signal(s, _raise)
        except (ValueError, OSError):  # not the main thread, or a platform without it
            pass
    return prev


def restore(prev: dict) -> None:
    """Undo install() (for main() called in-process, by tests or another tool)."""
    global _raised, _pending, _final
    sys.unraisablehook = prev.get("hook", sys.__unraisablehook__)
    for s in HANDLED:
        if s in prev and prev[s] is not None:
            try:
                signal.signal(s, prev[s])
            except (ValueError, OSError):
                pass
    _raised, _pending, _final = False, None, None


def _unraisable(u) -> None:
    # a signal that landed in a __del__ is taken up by main() (see swallowed): no traceback;
    # a MemoryError there: main() names the shortage once
    if not isinstance(u.exc_value, (Interrupted, MemoryError)):
        sys.__unraisablehook__(u)


def swallowed() -> Interrupted | None:
    """The signal that raised Interrupted, if one did: for main() to act on one whose
    exception was swallowed (raised inside a __del__, or caught by a library)."""
    return Interrupted(_raised) if _raised else None


def ignore_in_worker() -> None:
    """Pool workers: the parent alone reacts to signals and stops its workers cleanly (a
    worker dying on the terminal's SIGINT / a group SIGTERM mid-result would spam
    BrokenPipeError and could leave the pool's result pipe half-written)."""
    for s in HANDLED:
        signal.signal(s, signal.SIG_IGN)


def message(e: Interrupted) -> str:
    # on a terminal the ^C echo is on the current line: start a fresh one
    nl = "\n" if e.signum == signal.SIGINT and _isatty(sys.stderr) else ""
    return f"{nl}{e.word}"


def _isatty(f) -> bool:
    try:
        return f.isatty()
    except (ValueError, OSError):
        return False


def late(code: int, printed: bool) -> None:
    """End the process (never returns) once the command is done and its files are closed.
    From here a signal prints its line (unless one was already printed) and exits with its
    code at once. Python's own shutdown is not used: it resets the handlers, so a signal
    there would be lost or kill the process silently. Instead: stop any worker process left
    (they ignore SIGTERM, so the exit would wait on them forever), run the atexit handlers,
    flush, then block the signals and take one that is pending before os._exit."""
    global _final
    _final = (code, printed)  # _raise now exits at once (see _exit_now)
    import atexit

    for step in (_kill_children, _join_threads, atexit._run_exitfuncs, _flush):
        try:
            step()
        except Exception:  # (a MemoryError under a tight ulimit -v): the exit still comes
            pass
    mine = [s for s in HANDLED if signal.getsignal(s) == _raise]
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, mine)  # none is lost between here and _exit
        pending = signal.sigpending() & set(mine)
    except (AttributeError, OSError, ValueError):
        pending = set()
    if pending:
        _exit_now(min(pending))
    os._exit(code)


def _exit_now(signum: int) -> None:
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)  # a second signal: no second line
    except (AttributeError, OSError, ValueError):
        pass
    code, printed = _final
    if not printed:
        e = Interrupted(signum)
        code = e.exit_code
        try:
            sys.stderr.write(message(e) + "\n")
        except (OSError, ValueError, AttributeError):
            pass
    _flush()
    os._exit(code)


def _flush() -> None:
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _join_threads() -> None:
    if "threading" in sys.modules:  # what Python's shutdown does first: non-daemon threads
        sys.modules["threading"]._shutdown()


def _kill_children() -> None:
    # a command's normal and error paths join their pools; one left (a pool whose start failed
    # halfway) has workers that ignore SIGTERM, and the exit would wait on them forever
    if "multiprocessing" in sys.modules:
        from minfer.host.pools import stop_strays

        stop_strays()


class deferred:
    """`with deferred():` a handled signal arriving inside the block is held and raised when the
    block ends. For the few steps that must not be cut in half: making a process pool (a
    signal halfway through Pool() would leave started workers no one stops) and stopping it
    (workers ignore signals, so a pool left unjoined would hang the interpreter's exit).
    A flag, not a signal mask: CPython runs handlers in the main thread whichever thread
    received the signal, so masking the main thread alone would not hold them."""

    def __enter__(self):
        global _defer_depth
        _defer_depth += 1
        return self

    def __exit__(self, *exc):
        global _defer_depth, _pending
        _defer_depth -= 1
        if _defer_depth == 0 and _pending is not None and exc[0] is None:
            signum, _pending = _pending, None
            raise Interrupted(signum)
        return False
