"""Safe file access for every command: inputs refused by type before an open that could block,
outputs written under a temporary name and renamed, OS errors as one `error:` line.

Rules (docs/errors.md):
- An input must be a regular file. FIFOs, sockets, character/block devices and directories
  are refused from `os.stat` alone, before any `open()` (a FIFO would block in it, /dev/zero
  would never end).
- An output that is a regular file, or a new path, is created as `.NAME.tmp-PID` in the
  destination folder and renamed over NAME at the end; on any error or signal the temporary
  file is removed. A symlink is resolved first: its target is what is replaced (the link is
  kept), or created when the link dangles. A character device, FIFO or socket (/dev/null,
  /dev/stdout, a named pipe) is opened and written through, never renamed over; a directory
  or block device is refused.
- OS errors become one line: a full disk or quota (ENOSPC, EDQUOT, EFBIG, EIO), or out of
  memory (ENOMEM: a map beyond `ulimit -v`) is a ResourceError (exit 3); a bad path (no such
  folder, no permission, read-only or pseudo file system such as /proc or /sys) is BadInput
  (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from minfer.errors import BadInput, MinferError, ResourceError

# errnos that mean "the machine ran out of something", not "the path is wrong"
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.ENOMEM}

# prompt files: bytes allowed per token of context (a token is ~4 bytes of text on average;
# 16 leaves room for any script), and a floor so a small context still reads a real file
PROMPT_BYTES_PER_TOKEN = 16
PROMPT_MIN_CAP = 1 << 20
PROMPT_DEFAULT_CTX = 131072  # the cap's context when the caller does not know the model's


def escape_controls(s: str) -> str:
    """`s` with control and line-separator characters as repr-style escapes (\\n, \\x1b,
    \\u2028); every other character, any script, kept as it is. For one-line messages."""
    out = []
    for ch in s:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(
    path: str | os.PathLike, what: str = "input", exc: type[MinferError] = BadInput
) -> os.stat_result:
    """Stat `path` (following links) and refuse anything but an existing regular file, before
    any open. Returns the stat result; raises `exc` (exit 2) with one line naming `what`."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        # "no such file" for models (the loader's old wording), "no such prompt file" etc.
        raise exc(f"{path}: no such {'' if what == 'model' else what + ' '}file") from None
    except OSError as e:
        raise read_error(e, path, f"read {what} file", exc) from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise exc(f"{path}: is {kind}, not a {what} file")
    return st


def os_error(e: OSError, path: str | os.PathLike, doing: str) -> MinferError:
    """The MinferError for an OSError met while `doing` (e.g. "write") on `path`."""
    why = e.strerror or str(e) or type(e).__name__
    if e.errno in _RESOURCE_ERRNOS or e.errno is None:
        return ResourceError(f"{path}: cannot {doing} ({why})")
    return BadInput(f"{path}: cannot {doing} ({why})")


