"""A fast GGUF header parser: metadata (types kept) and tensor infos, no per-item memmap views.

gguf.GGUFReader builds a numpy view per metadata item, which takes seconds for a 49152-token
vocabulary. The synthetic-model maker (copying a tokenizer) and the slicer only need the header
and then raw byte ranges, so they parse it here with struct, bounds-checked against the file.

`read_header(path) -> GGUFHeader`: `.kv` {key: gguf.GGUFValue}, `.tensors` [HeaderTensor
(name, qtype, shape in numpy order, absolute byte offset, nbytes)], `.alignment`, `.data_start`.
`tensor_bytes(path, t)` memory-maps one tensor's raw bytes (uint8).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import BadModel


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    qtype: int
    shape: tuple[int, ...]  # numpy order [rows, cols]
    offset: int  # absolute file offset of the data
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    kv: dict[str, Any]  # key -> gguf.GGUFValue
    tensors: list[HeaderTensor]
    alignment: int
    data_start: int


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


class _Cursor:
    def __init__(self, buf: bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise BadModel(f"{self.path}: truncated GGUF header (needs {n} bytes at "
                           f"offset {self.pos}, file has {len(self.buf)})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise BadModel(f"{self.path}: invalid UTF-8 string in the header") from None

    def value(self, vtype: int, key: str):
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        raise BadModel(f"{self.path}: metadata {key!r} has unknown value type {vtype}")


def read_header(path: str | os.PathLike) -> GGUFHeader:
    import gguf

    path = Path(path)
    if not path.is_file():
        raise BadModel(f"{path}: no such file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        # the header is at most a few MB; read generously and grow if needed
        want = min(size, 16 << 20)
        while True:
            f.seek(0)
            buf = f.read(want)
            try:
                return _parse(path, buf, size, gguf)
            except _NeedMore:
                if want >= size:
                    raise BadModel(f"{path}: truncated GGUF header") from None
                want = min(size, want * 4)


class _NeedMore(Exception):
    pass


def _parse(path: Path, buf: bytes, size: int, gguf) -> GGUFHeader:
    V = gguf.GGUFValueType
    c = _Cursor(buf, path)
    full = len(buf) == size

    def guard(fn):
        try:
            return fn()
        except BadModel:
            if not full:
                raise _NeedMore from None
            raise

    magic = guard(lambda: c.take(4))
    if magic != b"GGUF":
        raise BadModel(f"{path}: not a GGUF file (magic {magic!r})")
    version, n_tensors, n_kv = guard(lambda: struct.unpack("<IQQ", c.take(20)))
    if version not in (2, 3):
        raise BadModel(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    if n_tensors > size // 24 or n_kv > size // 12:
        raise BadModel(f"{path}: implausible counts ({n_tensors} tensors, {n_kv} keys) for "
                       f"a {size}-byte file")

    def kvs():
        kv = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.unpack("<I")
            if vtype == 9:
                sub = c.unpack("<I")
                n = c.unpack("<Q")
                if sub == 9:
                    raise BadModel(f"{path}: metadata {key!r}: nested arrays are not supported")
                if sub in _SCALAR:
                    fmt = _SCALAR[sub]
                    raw = c.take(n * struct.calcsize(fmt))
                    vals = np.frombuffer(raw, np.dtype(fmt)).tolist()
                else:
                    vals = [c.value(sub, key) for _ in range(n)]
                kv[key] = gguf.GGUFValue(vals, V.ARRAY, V(sub))
            else:
                try:
                    vt = V(vtype)
                except ValueError:
                    raise BadModel(f"{path}: metadata {key!r} has unknown type {vtype}") from None
                kv[key] = gguf.GGUFValue(c.value(vtype, key), vt)
        return kv

    kv = guard(kvs)

    def infos():
        out = []
        for _ in range(n_tensors):
            name = c.string()
            nd = c.unpack("<I")
            if nd > 4:
                raise BadModel(f"{path}: tensor {name!r} has {nd} dimensions")
            ne = [c.unpack("<Q") for _ in range(nd)]
            qtype = c.unpack("<I")
            off = c.unpack("<Q")
            out.append((name, qtype, tuple(reversed(ne)), off))
        return out

    raw_infos = guard(infos)
    align = int(kv["general.alignment"].value) if "general.alignment" in kv else 32
    data_start = (c.pos + align - 1) // align * align
    tensors = []
    for name, qtype, shape, off in raw_infos:
        try:
            qt = gguf.GGMLQuantizationType(qtype)
        except ValueError:
            raise BadModel(f"{path}: tensor {name!r} has unknown type id {qtype}") from None
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if shape and shape[-1] % bs:
            raise BadModel(f"{path}: tensor {name!r}: row length {shape[-1]} not a multiple of "
                           f"the {qt.name} block size {bs}")
        nbytes = n // bs * ts
        start = data_start + off
        if start + nbytes > size:
            raise BadModel(f"{path}: tensor {name!r} data runs past the end of the file")
        tensors.append(HeaderTensor(name, qtype, shape, start, nbytes))
    return GGUFHeader(path, version, kv, tensors, align, data_start)


def tensor_bytes(path: str | os.PathLike, t: HeaderTensor) -> np.ndarray:
    """One tensor's raw bytes, memory-mapped read-only: uint8 [nbytes]."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
