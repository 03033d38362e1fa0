"""minfer's command line: a thin click layer. Each command lives in minfer/commands/<name>.py.

Exit codes (docs/errors.md): 0 ok, 1 usage error, 2 bad input (file, prompt, option value),
3 GPU or resource failure, 130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP.
A MinferError prints one line `error: ...` (control characters escaped).

Nothing slow is imported at module level: `main()` installs the signal handlers first, and each
command's module (numpy, the loader, ...) is imported only when that command runs. `cli` (the
click group) is built on first use.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys

EXIT_OK, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_RESOURCE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130

# command name -> (module, click command attribute); an absent module is not offered
COMMANDS = {
    "prefill": ("minfer.commands.prefill", "prefill"),
    "inspect": ("minfer.commands.inspect", "inspect"),
    "quantize": ("minfer.commands.quantize", "quantize"),
    "synth": ("minfer.commands.synth", "synth"),
    "bench": ("minfer.commands.bench", "bench"),
    "check": ("minfer.commands.check", "check"),
    "perplexity": ("minfer.commands.perplexity", "perplexity"),
    "serve": ("minfer.commands.serve", "serve"),
    "bench-serve": ("minfer.commands.bench_serve", "bench_serve"),
    "embed": ("minfer.commands.embed", "embed"),
}

_cli = None


def _load_command(name: str):
    """The click command `name`, imported now; None if its module is absent."""
    import importlib

    import click

    mod, attr = COMMANDS[name]
    try:
        cmd = getattr(importlib.import_module(mod), attr)
    except ModuleNotFoundError as e:
        if e.name != mod:
            raise
        return None
    for p in cmd.params:
        # click refuses a directory with a 3-line usage error, exit 1; the commands' own checks
        # (minfer.host.fileio) refuse it with one `error:` line, exit 2 (bad input)
        if isinstance(p.type, click.Path) and not p.type.dir_okay:
            p.type.dir_okay = True
    # every command: -q/-v, and llama.cpp's flags that mean nothing here (one note each), where
    # the command does not use the name itself
    from minfer.commands import llamacpp_flags
    from minfer.host import log

    taken = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    cmd.params.extend(log.options(taken) + llamacpp_flags.options(name, taken))
    return cmd


def _build():
    import click

    from minfer import __version__

    class LazyGroup(click.Group):
        def list_commands(self, ctx):
            return [n for n in COMMANDS if self.get_command(ctx, n) is not None]

        def get_command(self, ctx, name):
            if name not in self.commands and name in COMMANDS:
                cmd = _load_command(name)
                if cmd is None:
                    return None
                self.add_command(cmd, name)
            return self.commands.get(name)

    @click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="minfer")
    def cli() -> None:
        """minfer: prefill inference for llama-style GGUF models on NVIDIA GPUs.

        Runs a prompt through the model, reports prefill tok/s and greedily decoded tokens that
        must be identical on every kernel path (GPU f16, GPU MMQ, CPU numpy reference).
        """

    return cli


def _group():
    global _cli
    if _cli is None:
        _cli = _build()
    return _cli


def __getattr__(name: str):
    # `from minfer.cli import cli` (tests, other tools): the group with every command loaded,
    # so `cli.commands` is complete; main() itself loads only the command it runs
    if name == "cli":
        g = _group()
        g.list_commands(None)
        return g
    raise AttributeError(name)


def _stdout_failed(e: OSError) -> int:
    """A write to stdout failed: a closed pipe (`minfer inspect M | head`) is the reader
    having seen enough, exit 0 quietly; a closed fd 1 exit 3 quietly; anything else (a full
    disk) one line, exit 3. stdout then points at /dev/null so shutdown's flush is quiet."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass
    if e.errno == errno.EPIPE:
        return EXIT_OK
    if e.errno != errno.EBADF:
        _say_error(f"cannot write to standard output ({e.strerror or e})")
    return EXIT_RESOURCE


