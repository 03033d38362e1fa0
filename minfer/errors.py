"""Errors minfer reports to the user: one line, a named problem, a fixed exit code.

Every failure a user can cause or meet (bad file, bad prompt, no GPU, out of memory) is raised
as a MinferError subclass; the CLI prints `error: <message>` and exits with `exit_code`.
Anything else escaping is a bug in minfer.
"""


class MinferError(Exception):
    """Base class: a problem minfer can name. exit_code follows the README's table."""

    exit_code = 2


class BadInput(MinferError, ValueError):
    """The user's input is wrong: a file, a prompt, an option value. Exit code 2. A ValueError
    too, so an API caller's `except ValueError` catches a bad argument."""

    exit_code = 2


class BadModel(BadInput):
    """The GGUF file is unreadable, malformed or not a model minfer supports. Exit code 2."""


class Unsupported(BadInput):
    """Valid input that minfer does not support (architecture, tensor type). Exit code 2."""


class GPUError(MinferError):
    """No GPU / driver / pycuda, out of device memory, or a kernel failure. Exit code 3."""

    exit_code = 3


class ResourceError(MinferError):
    """The machine ran out of something: memory (RAM or the address-space limit), disk space,
    quota, a write that failed. Exit code 3."""

    exit_code = 3


class NumericError(MinferError):
    """The forward produced NaN or inf (overflowing weights or hyperparameters): the numbers
    would be garbage, so they are refused rather than decoded. Exit code 3."""

    exit_code = 3


def show(v, n: int = 40) -> str:
    """A value for an error line: repr (control characters escaped), cut to n characters."""
    r = ascii(v)
    return r if len(r) <= n else r[: n - 3] + "..."
