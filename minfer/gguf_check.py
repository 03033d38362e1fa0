"""Structural checks of a GGUF file before the `gguf` reader trusts its header.

The `gguf` package's reader believes every count and length it reads: a damaged or hostile
file can make it loop 2^60 times, allocate without bound, or index past the end of the map.
`check_gguf_file` walks the header first, with every number checked against the bytes that
remain, and raises BadModel with a one-line message (file, field, value) at the first problem:

  header   magic "GGUF", version 2 or 3 (little-endian), tensor and kv counts that fit the
           file (each kv needs >= 13 bytes, each tensor info >= 32)
  kv       key: a UTF-8 string, no duplicates; value type a known id; strings and arrays
           (count x minimal element size) inside the file; arrays nested at most 2 deep;
           general.alignment a uint32 power of two
  tensors  name UTF-8 and unique; n_dims 1..4; dims >= 1; element count < 2^62; type a known
           ggml type; the row length a multiple of the type's block size; offset aligned;
           offset + size inside the data section; no two tensors overlapping

`scan_gguf` does the same on a buffer and returns the layout (where each count, length, type
and offset lives): the fuzz tests use it to aim their mutations.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from minfer.errors import BadModel

HEADER_BYTES = 24
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
MAX_DIMS = 4
MAX_ELEMENTS = 1 << 62
MAX_ARRAY_DEPTH = 2
DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> (name, fixed size or None for string/array)
T_STRING, T_ARRAY, T_UINT32 = 8, 9, 4
_VALUE_TYPES = {
    0: ("uint8", 1), 1: ("int8", 1), 2: ("uint16", 2), 3: ("int16", 2), 4: ("uint32", 4),
    5: ("int32", 4), 6: ("float32", 4), 7: ("bool", 1), 8: ("string", None),
    9: ("array", None), 10: ("uint64", 8), 11: ("int64", 8), 12: ("float64", 8),
}
_MIN_SIZE = {t: (s if s is not None else (8 if t == T_STRING else 12)) for t, (_, s) in
             _VALUE_TYPES.items()}  # array: elem type + count

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (block size in elements, bytes per block), from the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (int(b), int(s)) for t, (b, s) in GGML_QUANT_SIZES.items()}


@dataclass
class Field:
    """One number in the header the fuzzer may rewrite: where it is, how wide, what it is."""

    pos: int
    width: int  # bytes: 4 or 8
    kind: str  # "n_tensors", "n_kv", "str_len", "value_type", "arr_type", "arr_count",
    #            "n_dims", "dim", "tensor_type", "tensor_offset", "value"


@dataclass
class GGUFLayout:
    version: int
    n_tensors: int
    n_kv: int
    alignment: int
    data_start: int
    fields: list[Field] = field(default_factory=list)
    # (name, type id, dims ne0-first, offset, nbytes)
    tensors: list[tuple[str, int, tuple[int, ...], int, int]] = field(default_factory=list)


class _Scanner:
    def __init__(self, buf, name: str, record: bool):
        self.buf, self.name, self.end = buf, name, len(buf)
        self.record = record
        self.fields: list[Field] = []

    def bad(self, what: str) -> BadModel:
        return BadModel(f"{self.name}: {what}")

    def need(self, off: int, n: int, what: str) -> None:
        if n > self.end - off:
            raise self.bad(f"truncated: {what} at offset {off} needs {n} bytes, "
                           f"{max(self.end - off, 0)} left")

    def u32(self, off: int, what: str, kind: str | None = None) -> int:
        self.need(off, 4, what)
        if kind and self.record:
            self.fields.append(Field(off, 4, kind))
        return _U32.unpack_from(self.buf, off)[0]

    def u64(self, off: int, what: str, kind: str | None = None) -> int:
        self.need(off, 8, what)
        if kind and self.record:
            self.fields.append(Field(off, 8, kind))
        return _U64.unpack_from(self.buf, off)[0]

    def string(self, off: int, what: str) -> tuple[int, int]:
        """-> (offset of the bytes, length); the length checked against the file."""
        n = self.u64(off, f"{what} length", "str_len")
        off += 8
        if n > self.end - off:
            raise self.bad(f"{what} length {n} exceeds the {self.end - off} bytes left "
                           f"(offset {off - 8})")
        return off, n

    def skip_strings(self, off: int, count: int, what: str) -> int:
        # the hot loop: 49k-entry vocab and merges arrays; lengths only, no decoding
        buf, end, unpack = self.buf, self.end, _U64.unpack_from
        for i in range(count):
            if end - off < 8:
                raise self.bad(f"truncated: {what}[{i}] length at offset {off}")
            n = unpack(buf, off)[0]
            off += 8
            if n > end - off:
                raise self.bad(f"{what}[{i}] length {n} exceeds the {end - off} bytes left "
                               f"(offset {off - 8})")
            off += n
        return off

    def value(self, off: int, vtype: int, what: str, depth: int = 0) -> int:
        """Skip one value of type vtype at off; return the offset after it."""
        if vtype not in _VALUE_TYPES:
            raise self.bad(f"{what}: unknown value type id {vtype}")
        size = _VALUE_TYPES[vtype][1]
        if size is not None:
            if self.record:
                self.fields.append(Field(off, size, "value"))
            self.need(off, size, what)
            return off + size
        if vtype == T_STRING:
            s, n = self.string(off, what)
            return s + n
        # array: element type u32, count u64, elements
        if depth >= MAX_ARRAY_DEPTH:
            raise self.bad(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = self.u32(off, f"{what} element type", "arr_type")
        if etype not in _VALUE_TYPES:
            raise self.bad(f"{what}: unknown array element type id {etype}")
        count = self.u64(off + 4, f"{what} element count", "arr_count")
        off += 12
        if count * _MIN_SIZE[etype] > self.end - off:
            raise self.bad(f"{what}: array count {count} of {_VALUE_TYPES[etype][0]} exceeds "
                           f"the {self.end - off} bytes left (offset {off - 8})")
        esize = _VALUE_TYPES[etype][1]
        if esize is not None:
            return off + count * esize
        if etype == T_STRING:
            if self.record:  # a few element lengths are enough targets for the fuzzer
                for _ in range(min(count, 3)):
                    s, n = self.string(off, f"{what}[]")
                    off = s + n
                return self.skip_strings(off, count - min(count, 3), what)
            return self.skip_strings(off, count, what)
        for i in range(count):
            off = self.value(off, etype, f"{what}[{i}]", depth + 1)
        return off


def scan_gguf(buf, name: str = "<buffer>", record: bool = False) -> GGUFLayout:
    """Validate the GGUF structure held in `buf` (bytes, mmap, memoryview)."""
    sc = _Scanner(buf, name, record)
    size = len(buf)
    if size < HEADER_BYTES:
        raise BadModel(f"{name}: truncated GGUF ({size} bytes, the header needs {HEADER_BYTES})")
    magic = bytes(buf[0:4])
    if magic != b"GGUF":
        raise BadModel(f"{name}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = _U32.unpack_from(buf, 4)[0]
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file: not supported)" if swapped in (2, 3) else ""
        raise BadModel(f"{name}: unsupported GGUF version {version}{hint} (supported: 2, 3)")
    n_tensors = sc.u64(8, "tensor count", "n_tensors")
    n_kv = sc.u64(16, "kv count", "n_kv")
    room = size - HEADER_BYTES
    if n_kv > room // MIN_KV_BYTES:
        raise BadModel(f"{name}: kv count {n_kv} impossible in a {size}-byte file")
    if n_tensors > room // MIN_TENSOR_INFO_BYTES \
            or n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > room:
        raise BadModel(f"{name}: tensor count {n_tensors} (with {n_kv} kv) impossible in a "
                       f"{size}-byte file")

    off = HEADER_BYTES
    alignment = DEFAULT_ALIGNMENT
    keys: set[bytes] = set()
    for k in range(n_kv):
        s, n = sc.string(off, f"kv[{k}] key")
        key_b = bytes(buf[s:s + n])
        try:
            key = key_b.decode("utf-8")
        except UnicodeDecodeError:
            raise BadModel(f"{name}: kv[{k}] key {key_b[:40]!r} is not UTF-8") from None
        if key_b in keys:
            raise BadModel(f"{name}: duplicate metadata key {key!r}")
        keys.add(key_b)
        off = s + n
        vtype = sc.u32(off, f"key {key!r} value type", "value_type")
        off += 4
        if key == "general.alignment":
            if vtype != T_UINT32:
                tname = _VALUE_TYPES.get(vtype, ("?",))[0]
                raise BadModel(f"{name}: general.alignment has type {tname} (id {vtype}), "
                               "expected uint32")
            alignment = sc.u32(off, "general.alignment")
            if alignment == 0 or alignment & (alignment - 1):
                raise BadModel(f"{name}: general.alignment = {alignment} is not a power of two")
        off = sc.value(off, vtype, f"key {key!r}")

    qsizes = _quant_sizes()
    infos = []
    names: set[bytes] = set()
    for t in range(n_tensors):
        s, n = sc.string(off, f"tensor[{t}] name")
        name_b = bytes(buf[s:s + n])
        try:
            tname = name_b.decode("utf-8")
        except UnicodeDecodeError:
            raise BadModel(f"{name}: tensor[{t}] name {name_b[:40]!r} is not UTF-8") from None
        if name_b in names:
            raise BadModel(f"{name}: duplicate tensor name {tname!r}")
        names.add(name_b)
        off = s + n
        n_dims = sc.u32(off, f"tensor {tname!r} n_dims", "n_dims")
        off += 4
        if not 1 <= n_dims <= MAX_DIMS:
            raise BadModel(f"{name}: tensor {tname!r} n_dims = {n_dims} (must be 1..{MAX_DIMS})")
        dims = []
        n_el = 1
        for d in range(n_dims):
            v = sc.u64(off, f"tensor {tname!r} dim {d}", "dim")
            off += 8
            if v < 1:
                raise BadModel(f"{name}: tensor {tname!r} dim {d} = {v} (must be >= 1)")
            n_el *= v
            if n_el >= MAX_ELEMENTS:
                raise BadModel(f"{name}: tensor {tname!r} has too many elements "
                               f"(dims {dims + [v]}, product >= 2^62)")
            dims.append(v)
        ttype = sc.u32(off, f"tensor {tname!r} type", "tensor_type")
        off += 4
        if ttype not in qsizes:
            raise BadModel(f"{name}: tensor {tname!r} has unknown ggml type id {ttype}")
        block, bsize = qsizes[ttype]
        if dims[0] % block:
            raise BadModel(f"{name}: tensor {tname!r} row length {dims[0]} is not a multiple "
                           f"of its type's block size {block} (type id {ttype})")
        toff = sc.u64(off, f"tensor {tname!r} offset", "tensor_offset")
        off += 8
        infos.append((tname, ttype, tuple(dims), toff, n_el // block * bsize))

    data_start = off + (-off) % alignment
    if n_tensors and data_start > size:
        raise BadModel(f"{name}: truncated: data section starts at {data_start}, file has {size} "
                       "bytes")
    data_len = size - data_start
    for tname, _, _, toff, nbytes in infos:
        if toff % alignment:
            raise BadModel(f"{name}: tensor {tname!r} offset {toff} is not a multiple of the "
                           f"alignment {alignment}")
        if toff > data_len or nbytes > data_len - toff:
            raise BadModel(f"{name}: tensor {tname!r} data [{toff}, {toff + nbytes}) lies outside "
                           f"the {data_len}-byte data section (truncated file?)")
    prev_end, prev_name = 0, None
    for tname, _, _, toff, nbytes in sorted(infos, key=lambda x: (x[3], x[4])):
        if toff < prev_end:
            raise BadModel(f"{name}: tensors {prev_name!r} and {tname!r} overlap "
                           f"(offset {toff} < {prev_end})")
        prev_end, prev_name = toff + nbytes, tname
    return GGUFLayout(version, n_tensors, n_kv, alignment, data_start, sc.fields, infos)


def check_gguf_file(path: str | os.PathLike) -> GGUFLayout:
    """Raise BadModel unless `path` is a structurally sound GGUF file (see module doc)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise BadModel(f"{p}: no such file") from None
    except OSError as e:
        raise BadModel(f"{p}: cannot read ({e.strerror or e})") from None
    if size < HEADER_BYTES:
        raise BadModel(f"{p}: truncated GGUF ({size} bytes, the header needs {HEADER_BYTES})")
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return scan_gguf(mm, str(p))
    except OSError as e:
        raise BadModel(f"{p}: cannot read ({e.strerror or e})") from None
