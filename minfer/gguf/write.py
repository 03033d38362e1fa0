"""Writing GGUF files: `write_gguf(path, arch, metadata, tensors)` on top of gguf.GGUFWriter.

Used by `minfer quantize`, `minfer synth` and the model slicer. Three properties matter:

- Types kept. A metadata value may be a `gguf.GGUFValue` (explicit type), a `gguf.ReaderField`
  (copied from an existing file: its value types are taken from the field, so uint32 stays
  uint32 and arrays keep their element type), or a plain Python value, typed the way llama.cpp
  reads llama keys: bool -> BOOL, int -> UINT32 (INT32 if negative, 64-bit if it does not fit),
  float -> FLOAT32, str -> STRING, list -> ARRAY of the first element's type (ints as INT32,
  like `tokenizer.ggml.token_type`). `metadata_from_reader` copies a whole file's metadata.
- Streaming. Tensors are `(name, qtype, shape, data)` with shape in numpy order [rows, cols]
  (= [N, K] for a linear weight) and data either the array itself (raw encoded bytes as uint8,
  or f32 / f16 values; a memory-mapped view is fine) or a zero-argument callable returning it.
  The header needs every tensor's size first, so the infos are written up front (from qtype and
  shape) and each callable is called only when its data is written, once, in order: an 8B model
  is never held in memory at once.
- Atomic (minfer.host.fileio.atomic_output). The file is written under a temporary name in the
  destination folder and renamed into place at the end; an error or a signal removes the
  temporary file, and an existing output that is not a regular file is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from minfer.errors import BadInput
from minfer.host.fileio import atomic_output

TensorData = Union[np.ndarray, Callable[[], np.ndarray]]
TensorEntry = tuple[str, int, tuple[int, ...], TensorData]  # (name, qtype, shape, data)

# Keys the writer owns (GGUFWriter adds general.architecture itself; GGUF.* are the reader's
# pseudo-fields for the header).
_READER_PSEUDO_PREFIX = "GGUF."


def _typed_value(key: str, value: Any):
    """A GGUFValue for `value`, keeping the type it already carries (see the module doc)."""
    import gguf

    V = gguf.GGUFValueType
    if isinstance(value, gguf.GGUFValue):
        if value.type == V.ARRAY and value.sub_type == V.ARRAY and value.value:
            # minfer.gguf.header gives nested arrays flattened: writing them would lie
            raise BadInput(f"metadata {key!r}: nested arrays are not supported")
        return value
    if isinstance(value, gguf.ReaderField):
        if not value.types:
            raise BadInput(f"metadata {key!r}: reader field without a type")
        main = value.types[0]
        sub = value.types[-1] if main == V.ARRAY else None
        if main == V.ARRAY and len(value.types) > 2:
            raise BadInput(f"metadata {key!r}: nested arrays are not supported")
        return gguf.GGUFValue(value.contents(), main, sub)
    if isinstance(value, (bool, np.bool_)):
        return gguf.GGUFValue(bool(value), V.BOOL)
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return gguf.GGUFValue(v, V.UINT32)
        if -(2**31) <= v < 0:
            return gguf.GGUFValue(v, V.INT32)
        if 0 <= v < 2**64:
            return gguf.GGUFValue(v, V.UINT64)
        if -(2**63) <= v < 0:
            return gguf.GGUFValue(v, V.INT64)
        raise BadInput(f"metadata {key!r}: integer {v} does not fit 64 bits")
    if isinstance(value, (float, np.floating)):
        return gguf.GGUFValue(float(value), V.FLOAT32)
    if isinstance(value, str):
        return gguf.GGUFValue(value, V.STRING)
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not items:
            raise BadInput(f"metadata {key!r}: empty arrays cannot be written to GGUF")
        first = items[0]
        if isinstance(first, str):
            sub = V.STRING
        elif isinstance(first, bool):
            sub = V.BOOL
        elif isinstance(first, int):
            sub = V.INT32
        elif isinstance(first, float):
            sub = V.FLOAT32
        else:
            raise BadInput(f"metadata {key!r}: unsupported array element {type(first).__name__}")
        kinds = {str: (str,), bool: (bool,), int: (int,), float: (float, int)}
        ok = {V.STRING: str, V.BOOL: bool, V.INT32: int, V.FLOAT32: float}[sub]
        if not all(
            isinstance(x, kinds[ok]) and (ok is bool or not isinstance(x, bool)) for x in items
        ):
            raise BadInput(f"metadata {key!r}: array elements of mixed types")
        return gguf.GGUFValue(items, V.ARRAY, sub)
    raise BadInput(f"metadata {key!r}: unsupported value type {type(value).__name__}")


def metadata_from_reader(reader) -> dict[str, Any]:
    """Every metadata field of a loader GGUFModel, a gguf_header.GGUFHeader or an open
    gguf.GGUFReader, types kept.

    Returns {key: gguf.GGUFValue}, ready to edit (e.g. replace `<arch>.block_count` with a
    `gguf.GGUFValue(n, GGUFValueType.UINT32)`) and pass to write_gguf.
    """
    import gguf

    header = getattr(reader, "header", reader)  # minfer.gguf.loader.GGUFModel -> its GGUFHeader
    if hasattr(header, "kv"):  # the fast parser's values are GGUFValues already
        return {
            k: gguf.GGUFValue(
                list(v.value) if isinstance(v.value, list) else v.value, v.type, v.sub_type
            )
            for k, v in header.kv.items()
        }
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith(_READER_PSEUDO_PREFIX):
            continue
        out[key] = _typed_value(key, field)
    return out


def expected_nbytes(name: str, qtype: int, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of `qtype` and numpy `shape` occupies; raises BadInput if impossible."""
    import gguf

    try:
        qt = gguf.GGMLQuantizationType(int(qtype))
    except ValueError:
        raise BadInput(f"tensor {name!r}: unknown GGML type id {qtype}") from None
    if not shape or any(int(s) <= 0 for s in shape):
        raise BadInput(f"tensor {name!r}: bad shape {list(shape)}")
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    cols = int(shape[-1])
    if cols % bs:
        raise BadInput(
            f"tensor {name!r}: row length {cols} is not a multiple of the {qt.name} block size {bs}"
        )
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * (cols // bs) * ts


def _check_data(name: str, qtype: int, arr: np.ndarray, nbytes: int) -> np.ndarray:
    import gguf

    if not isinstance(arr, np.ndarray):
        raise BadInput(f"tensor {name!r}: data is {type(arr).__name__}, expected a numpy array")
    qt = gguf.GGMLQuantizationType(int(qtype))
    want = {
        gguf.GGMLQuantizationType.F32: np.float32,
        gguf.GGMLQuantizationType.F16: np.float16,
    }.get(qt)
    if want is not None and arr.dtype not in (np.dtype(want), np.dtype(np.uint8)):
        raise BadInput(
            f"tensor {name!r}: {qt.name} data has dtype {arr.dtype}, expected "
            f"{np.dtype(want)} (or its raw bytes as uint8)"
        )
    if want is None and arr.dtype != np.uint8:
        raise BadInput(
            f"tensor {name!r}: {qt.name} data must be raw bytes (uint8), got {arr.dtype}"
        )
    if arr.nbytes != nbytes:
        raise BadInput(
            f"tensor {name!r}: {arr.nbytes} bytes of data, {qt.name} of this shape needs {nbytes}"
        )
    if arr.dtype.byteorder == ">":
        raise BadInput(f"tensor {name!r}: big-endian data")
    return arr


def write_gguf(
    path: str | os.PathLike,
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Iterable[TensorEntry],
    progress: bool = True,
) -> Path:
    """Write a GGUF v3 file atomically; returns its path. See the module docstring."""
    import gguf

    from minfer.host.fileio import check_output_path

    path = check_output_path(path)  # a device, FIFO or directory there is never replaced
    meta = {k: _typed_value(k, v) for k, v in metadata.items()}
    a = meta.pop("general.architecture", None)  # GGUFWriter writes it from `arch`
    if a is not None and a.value != arch:
        raise BadInput(f"metadata general.architecture={a.value!r} contradicts arch={arch!r}")
    entries = []
    seen: set[str] = set()
    for entry in tensors:
        if len(entry) != 4:
            raise BadInput(f"tensor entry {entry!r:.80}: expected (name, qtype, shape, data)")
        name, qtype, shape, data = entry
        shape = tuple(int(s) for s in shape)
        if name in seen:
            raise BadInput(f"tensor {name!r} given twice")
        seen.add(name)
        entries.append((name, int(qtype), shape, data, expected_nbytes(name, qtype, shape)))

    total = sum(e[4] for e in entries)
    with atomic_output(path) as tmp:  # removed on any error or signal; OSError -> one line
        _write(gguf.GGUFWriter(tmp, arch), meta, entries, total, path.name, progress)
    return path


def _write(w, meta, entries, total: int, label: str, progress: bool) -> None:
    import gguf

    if "general.alignment" in meta:
        w.data_alignment = int(meta["general.alignment"].value)
    for key, v in meta.items():
        w.add_key_value(key, v.value, v.type, v.sub_type)
    for name, qtype, shape, _data, nbytes in entries:
        # tensor_dtype is a placeholder: with raw_dtype set and not uint8, the shape is taken
        # as the element shape (numpy order; the writer reverses it into GGUF's ne order).
        w.add_tensor_info(
            name, shape, np.dtype(np.float32), nbytes, raw_dtype=gguf.GGMLQuantizationType(qtype)
        )
    bar = None
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        from minfer.host.progress import bar as progress_bar

        bar = progress_bar(
            progress, total=total, unit="B", unit_scale=True, desc=f"writing {label}"
        )
        for name, qtype, _shape, data, nbytes in entries:
            arr = data() if callable(data) else data
            arr = _check_data(name, qtype, arr, nbytes)
            w.write_tensor_data(np.ascontiguousarray(arr))
            del arr
            if bar is not None:
                bar.update(nbytes)
    finally:
        w.close()
        if bar is not None:
            bar.close()