def read_error(
    e: OSError, path: str | os.PathLike, doing: str, exc: type[MinferError] = BadInput
) -> MinferError:
    """The MinferError for an OSError met while `doing` (e.g. "read") on an input: out of
    memory or file handles (ENOMEM: a map beyond `ulimit -v`) is a ResourceError (exit 3),
    anything else `exc` (exit 2)."""
    why = e.strerror or str(e) or type(e).__name__
    if e.errno == errno.ENOMEM:
        from minfer.host.hostmem import fmt_bytes, headroom

        room, limit = headroom()
        have = f"; {fmt_bytes(room)} available ({limit})" if room is not None else ""
        return ResourceError(f"{path}: cannot {doing}: out of host memory ({why}){have}")
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceError(f"{path}: cannot {doing}: out of file handles ({why})")
    return exc(f"{path}: cannot {doing} ({why})")


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """(where to write, whether to write through) for an output path: a character device,
    FIFO or socket (followed through links: /dev/stdout) is written through as it is; a
    regular file or a new path is the symlink-resolved path, replaced atomically (a link to a
    file keeps the link). A directory, a block device or a missing parent is refused."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows links, /proc/self/fd/N's too
    except FileNotFoundError:
        st = None  # a new path, or a dangling link: its target is created
    except NotADirectoryError:
        raise BadInput(f"{p.parent}: output directory is not a directory") from None
    except OSError as e:
        raise os_error(e, p, "use as output") from None
    if st is not None and (
        stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)
    ):
        return p, True
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{p}: is {_kind(st.st_mode)}; refusing to replace it with an output file")
    real = Path(os.path.realpath(p))  # the file a link names is replaced, the link kept
    parent = real.parent
    if not parent.is_dir():
        raise BadInput(f"{parent}: no such directory (the output directory does not exist)")
    return real, False


def check_output_path(path: str | os.PathLike) -> Path:
    """The path an output is written to (output_target's); refuses what cannot be one.
    Permission and file-system problems surface when the file is made."""
    return output_target(path)[0]


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """`with atomic_output(p) as tmp:` write the file `tmp`; on normal exit it is renamed over
    `p` (a symlink's target). On any exception or signal `tmp` is removed and nothing at `p`
    changes. A device, FIFO or socket at `p` is yielded itself, to be written through.
    OSErrors are raised as one-line MinferErrors (see os_error)."""
    p, through = output_target(path)
    if through:
        try:
            yield p
        except OSError as e:
            raise os_error(e, p, "write output") from None
        return
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        _unlink(tmp)
        raise os_error(e, p, "write output") from None
    except BaseException:
        _unlink(tmp)
        raise


@contextlib.contextmanager
def open_output(path: str | os.PathLike, mode: str = "wb"):
    """A file object on a temporary name, renamed over `path` when the block ends normally;
    on `path` itself when it is a device, FIFO or socket (see atomic_output)."""
    with atomic_output(path) as tmp:
        try:
            f = open(tmp, mode)
        except OSError as e:
            raise os_error(e, path, "create output") from None
        with f:
            yield f


def _unlink(p: Path) -> None:
    try:
        p.unlink(missing_ok=True)
    except OSError:
        pass


def prompt_cap(n_ctx: int | None) -> int:
    """Most bytes a prompt file may hold for a model of context `n_ctx`."""
    n = PROMPT_DEFAULT_CTX if n_ctx is None else max(0, int(n_ctx))
    return max(PROMPT_MIN_CAP, PROMPT_BYTES_PER_TOKEN * n)


def read_capped(path: str, cap: int, what: str) -> bytes:
    """The bytes of `path` ('-': stdin), at most `cap`; BadInput beyond it (one line naming the
    cap). Special files are refused by type first, so nothing here can block or run forever."""
    if path == "-":
        data = sys.stdin.buffer.read(cap + 1)
        name = "stdin"
    else:
        check_input_file(path, what)
        try:
            with open(path, "rb") as f:
                data = f.read(cap + 1)
        except OSError as e:
            raise read_error(e, path, f"read {what} file") from None
        name = path
    check_cap(name, len(data), cap, what)
    return data


def check_cap(name: str, nbytes: int, cap: int, what: str = "prompt") -> None:
    """BadInput (one line naming the cap) when `nbytes` of `name` exceed `cap`; also for text
    read under a wider cap before the model's context was known."""
    if nbytes > cap:
        raise BadInput(
            f"{name}: {what} is larger than {cap:,} bytes, the cap for this context "
            f"({PROMPT_BYTES_PER_TOKEN} bytes per token, at least "
            f"{PROMPT_MIN_CAP >> 20} MiB)"
        )


def read_prompt_file(path: str, n_ctx: int | None = None) -> str:
    """UTF-8 text of a prompt file ('-': stdin), capped by prompt_cap(n_ctx); BadInput naming
    the file (and byte offset) otherwise."""
    data = read_capped(path, prompt_cap(n_ctx), "prompt")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(
            f"{'stdin' if path == '-' else path}: invalid UTF-8 at byte offset "
            f"{e.start} (byte 0x{data[e.start]:02x})"
        ) from None


def cache_root(sub: str = "") -> Path:
    """$MINFER_CACHE (default ~/.cache/minfer), or its `sub` folder: kernels, tokenizer merges,
    calibration statistics (not created here)."""
    root = Path(os.environ.get("MINFER_CACHE", Path.home() / ".cache" / "minfer"))
    return root / sub if sub else root
