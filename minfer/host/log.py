"""minfer's messages beside the results: one `minfer` logger on stderr, its level set by
-q/--quiet (errors only: no notes, no progress bars) and -v/--verbose (debug lines too).

Results (tables, tok/s, PPL) are stdout prints; notes (an ignored llama.cpp flag, the default
model's fetch) are log records, so -q silences them as a user of llama.cpp's `--log-disable`
or a script expects. Progress bars ask `quiet()` (minfer.host.progress). The CLI calls
`setup()` once per command, so an in-process caller (the tests) starts each run at INFO.
"""

from __future__ import annotations

import logging
import sys

import click

log = logging.getLogger("minfer")
log.setLevel(logging.INFO)  # bars on by default, also for a library caller: quiet only after -q


class _Stderr(logging.Handler):
    """Writes to the sys.stderr of the moment (a test's redirect, /dev/null when fd 2 was
    closed), never the one captured at import; a failed write is dropped, not raised."""

    def emit(self, record):
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass


def setup(level: int = logging.INFO) -> None:
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        h = _Stderr()
        h.setFormatter(logging.Formatter("minfer: %(message)s"))
        log.addHandler(h)
        log.propagate = False
    log.setLevel(level)


def quiet() -> bool:
    """True under -q: nothing but `error:` lines on stderr."""
    return not log.isEnabledFor(logging.INFO)


def _set_quiet(ctx, param, value):
    if value:
        log.setLevel(logging.ERROR)
    return value


def _set_verbose(ctx, param, value):
    if value and not quiet():  # -q wins over -v
        log.setLevel(logging.DEBUG)
    return value


QUIET = (
    ("-q", "--quiet"),
    dict(
        is_flag=True,
        is_eager=True,
        callback=_set_quiet,
        help="Only errors on stderr: no notes, no progress bars.",
    ),
)
VERBOSE = (
    ("-v", "--verbose"),
    dict(is_flag=True, is_eager=True, callback=_set_verbose, help="Debug lines on stderr too."),
)


def quiet_option(help: str | None = None):
    """Decorator: -q/--quiet passed to the command as `quiet` (quantize, synth print less);
    eager, so it is in force before any other option's callback logs. Other commands get
    -q and -v from the CLI (minfer.cli) without a parameter."""
    return click.option(*QUIET[0], **{**QUIET[1], **({"help": help} if help else {})})


def options(taken: set[str]) -> list[click.Option]:
    """-q/--quiet and -v/--verbose for a command that declares neither name itself."""
    return [
        click.Option(list(names), expose_value=False, **kw)
        for names, kw in (QUIET, VERBOSE)
        if not taken & set(names)
    ]