def _say_error(msg: str) -> None:
    try:
        try:
            from minfer.host.fileio import escape_controls
        except Exception:  # starved of memory, this module does not load: ASCII, escaped
            line = f"error: {ascii(msg)[1:-1]}\n"
        else:
            line = f"error: {escape_controls(msg)}\n"
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    except MemoryError:  # too little left even to build the line: the fixed words
        try:
            os.write(2, b"error: out of host memory\n")
        except OSError:
            pass


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when fd 1 was closed at start (`>&-`): a write fails as on a closed pipe."""

    def writable(self):
        return True

    def write(self, s):
        raise OSError(errno.EBADF, "standard output is closed")


def _reopen_std() -> None:
    """A closed fd 0, 1 or 2 gets /dev/null, so the next open() (an output file) cannot land
    on it and children inherit a harmless one; Python left sys.std* None for it."""
    for fd, name, mode in (
        (0, "stdin", os.O_RDONLY),
        (1, "stdout", os.O_WRONLY),
        (2, "stderr", os.O_WRONLY),
    ):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            got = os.open(os.devnull, mode)
            if got != fd:
                os.dup2(got, fd)
                os.close(got)
        except OSError:
            continue
        if getattr(sys, name) is None:
            if fd == 1:
                sys.stdout = _ClosedStdout()
            else:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def main(argv: list[str] | None = None) -> None:
    """The `minfer` command. With argv=None (the console script, `python -m minfer`) the
    process ends here, in signals.late(); with an argv (tests, in-process callers) the signal
    handlers are put back before the SystemExit."""
    from minfer.host import signals

    prev = signals.install()  # before click, numpy or any command module is imported
    _reopen_std()
    try:  # the error path's modules, while memory is there (a tight `ulimit -v`)
        import minfer.host.fileio  # noqa: F401
        import minfer.host.hostmem  # noqa: F401
    except Exception:
        pass
    try:
        try:
            code, printed = _run(argv)
            e = signals.swallowed()
            if e is not None and not printed:  # raised where Python ignores it (__del__)
                raise e
        except KeyboardInterrupt as e:  # a signal in the few steps after _run's own handlers
            code, printed = _interrupted(e), True
        if argv is None:
            signals.late(code, printed)  # does not return
    finally:
        if argv is not None:
            signals.restore(prev)
    sys.exit(code)


def _interrupted(e: KeyboardInterrupt) -> int:
    """Print the interruption's line; its exit code."""
    from minfer.host.signals import Interrupted, message

    if not isinstance(e, Interrupted):
        e = Interrupted()
    try:
        sys.stderr.write(message(e) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    return e.exit_code


def _run(argv: list[str] | None) -> tuple[int, bool]:
    """(exit code, whether an interruption line was printed)."""
    import warnings

    try:
        # in-process callers get their warning filters back; the process's own end keeps it
        with warnings.catch_warnings() if argv is not None else contextlib.nullcontext():
            if not sys.warnoptions:  # numpy's RuntimeWarnings etc.: an error is one line
                warnings.simplefilter("ignore")
            return _invoke(argv)
    except KeyboardInterrupt as e:  # Interrupted, or a KeyboardInterrupt raised by other code
        return _interrupted(e), True
    except Exception as e:  # out of host memory anywhere, even in an import: exit 3
        try:
            err = _starved(e)
        except MemoryError:
            err = "out of host memory"
        if err is None:
            raise
        _say_error(err)
        return EXIT_RESOURCE, False


def _starved(e: BaseException) -> str | None:
    try:
        from minfer.host.hostmem import starved
    except Exception:  # too little memory to import even that
        starved = isinstance(e, (MemoryError, ImportError, SystemError))
        return "out of host memory" if starved else None
    return starved(e)


def _invoke(argv: list[str] | None) -> tuple[int, bool]:
    import click

    from minfer.errors import MinferError
    from minfer.host.log import setup
    from minfer.host.signals import Interrupted, message

    setup()  # notes at INFO until the command's -q / -v
    group = _group()
    args = sys.argv[1:] if argv is None else list(argv)
    real_stdout = sys.stdout
    sys.stdout = _GuardedStdout(real_stdout)
    try:
        try:
            # make_context + invoke, not group.main(): click's main turns a
            # KeyboardInterrupt into Abort after printing an empty line
            with group.make_context("minfer", args) as ctx:
                rv = group.invoke(ctx)
            code = rv if isinstance(rv, int) else EXIT_OK
        except click.exceptions.Exit as e:
            code = e.exit_code
        except click.exceptions.Abort:
            sys.stderr.write(message(Interrupted()) + "\n")
            return EXIT_INTERRUPTED, True
        except click.ClickException as e:  # usage errors, option values click checks
            e.show()
            code = EXIT_USAGE
        except MinferError as e:
            _say_error(str(e))
            code = e.exit_code
        sys.stdout.flush()  # a full disk or closed pipe on stdout shows here, not at exit
        return code, False
    except _StdoutFailed as e:
        sys.stdout = real_stdout
        return _stdout_failed(e.args[0]), False
    finally:
        sys.stdout = real_stdout


class _StdoutFailed(Exception):
    """A write to stdout failed; carries the OSError (see _GuardedStdout)."""


class _GuardedStdout:
    """sys.stdout during a command: a failed write or flush (full disk, closed pipe) raises
    _StdoutFailed, told apart from the command's own file errors (an output file on a full
    disk is exit 3 with its own message, a missing input exit 2)."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, s):
        try:
            return self._inner.write(s)
        except OSError as e:
            raise _StdoutFailed(e) from None

    def flush(self):
        try:
            return self._inner.flush()
        except OSError as e:
            raise _StdoutFailed(e) from None

    @property
    def buffer(self):
        # binary writers (prefill --prompts' JSONL) get the same guard as text ones
        return _GuardedStdout(self._inner.buffer)

    def __getattr__(self, name):
        return getattr(self._inner, name)
