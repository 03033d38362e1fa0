"""Structural checks of a GGUF file before the `gguf` reader trusts its header.

(Minimal first version: magic, version, file size. The reliability issue extends it to
bounds-check every count, length, offset and dimension against the file size.)
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from minfer.errors import BadModel


def check_gguf_file(path: str | os.PathLike) -> None:
    p = Path(path)
    size = p.stat().st_size
    if size < 24:
        raise BadModel(f"{p}: truncated GGUF ({size} bytes, header needs 24)")
    with open(p, "rb") as f:
        head = f.read(24)
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", head)
    if magic != b"GGUF":
        raise BadModel(f"{p}: not a GGUF file (magic {magic!r})")
    if version not in (2, 3):
        raise BadModel(f"{p}: unsupported GGUF version {version} (supported: 2, 3)")
