"""The bytes of a prompt file, read twice the same way: opened once, lines read with a byte cap.

- A regular file is opened once and kept open: both passes read the same open file (a file
  renamed over the path in between is not seen). Its size and mtime are taken when a pass
  starts; a pass finding them changed (an edit in place) is refused.
- Standard input ("-") and a FIFO (`<(cmd)`, a named pipe) are copied first, in 1 MiB pieces,
  to a private temporary file (mode 0600, unlinked at once, so nothing is left behind even
  after a crash); both passes read that copy.
- Anything else that is not a regular file (a directory, a device, a socket) is refused by
  `os.stat` before any open, as fileio does for every input.
- A line is read with readline(cap + 1): at most the cap plus one byte of a line is ever in
  memory; a longer line is refused, so a 2 GB file or a 100 MB line costs a few MiB.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from minfer.errors import BadInput
from minfer.host.fileio import (
    PROMPT_BYTES_PER_TOKEN,
    PROMPT_MIN_CAP,
    check_input_file,
    os_error,
    read_error,
)

SPOOL_CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"


class LineReader:
    """An open prompt input. lines(cap) yields (1-based line number, raw bytes without the
    line's "\\n"); a UTF-8 byte-order mark at the start of the file is dropped."""

    def __init__(self, f: BinaryIO, name: str, spooled: bool):
        self.f, self.name, self.spooled = f, name, spooled

    def fingerprint(self) -> tuple[int, int] | None:
        """(size, mtime in ns) of the open file; None for a spool (it is ours alone)."""
        if self.spooled:
            return None
        try:
            st = os.fstat(self.f.fileno())
        except OSError as e:
            raise read_error(e, self.name, "read prompt file") from None
        return st.st_size, st.st_mtime_ns

    def lines(self, cap: int) -> Iterator[tuple[int, bytes]]:
        try:
            self.f.seek(0)
        except OSError as e:
            raise read_error(e, self.name, "read prompt file") from None
        n = 0
        while True:
            try:
                raw = self.f.readline(cap + 1)
            except OSError as e:
                raise read_error(e, self.name, "read prompt file") from None
            if not raw:
                return
            n += 1
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            elif len(raw) > cap:
                raise BadInput(
                    f"{self.name} line {n}: longer than {cap:,} bytes, the cap "
                    f"for one prompt line at this context ({PROMPT_BYTES_PER_TOKEN} "
                    f"bytes per token, at least {PROMPT_MIN_CAP >> 20} MiB)"
                )
            if n == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            yield n, raw

    def close(self) -> None:
        self.f.close()  # a spool is unlinked already: closing it frees its blocks


def open_input(path: str) -> LineReader:
    """Open `path` ("-": standard input) for reading prompts (see the module doc)."""
    if path == "-":
        return _spool(sys.stdin.buffer, "stdin")
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISFIFO(st.st_mode):
        try:
            src = open(path, "rb")
        except OSError as e:
            raise read_error(e, path, "read prompt file") from None
        with src:
            return _spool(src, path)
    check_input_file(path, "prompt")  # missing, a directory, a device, a socket: one line
    try:
        return LineReader(open(path, "rb"), path, spooled=False)
    except OSError as e:
        raise read_error(e, path, "read prompt file") from None


def _spool(src: BinaryIO, name: str) -> LineReader:
    try:
        dst = tempfile.TemporaryFile(prefix="minfer-prompts-")
    except OSError as e:
        raise os_error(e, tempfile.gettempdir(), "create a temporary copy of the prompts") from None
    try:
        while chunk := _spool_read(src, name):
            _spool_write(dst, chunk, name)
        _spool_write(dst, b"", name)
    except BaseException:
        dst.close()
        raise
    return LineReader(dst, name, spooled=True)


def _spool_read(src: BinaryIO, name: str) -> bytes:
    try:
        return src.read(SPOOL_CHUNK)
    except OSError as e:
        raise read_error(e, name, "read prompts") from None


def _spool_write(dst: BinaryIO, chunk: bytes, name: str) -> None:
    """Append `chunk` to the spool (b"": flush it); a full disk is one line (exit 3)."""
    try:
        if chunk:
            dst.write(chunk)
        else:
            dst.flush()
    except OSError as e:
        raise os_error(
            e, tempfile.gettempdir(), f"copy the prompts of {name} to a temporary file"
        ) from None
