"""SIGINT, SIGTERM and SIGHUP as one exception, installed before any slow import.

`install()` (called first thing by minfer.cli.main and minfer/__main__.py) makes each of the
three signals (unless inherited as ignored: nohup, a background job) raise `Interrupted` (a KeyboardInterrupt, so every `except BaseException` /
`finally` cleanup that already handles Ctrl-C handles SIGTERM and SIGHUP too). Only the first
signal raises: a second one during cleanup is dropped, so removing a temporary file cannot
itself be interrupted. `late(code)` covers the last stretch after the command has finished
(interpreter shutdown, pool finalizers): a signal there prints its one line and exits at once.
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


_raised = False


def _raise(signum, frame):
    global _raised
    if _raised:  # cleanup of the first signal is running: let it finish
        return
    _raised = True
    raise Interrupted(signum)


def install() -> None:
    """Make SIGINT/SIGTERM/SIGHUP raise Interrupted (main thread only; a no-op elsewhere)."""
    global _raised
    _raised = False
    for s in HANDLED:
        try:
            if signal.getsignal(s) == signal.SIG_IGN:  # nohup, a shell's background job
                continue
            signal.signal(s, _raise)
        except (ValueError, OSError):  # not the main thread, or a platform without it
            pass


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
    """From here to the process's end a signal prints its line (unless one was already
    printed) and exits with its code at once: no traceback from interpreter shutdown."""
    def _late(signum, frame):
        e = Interrupted(signum)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        if not printed:
            try:
                sys.stderr.write(message(e) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if printed else e.exit_code)

    for s in HANDLED:
        try:
            if signal.getsignal(s) != signal.SIG_IGN:
                signal.signal(s, _late)
        except (ValueError, OSError):
            pass


class deferred:
    """`with deferred():` the handled signals wait (blocked) until the block ends, then are
    delivered. For making a process pool: a signal raised halfway through Pool() would leave
    started workers no one stops."""

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        return self

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
        return False
