"""Launchers for kernels/dequant.cu, and their numpy twins.

- `dequant_f16(rt, src_dev, qtype, N, K)`: raw GGUF rows [N, row_bytes] -> f16 [N, K],
  bit-identical to `dequant_f16_ref` (gguf's dequant cast to f16).
- `embed_rows(rt, table_dev, qtype, ids_dev, T, K, out_dev, V=...)`: rows ids[0..T) of a raw
  table [V, row_bytes] -> f32 [T, K], bit-identical to `embed_rows_ref`; an id outside [0, V)
  gives a row of NaN (the kernel never reads out of bounds).
Device buffers are pycuda DeviceAllocations, GPUArrays or integer addresses; sizes are checked
where the buffer knows its size (`.nbytes`), alignment always.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.errors import BadInput, GPUError
from minfer.quants import QuantTraits, dequantize, traits_of

KERNEL = "dequant"  # kernels/dequant.cu
THREADS = 256  # DQ_THREADS in the kernel


@dataclass(frozen=True)
class DequantConfig:
    """ctas_per_sm: persistent grid of sm_count * ctas_per_sm CTAs walking the work items
    (prefetching the next one); 0 (default, fastest measured on the H200) launches one CTA
    per work item instead."""

    ctas_per_sm: int = 0


def kernel_suffix(t: QuantTraits) -> str:
    """ggml's spelling of the type in entry names: q4_K, iq4_xs, bf16."""
    s = t.name.lower()
    return s[:-2] + "_K" if s.endswith("_k") else s


def items_per_row(t: QuantTraits, row_elems: int) -> int:
    """Work items of a row: EPC outputs each (EPC as in dq_run: 4096 for float types, else 8192)."""
    epc = 4096 if t.block_size == 1 else 8192
    return -(-row_elems // epc)


def _ptr(buf, what: str, align: int) -> np.uintp:
    if buf is None:
        raise BadInput(f"{what}: no device buffer given")
    addr = int(buf.gpudata) if hasattr(buf, "gpudata") else int(buf)
    if addr == 0 or addr % align:
        raise GPUError(f"{what}: device address 0x{addr:x} is not {align}-byte aligned")
    return np.uintp(addr)


def _check_size(buf, need: int, what: str) -> None:
    have = getattr(buf, "nbytes", None)
    if have is not None and int(have) < need:
        raise GPUError(f"{what}: buffer holds {int(have)} B, needs {need} B")


def _dims(N: int, K: int, what: str) -> tuple[int, int]:
    if int(N) != N or int(K) != K or N < 0 or K <= 0:
        raise BadInput(f"{what}: bad shape N={N}, K={K} (need N >= 0, K > 0)")
    return int(N), int(K)


def _grid(rt, n_items: int, cfg: DequantConfig) -> int:
    if cfg.ctas_per_sm <= 0:
        return n_items
    return max(1, min(n_items, rt.sm_count * cfg.ctas_per_sm))


def dequant_f16(
    rt, src_dev, qtype: int, N: int, K: int, out_dev=None, cfg: DequantConfig | None = None
):
    """src_dev: raw rows [N, row_bytes] of qtype -> out_dev: f16 [N, K] (allocated if None)."""
    cfg = cfg or DequantConfig()
    t = traits_of(qtype, "dequant_f16")
    N, K = _dims(N, K, f"dequant_f16 ({t.name})")
    src_bytes = N * t.row_bytes(K)  # raises Unsupported when K is not a multiple of the block
    _check_size(src_dev, src_bytes, f"dequant_f16 ({t.name}) source [{N}, {K}]")
    if out_dev is None:
        out_dev = rt.alloc(N * K * 2, f"dequant_f16 output [{N}, {K}]")
    _check_size(out_dev, N * K * 2, f"dequant_f16 ({t.name}) output [{N}, {K}]")
    src, out = _ptr(src_dev, "dequant_f16 source", 16), _ptr(out_dev, "dequant_f16 output", 16)
    if N == 0:
        return out_dev
    fn = rt.function(KERNEL, f"dq_f16_{kernel_suffix(t)}")
    n_items = items_per_row(t, N * K)  # the kernel treats the tensor as one flat row
    rt.launch(
        fn, (_grid(rt, n_items, cfg),), (THREADS,), (src, np.int64(src_bytes), out, np.int64(N * K))
    )
    return out_dev


def embed_rows(
    rt,
    table_dev,
    qtype: int,
    ids_dev,
    T: int,
    K: int,
    out_dev,
    *,
    V: int,
    cfg: DequantConfig | None = None,
):
    """table_dev: raw rows [V, row_bytes] of qtype; ids_dev: int32 [T] -> out_dev: f32 [T, K]."""
    cfg = cfg or DequantConfig()
    t = traits_of(qtype, "embed_rows")
    T, K = _dims(T, K, f"embed_rows ({t.name})")
    if int(V) != V or V <= 0:
        raise BadInput(f"embed_rows ({t.name}): bad table row count V={V}")
    rb = t.row_bytes(K)
    _check_size(table_dev, V * rb, f"embed_rows ({t.name}) table [{V}, {K}]")
    _check_size(ids_dev, T * 4, f"embed_rows ids [{T}]")
    _check_size(out_dev, T * K * 4, f"embed_rows output [{T}, {K}]")
    table = _ptr(table_dev, "embed_rows table", 16)
    ids, out = _ptr(ids_dev, "embed_rows ids", 4), _ptr(out_dev, "embed_rows output", 4)
    if T == 0:
        return out_dev
    fn = rt.function(KERNEL, f"embed_{kernel_suffix(t)}")
    n_items = T * items_per_row(t, K)
    rt.launch(
        fn,
        (_grid(rt, n_items, cfg),),
        (THREADS,),
        (table, np.int64(V * rb), np.int64(rb), np.int64(V), ids, np.int32(T), out, np.int64(K)),
    )
    return out_dev


# ---- numpy twins ------------------------------------------------------------------------------
def _dequant_rows(raw: np.ndarray, t: QuantTraits, N: int, K: int) -> np.ndarray:
    """gguf's dequant of raw rows -> float32 [N, K]."""
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(N, t.row_bytes(K))
    if N == 0:
        return np.zeros((0, K), np.float32)
    if t.name == "F32":
        return rows.view(np.float32).copy()
    return dequantize(rows, t.qtype).reshape(N, K)


def dequant_f16_ref(raw: np.ndarray, qtype: int, N: int, K: int) -> np.ndarray:
    """Twin of dequant_f16: raw rows [N, row_bytes] -> f16 [N, K]."""
    t = traits_of(qtype, "dequant_f16_ref")
    N, K = _dims(N, K, "dequant_f16_ref")
    with np.errstate(over="ignore"):  # |w| > 65504 becomes inf, as on the GPU
        return _dequant_rows(raw, t, N, K).astype(np.float16)


def embed_rows_ref(table_raw: np.ndarray, qtype: int, ids: np.ndarray, K: int) -> np.ndarray:
    """Twin of embed_rows: table [V, row_bytes], ids [T] -> f32 [T, K] (NaN rows for bad ids)."""
    t = traits_of(qtype, "embed_rows_ref")
    rows = np.ascontiguousarray(table_raw).view(np.uint8).reshape(-1, t.row_bytes(K))
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    ok = (ids >= 0) & (ids < rows.shape[0])
    out = np.full((ids.size, K), np.nan, np.float32)
    if ok.any():
        out[ok] = _dequant_rows(rows[ids[ok]], t, int(ok.sum()), K)
    return out
