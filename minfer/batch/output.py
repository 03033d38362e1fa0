"""The results of a prompt file as JSONL: one JSON object a line (UTF-8, ensure_ascii=False; the
line breaks JSON allows raw in a string, U+0085, U+2028 and U+2029, written as \\u escapes).

To standard output (path None or "-"): each line written and flushed as it comes. To a file:
the lines go to a temporary file in the same directory (fileio.atomic_output's `.NAME.tmp-PID`),
which commit() flushes, fsyncs and renames over the path; leaving the `with` block without
commit() (an exception, a signal, a bug) removes the temporary file and leaves the path as it
was: never a torn or half-written file. A symlink's target is the file replaced; a device, FIFO
or socket (/dev/null, /dev/stdout) is written through (fileio.output_target). An output that
cannot be either (a directory, a path in a missing directory) is refused when the writer is
made, before any work.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys

from minfer.host.fileio import atomic_output, os_error, output_target

# characters str.splitlines() (and some JSONL readers) break lines at, which JSON leaves raw in a
# string: written as \u escapes, so a record is one line whichever way its reader splits
_LINE_BREAKS = {c: f"\\u{c:04x}" for c in (0x85, 0x2028, 0x2029)}


def dumps(record: dict) -> str:
    """A record's JSON line, without its newline: UTF-8 text, or all-ASCII \\u escapes where a
    lone surrogate has no UTF-8 form."""
    line = json.dumps(record, ensure_ascii=False).translate(_LINE_BREAKS)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record)
    return line


def record(pid, r, tok, logprobs: bool, top: int = 0, prompt_ids: bool = False) -> dict:
    """The JSONL record of one prompt's runner.Result (docs/batch.md's table)."""
    out = {
        "id": pid,
        "n_prompt": r.n_prompt,
        "greedy_ids": r.greedy,
        "text": tok.decode(r.greedy),
        "stopped_at_eos": r.eos,
    }
    if r.first is not None:  # a context/continuation record
        out["n_context"] = r.first
        out["continuation_logprob"] = round(r.continuation_logprob, 6)
        out["is_greedy"] = r.is_greedy
    if logprobs:
        lp = [round(float(x), 6) for x in r.logprobs]
        out["logprobs"] = lp
        out["logprob_sum"] = round(math.fsum(lp), 6)
    rows = r.top_rows(logprobs) if top else None
    if rows is not None:
        out["top_logprobs"] = [[[t, tok.piece(t), round(v, 6)] for t, v in row] for row in rows]
    if prompt_ids:
        out["prompt_ids"] = r.ids.tolist()
    return out


class _Abort(Exception):
    """Thrown into atomic_output to make it remove its temporary file."""


class ResultWriter:
    """A context manager: write(record) per prompt, commit() at the end."""

    def __init__(self, path: str | None):
        self.path = None if path in (None, "-") else str(path)
        self._done = False
        self._through = False
        self._f = None
        self._atomic = None
        if self.path is None:
            return
        # a directory, a missing directory: refused; a device or FIFO: written through
        self._through = output_target(self.path)[1]
        atomic = atomic_output(self.path)
        tmp = atomic.__enter__()
        try:
            self._f = open(tmp, "wb")
        except BaseException as e:
            atomic.__exit__(type(e), e, e.__traceback__)
            if isinstance(e, OSError):
                raise os_error(e, self.path, "create output") from None
            raise
        self._atomic = atomic

    def write(self, record: dict) -> None:
        """One record as one line of JSON."""
        self.write_line(dumps(record))

    def write_line(self, line: str) -> None:
        """One record already made a line by dumps() (a Ray actor's: minfer.engine.ray)."""
        if self._done:
            raise RuntimeError("ResultWriter.write after commit or close")
        line += "\n"
        data = line.encode("utf-8")  # dumps() gave UTF-8-encodable text
        if self._f is None:
            out = sys.stdout
            buf = getattr(out, "buffer", None)
            if buf is None:
                out.write(line)
            else:
                out.flush()  # keep anything printed before in front
                buf.write(data)
                buf.flush()
            return
        try:
            self._f.write(data)
        except OSError as e:
            raise os_error(e, self.path, "write output") from None

    def commit(self) -> None:
        """Make the output final: flush stdout, or fsync and rename the file into place."""
        if self._done:
            raise RuntimeError("ResultWriter.commit twice or after close")
        self._done = True
        if self._f is None:
            sys.stdout.flush()
            return
        f, atomic, self._f = self._f, self._take_atomic(), None
        try:
            f.flush()
            if not self._through:  # fsync on a pipe or /dev/null is EINVAL
                os.fsync(f.fileno())
            f.close()
        except BaseException as e:
            with contextlib.suppress(OSError):
                f.close()
            atomic.__exit__(_Abort, _Abort(), None)
            if isinstance(e, OSError):
                raise os_error(e, self.path, "write output") from None
            raise
        atomic.__exit__(None, None, None)  # os.replace; an OSError there is one line
        if not self._through:
            _fsync_dir(os.path.dirname(os.path.realpath(self.path)))

    def close(self) -> None:
        """Without commit(): drop the temporary file; the path is left as it was."""
        if self._done:
            return
        self._done = True
        f, atomic, self._f = self._f, self._take_atomic(), None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        if atomic is not None:
            atomic.__exit__(_Abort, _Abort(), None)  # removes the temporary file

    def _take_atomic(self):
        atomic, self._atomic = self._atomic, None
        return atomic

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _fsync_dir(path: str) -> None:
    """The rename made durable where the file system allows it (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
