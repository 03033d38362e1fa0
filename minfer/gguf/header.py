"""The GGUF header parser: validates every number before trusting it and parses in one pass.

The `gguf` package's reader believes every count and length it reads (a damaged or hostile
file can make it loop 2^60 times, allocate without bound, or index past the end of the map),
and it builds a numpy view per metadata item, which takes seconds on a 49152-token vocabulary.
This module walks the header once with struct/bytes slicing, every number checked against the
bytes that remain, and raises BadModel with a one-line message (file, field, value) at the
first problem:

  header   magic "GGUF", version 2 or 3 (little-endian), tensor and kv counts that fit the
           file (each kv needs >= 13 bytes, each tensor info >= 32)
  kv       key: a UTF-8 string, no duplicates; value type a known id; strings UTF-8; strings
           and arrays (count x minimal element size) inside the file; arrays nested at most 2
           deep; general.alignment a uint32 power of two
  tensors  name UTF-8 and unique; n_dims 1..4; dims >= 1; element count < 2^62; type a known
           ggml type; the row length a multiple of the type's block size; offset aligned;
           offset + size inside the data section; no two tensors overlapping; tensors
           back to back in header order, each padded to the alignment, the file ending at the
           last one (llama.cpp's rule: this is what catches a wrong general.alignment)

API (the `gguf` package stays the reference for type ids, GGML_QUANT_SIZES and dequant):
  read_header(path) -> GGUFHeader: .kv {key: gguf.GGUFValue(value, type, sub_type)} (python
      values as gguf's ReaderField.contents() gives them: str, int, float, bool, list; the
      GGUF.* pseudo-keys of the reader are not in .kv), .tensors [HeaderTensor(name, qtype,
      shape numpy order, absolute offset, nbytes)], .version, .alignment, .data_start, ...
  open_gguf(path) -> (GGUFHeader, np.memmap uint8 of the whole file, read-only)
  tensor_view(data, t) -> t's data as gguf.GGUFReader gives it (a view into `data`)
  tensor_bytes(path, t) -> t's raw bytes, memory-mapped (uint8 [nbytes])
  scan_gguf(buf, name, record=False): the same parse on a buffer; with record=True the header
      also lists where each count, length, type and offset lives (the fuzz tests aim there).
Nested arrays (array of arrays) come back flattened, as ReaderField.contents() gives them,
with sub_type ARRAY; gguf_write refuses to write them.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from minfer.errors import BadModel

HEADER_BYTES = 24
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
MAX_DIMS = 4
MAX_ELEMENTS = 1 << 62
MAX_ARRAY_DEPTH = 2
DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> (name, fixed size or None for string/array)
T_BOOL, T_STRING, T_ARRAY, T_UINT32 = 7, 8, 9, 4
_VALUE_TYPES = {
    0: ("uint8", 1),
    1: ("int8", 1),
    2: ("uint16", 2),
    3: ("int16", 2),
    4: ("uint32", 4),
    5: ("int32", 4),
    6: ("float32", 4),
    7: ("bool", 1),
    8: ("string", None),
    9: ("array", None),
    10: ("uint64", 8),
    11: ("int64", 8),
    12: ("float64", 8),
}
_MIN_SIZE = {
    t: (s if s is not None else (8 if t == T_STRING else 12)) for t, (_, s) in _VALUE_TYPES.items()
}  # array: elem type + count
# fixed-size types: struct for one value, numpy dtype for an array of them (bool via numpy
# too, so a byte 2 reads as True exactly as gguf's reader reads it)
_STRUCT = {
    t: struct.Struct(f)
    for t, f in {
        0: "<B",
        1: "<b",
        2: "<H",
        3: "<h",
        4: "<I",
        5: "<i",
        6: "<f",
        10: "<Q",
        11: "<q",
        12: "<d",
    }.items()
}
_DTYPE = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}

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


class HeaderTensor(NamedTuple):
    name: str
    qtype: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # numpy order [rows, cols] (GGUF's ne reversed)
    offset: int  # absolute file offset of the data
    nbytes: int


@dataclass
class GGUFHeader:
    name: str  # the file (for messages)
    version: int
    n_tensors: int
    n_kv: int
    alignment: int
    data_start: int
    kv: dict[str, Any] = field(default_factory=dict)  # key -> gguf.GGUFValue, file order
    tensors: list[HeaderTensor] = field(default_factory=list)  # file order
    fields: list[Field] = field(default_factory=list)  # only with record=True

    @property
    def path(self) -> Path:
        return Path(self.name)


class _Scanner:
    def __init__(self, buf, name: str, record: bool):
        self.buf, self.name, self.end = buf, name, len(buf)
        self.record = record
        self.fields: list[Field] = []

    def bad(self, what: str) -> BadModel:
        return BadModel(f"{self.name}: {what}")

    def need(self, off: int, n: int, what: str) -> None:
        if n > self.end - off:
            raise self.bad(
                f"truncated: {what} at offset {off} needs {n} bytes, {max(self.end - off, 0)} left"
            )

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

    def raw_string(self, off: int, what: str) -> tuple[bytes, int]:
        """-> (the bytes, offset after them); the length checked against the file."""
        n = self.u64(off, f"{what} length", "str_len")
        off += 8
        if n > self.end - off:
            raise self.bad(
                f"{what} length {n} exceeds the {self.end - off} bytes left (offset {off - 8})"
            )
        return bytes(self.buf[off : off + n]), off + n

    def string(self, off: int, what: str) -> tuple[str, int]:
        b, off = self.raw_string(off, what)
        try:
            return b.decode("utf-8"), off
        except UnicodeDecodeError:
            raise self.bad(f"{what} {b[:40]!r} is not UTF-8") from None

    def strings(self, off: int, count: int, what: str, out: list) -> int:
        # the hot loop: 49k-entry vocab and merges arrays (~40 ms each on bytes or mmap)
        buf, end, unpack, add = self.buf, self.end, _U64.unpack_from, out.append
        start = len(out)
        try:
            for i in range(count):
                if end - off < 8:
                    raise self.bad(f"truncated: {what}[{i}] length at offset {off}")
                n = unpack(buf, off)[0]
                off += 8
                if n > end - off:
                    raise self.bad(
                        f"{what}[{i}] length {n} exceeds the {end - off} bytes left "
                        f"(offset {off - 8})"
                    )
                add(buf[off : off + n].decode("utf-8"))
                off += n
        except UnicodeDecodeError:
            i = len(out) - start
            raise self.bad(f"{what}[{i}] is not UTF-8") from None
        return off

    def value(self, off: int, vtype: int, what: str, depth: int = 0) -> tuple[Any, int, int]:
        """Parse one value of type vtype at off -> (python value, offset after, sub type).

        sub type: for an array the element type (T_ARRAY for nested arrays, whose leaves
        come back flattened like gguf's ReaderField.contents()); else -1.
        """
        if vtype not in _VALUE_TYPES:
            raise self.bad(f"{what}: unknown value type id {vtype}")
        size = _VALUE_TYPES[vtype][1]
        if size is not None:
            if self.record:
                self.fields.append(Field(off, size, "value"))
            self.need(off, size, what)
            if vtype == T_BOOL:
                return self.buf[off] != 0, off + 1, -1
            return _STRUCT[vtype].unpack_from(self.buf, off)[0], off + size, -1
        if vtype == T_STRING:
            s, off = self.string(off, what)
            return s, off, -1
        # array: element type u32, count u64, elements
        if depth >= MAX_ARRAY_DEPTH:
            raise self.bad(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = self.u32(off, f"{what} element type", "arr_type")
        if etype not in _VALUE_TYPES:
            raise self.bad(f"{what}: unknown array element type id {etype}")
        count = self.u64(off + 4, f"{what} element count", "arr_count")
        off += 12
        if count * _MIN_SIZE[etype] > self.end - off:
            raise self.bad(
                f"{what}: array count {count} of {_VALUE_TYPES[etype][0]} exceeds "
                f"the {self.end - off} bytes left (offset {off - 8})"
            )
        esize = _VALUE_TYPES[etype][1]
        if esize is not None:
            vals = np.frombuffer(self.buf, np.dtype(_DTYPE[etype]), count, off).tolist()
            return vals, off + count * esize, etype
        out: list = []
        if etype == T_STRING:
            if self.record:  # a few element lengths are enough targets for the fuzzer
                for _ in range(min(count, 3)):
                    s, off = self.string(off, f"{what}[]")
                    out.append(s)
                return out, self.strings(off, count - min(count, 3), what, out), etype
            return out, self.strings(off, count, what, out), etype
        for i in range(count):  # nested arrays: flattened (gguf's reader does the same)
            v, off, _ = self.value(off, etype, f"{what}[{i}]", depth + 1)
            out.extend(v)
        return out, off, etype


def scan_gguf(buf, name: str = "<buffer>", record: bool = False) -> GGUFHeader:
    """Validate and parse the GGUF header held in `buf` (bytes, bytearray or mmap.mmap)."""
    import gguf

    V = gguf.GGUFValueType
    sc = _Scanner(buf, name, record)
    size = len(buf)
    magic = bytes(buf[0:4])
    if size >= 4 and magic != b"GGUF":
        raise BadModel(f"{name}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    if size < HEADER_BYTES:
        raise BadModel(f"{name}: truncated GGUF ({size} bytes, the header needs {HEADER_BYTES})")
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
    if (
        n_tensors > room // MIN_TENSOR_INFO_BYTES
        or n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > room
    ):
        raise BadModel(
            f"{name}: tensor count {n_tensors} (with {n_kv} kv) impossible in a {size}-byte file"
        )

    off = HEADER_BYTES
    alignment = DEFAULT_ALIGNMENT
    kv: dict[str, Any] = {}
    for k in range(n_kv):
        key_b, off = sc.raw_string(off, f"kv[{k}] key")
        try:
            key = key_b.decode("utf-8")
        except UnicodeDecodeError:
            raise BadModel(f"{name}: kv[{k}] key {key_b[:40]!r} is not UTF-8") from None
        if key in kv:
            raise BadModel(f"{name}: duplicate metadata key {key!r}")
        vtype = sc.u32(off, f"key {key!r} value type", "value_type")
        off += 4
        if key == "general.alignment":
            if vtype != T_UINT32:
                tname = _VALUE_TYPES.get(vtype, ("?",))[0]
                raise BadModel(
                    f"{name}: general.alignment has type {tname} (id {vtype}), expected uint32"
                )
            alignment = sc.u32(off, "general.alignment")
            if alignment == 0 or alignment & (alignment - 1):
                raise BadModel(f"{name}: general.alignment = {alignment} is not a power of two")
        value, off, sub = sc.value(off, vtype, f"key {key!r}")
        kv[key] = gguf.GGUFValue(value, V(vtype), V(sub) if sub >= 0 else None)

    qsizes = _quant_sizes()
    infos = []
    names: set[str] = set()
    for t in range(n_tensors):
        tname, off = sc.string(off, f"tensor[{t}] name")
        if tname in names:
            raise BadModel(f"{name}: duplicate tensor name {tname!r}")
        names.add(tname)
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
                raise BadModel(
                    f"{name}: tensor {tname!r} has too many elements "
                    f"(dims {dims + [v]}, product >= 2^62)"
                )
            dims.append(v)
        ttype = sc.u32(off, f"tensor {tname!r} type", "tensor_type")
        off += 4
        if ttype not in qsizes:
            raise BadModel(f"{name}: tensor {tname!r} has unknown ggml type id {ttype}")
        block, bsize = qsizes[ttype]
        if dims[0] % block:
            raise BadModel(
                f"{name}: tensor {tname!r} row length {dims[0]} is not a multiple "
                f"of its type's block size {block} (type id {ttype})"
            )
        toff = sc.u64(off, f"tensor {tname!r} offset", "tensor_offset")
        off += 8
        infos.append((tname, ttype, tuple(reversed(dims)), toff, n_el // block * bsize))

    data_start = off + (-off) % alignment
    if n_tensors and data_start > size:
        raise BadModel(
            f"{name}: truncated: data section starts at {data_start}, file has {size} bytes"
        )
    data_len = size - data_start
    for tname, _, _, toff, nbytes in infos:
        if toff % alignment:
            raise BadModel(
                f"{name}: tensor {tname!r} offset {toff} is not a multiple of the "
                f"alignment {alignment}"
            )
        if toff > data_len or nbytes > data_len - toff:
            raise BadModel(
                f"{name}: tensor {tname!r} data [{toff}, {toff + nbytes}) lies outside "
                f"the {data_len}-byte data section (truncated file?)"
            )
    prev_end, prev_name = 0, None
    for tname, _, _, toff, nbytes in sorted(infos, key=lambda x: (x[3], x[4])):
        if toff < prev_end:
            raise BadModel(
                f"{name}: tensors {prev_name!r} and {tname!r} overlap (offset {toff} < {prev_end})"
            )
        prev_end, prev_name = toff + nbytes, tname
    _check_layout(name, infos, alignment, data_start, data_len)
    tensors = [HeaderTensor(n, q, shape, data_start + toff, nb) for n, q, shape, toff, nb in infos]
    return GGUFHeader(name, version, n_tensors, n_kv, alignment, data_start, kv, tensors, sc.fields)


def _check_layout(name: str, infos: list, alignment: int, data_start: int, data_len: int) -> None:
    """The data section must be laid out as every GGUF writer lays it (llama.cpp's gguf.cpp
    refuses anything else): tensors back to back in header order, each padded to the alignment,
    and the file ending at the last tensor's end or its padded end. A general.alignment that
    differs from the one the file was written with moves data_start or the padded offsets, so
    this is where it is caught (the tensors would otherwise be read shifted: garbage)."""
    pos = 0
    for tname, _, _, toff, nbytes in infos:
        if toff != pos:
            raise BadModel(
                f"{name}: tensor {tname!r} at data offset {toff}, expected {pos} "
                f"(tensors back to back, padded to general.alignment {alignment}: "
                "a wrong alignment or a damaged offset)"
            )
        pos += nbytes + (-nbytes) % alignment
    if infos:
        end = infos[-1][3] + infos[-1][4]
        if data_len not in (end, pos):
            raise BadModel(
                f"{name}: the data section holds {data_len} bytes from offset "
                f"{data_start}, the tensors {end} ({pos} padded to general.alignment "
                f"{alignment}): a wrong alignment or trailing bytes"
            )


def _open(path: str | os.PathLike, keep_map: bool) -> tuple[GGUFHeader, np.memmap | None]:
    p = Path(path)
    from minfer.host.fileio import check_input_file

    check_input_file(p, "model", BadModel)  # by type, before an open() a FIFO would block
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:  # (mmap refuses an empty file): the message from scan
                scan_gguf(f.read(HEADER_BYTES), str(p))
            # parse from an mmap (bytes slices: the fastest for 49k strings), then map the
            # same open file once more as the numpy array the tensors are views of
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                header = scan_gguf(mm, str(p))
            data = np.memmap(f, dtype=np.uint8, mode="r") if keep_map else None
    except FileNotFoundError:
        raise BadModel(f"{p}: no such file") from None
    except IsADirectoryError:
        raise BadModel(f"{p}: is a directory, not a GGUF file") from None
    except OSError as e:  # permission, I/O error, special file; ENOMEM: exit 3
        from minfer.host.fileio import read_error

        raise read_error(
            e, p, "map the file" if e.errno == errno.ENOMEM else "read", BadModel
        ) from None
    except ValueError as e:  # mmap of something that is not a regular file
        raise BadModel(f"{p}: cannot map ({e})") from None
    return header, data


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Validate and parse `path`'s header (see the module doc); raises BadModel."""
    return _open(path, keep_map=False)[0]


def open_gguf(path: str | os.PathLike) -> tuple[GGUFHeader, np.memmap]:
    """The header, and the whole file as one read-only uint8 memory map (nothing read yet)."""
    return _open(path, keep_map=True)  # type: ignore[return-value]


def tensor_view(data: np.ndarray, t: HeaderTensor) -> np.ndarray:
    """t's data as gguf.GGUFReader gives it, a view into `data` (the file's uint8 map).

    F32/F16/F64/I8..I64: elements, shape t.shape; every other type (quantized, BF16): raw
    bytes uint8 [rows, row bytes] (what gguf.quants.dequantize takes).
    """
    import gguf

    Q = gguf.GGMLQuantizationType
    plain = {
        Q.F16: np.float16,
        Q.F32: np.float32,
        Q.F64: np.float64,
        Q.I8: np.int8,
        Q.I16: np.int16,
        Q.I32: np.int32,
        Q.I64: np.int64,
    }
    raw = data[t.offset : t.offset + t.nbytes]
    dt = plain.get(Q(t.qtype))
    if dt is not None:
        return raw.view(dt).reshape(t.shape)
    block, bsize = gguf.GGML_QUANT_SIZES[Q(t.qtype)]
    return raw.reshape(*t.shape[:-1], t.shape[-1] // block * bsize)


def tensor_bytes(path: str | os.PathLike, t: HeaderTensor) -> np.ndarray:
    """One tensor's raw bytes, memory-mapped read-only: uint8 [nbytes]."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
