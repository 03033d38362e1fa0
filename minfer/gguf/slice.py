"""Slice a GGUF model to its first N layers under a size cap (the device takes <= 64 MiB per call).

`slice_model(src, dst, layers=None, max_mib=60.0)` keeps token_embd, output_norm, output (if
present) and blk.0 .. blk.N-1, copies the metadata with its value types (minfer.gguf.header)
and sets `<arch>.block_count` = N. With layers=None it picks the largest N whose file fits
`max_mib`; with layers given it checks that N fits. The output size is computed exactly from
the header layout before anything is written (metadata + tensor infos + aligned tensor data),
and the written file is checked against it.

SmolLM2-135M is the use case: its token_embd alone is ~27 MB (Q8_0 49152x576), and each layer
is ~2.2 MB at Q4_1, so about 13 layers fit in 60 MiB.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from minfer.errors import BadInput, BadModel

_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class SlicePlan:
    layers: int  # kept
    total_layers: int
    bytes: int  # exact size of the output file


def _kept(header, n: int) -> list:
    out = []
    for t in header.tensors:
        m = _BLK.match(t.name)
        if m is None or int(m.group(1)) < n:
            out.append(t)
    return out


def _kv_bytes(kv: dict) -> int:
    """Bytes of the metadata section as gguf.GGUFWriter packs it (independent of key order)."""
    import gguf

    w = gguf.GGUFWriter(None, kv["general.architecture"].value)
    n = 0
    for k, v in kv.items():
        n += len(w._pack_val(k, gguf.GGUFValueType.STRING, add_vtype=False))
        n += len(w._pack_val(v.value, v.type, add_vtype=True, sub_type=v.sub_type))
    return n


def _file_size(header, kv_bytes: int, tensors: list) -> int:
    """Exact size of a GGUF v3 file with this metadata and these tensors (gguf's layout)."""
    ti = sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8 for t in tensors)
    a = header.alignment
    size = 24 + kv_bytes + ti
    size = (size + a - 1) // a * a
    for t in tensors:
        size += (t.nbytes + a - 1) // a * a
    return size


def _metadata(header, n: int) -> dict:
    import gguf

    kv = dict(header.kv)
    arch = kv["general.architecture"].value
    key = f"{arch}.block_count"
    old = kv.get(key)
    vtype = old.type if old is not None else gguf.GGUFValueType.UINT32
    kv[key] = gguf.GGUFValue(n, vtype)
    return kv


def plan_slice(
    src: str | os.PathLike, layers: int | None = None, max_mib: float = 60.0
) -> SlicePlan:
    from minfer.gguf.header import read_header

    h = read_header(src)
    if "general.architecture" not in h.kv:
        raise BadModel(f"{src}: metadata key 'general.architecture' missing")
    arch = h.kv["general.architecture"].value
    bc = h.kv.get(f"{arch}.block_count")
    if bc is None:
        raise BadModel(f"{src}: metadata key '{arch}.block_count' missing")
    total = int(bc.value)
    cap = int(max_mib * 2**20)

    kv_bytes = _kv_bytes(_metadata(h, 1))  # block_count's value does not change its size

    def size(n: int) -> int:
        return _file_size(h, kv_bytes, _kept(h, n))

    if layers is not None:
        if not 1 <= layers <= total:
            raise BadInput(f"--layers {layers}: the model has {total} layers (choose 1..{total})")
        s = size(layers)
        if s > cap:
            raise BadInput(
                f"{layers} layers of {Path(src).name} make {s / 2**20:.1f} MiB, over "
                f"the {max_mib:g} MiB cap"
            )
        return SlicePlan(layers, total, s)
    s1 = size(1)
    if s1 > cap:
        raise BadInput(
            f"even 1 layer of {Path(src).name} makes {s1 / 2**20:.1f} MiB, over the "
            f"{max_mib:g} MiB cap (token_embd/output alone are too big)"
        )
    lo, hi = 1, total  # size(n) grows with n: largest n with size(n) <= cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(mid) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return SlicePlan(lo, total, size(lo))


def slice_model(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    layers: int | None = None,
    max_mib: float = 60.0,
    progress: bool = False,
) -> SlicePlan:
    """Write the first N layers of `src` to `dst` (see the module docstring)."""
    from minfer.gguf.header import read_header, tensor_bytes
    from minfer.gguf.write import write_gguf

    if Path(dst).resolve() == Path(src).resolve():
        raise BadInput(f"{dst}: output would overwrite the input")
    plan = plan_slice(src, layers, max_mib)
    h = read_header(src)
    kv = _metadata(h, plan.layers)
    arch = kv["general.architecture"].value
    tensors = [(t.name, t.qtype, t.shape, tensor_bytes(src, t)) for t in _kept(h, plan.layers)]
    path = write_gguf(dst, arch, kv, tensors, progress=progress)
    got = path.stat().st_size
    if got != plan.bytes:  # the size model above is what enforces the cap: keep it honest
        path.unlink()
        raise BadModel(f"slice of {src}: wrote {got} bytes, planned {plan.bytes} (bug)")
    return plan
