"""Quantizers byte-identical to llama.cpp's reference ones (ggml-quants.c `quantize_row_*_ref`).

llama.cpp quantizes without an importance matrix through `quantize_<type>(..., quant_weights=NULL)`,
which calls `quantize_row_<type>_ref` for every type here, so these are the functions that made
llama.cpp's Q4_K_M / Q6_K / Q8_0 / F16 files. Everything is vectorized over blocks; the only
Python loops run over positions inside a block (sequential float32 sums, in C's order) and over
the few scale-search steps of the k-quants (minfer/quants/quantize_k.py). The k-quants also have
C twins (minfer/quants/kquants.c, ~10x faster), used when a C compiler is there.

Bit-exactness rules followed throughout (ggml-quants.c is compiled into ggml-base without -march,
so plain SSE float32: no FMA contraction, no double promotion, no reassociation):
  * all arithmetic in float32, one rounding per C operator, C's operand order;
  * sums accumulate sequentially (`seqsum`), never numpy's pairwise sum;
  * `nearest_int` is the magic-number trick, reproduced on the bit pattern;
  * GGML_FP32_TO_FP16 is round-to-nearest-even, as numpy's float16 cast;
  * `roundf` (q8_0) rounds half away from zero; `(int8_t)(x + 8.5f)` truncates toward zero.

API: `quantize(x [rows, cols] float32, qtype) -> uint8 [rows, row_bytes]`.
"""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput, Unsupported

# ggml's rounding primitives live in minfer.quants.rounding (shared with quantize_k)
from minfer.quants.rounding import F32, fp16_bytes


def roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero, exact (no `+0.5` rounding error)."""
    t = np.trunc(v)
    frac = v - t  # exact in float32
    return t + np.where(np.abs(frac) >= F32(0.5), np.sign(v), F32(0))


def _amax_signed(xb: np.ndarray) -> np.ndarray:
    """The first value of largest |x| in each block (C: `if (amax < fabsf(v))`). xb: [nb, qk]."""
    idx = np.abs(xb).argmax(axis=1)
    return xb[np.arange(xb.shape[0]), idx]


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """q: [nb, 32] values 0..15 -> [nb, 16] bytes, low nibble = q[j], high = q[j + 16]."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << np.uint8(4))


def _pack_qh(q: np.ndarray) -> np.ndarray:
    """5th bits of q: [nb, 32] -> uint32 little-endian bytes [nb, 4] (bit j = q[j] >> 4)."""
    bits = ((q.astype(np.uint32) >> np.uint32(4)) & np.uint32(1)) << np.arange(32, dtype=np.uint32)
    qh = np.bitwise_or.reduce(bits, axis=1).astype("<u4")
    return qh.view(np.uint8).reshape(-1, 4)


# --- the legacy 32-weight block types ------------------------------------------------------------


def quantize_q8_0(xb: np.ndarray) -> np.ndarray:
    """xb: [nb, 32] f32 -> [nb, 34] (d f16, qs int8[32])."""
    amax = np.abs(xb).max(axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    qs = roundf(xb * idd[:, None]).astype(np.int8).view(np.uint8)
    return np.concatenate([fp16_bytes(d), qs], axis=1)


def quantize_q4_0(xb: np.ndarray) -> np.ndarray:
    """xb: [nb, 32] -> [nb, 18] (d f16, qs[16])."""
    d = _amax_signed(xb) / F32(-8)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.minimum(np.trunc(xb * idd[:, None] + F32(8.5)), F32(15))  # (int8_t) truncates
    return np.concatenate([fp16_bytes(d), _pack_nibbles(q)], axis=1)


def quantize_q4_1(xb: np.ndarray) -> np.ndarray:
    """xb: [nb, 32] -> [nb, 20] (d f16, m f16, qs[16])."""
    mn, mx = xb.min(axis=1), xb.max(axis=1)
    d = (mx - mn) / F32(15)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.minimum(np.trunc((xb - mn[:, None]) * idd[:, None] + F32(0.5)), F32(15))
    return np.concatenate([fp16_bytes(d), fp16_bytes(mn), _pack_nibbles(q)], axis=1)


def quantize_q5_0(xb: np.ndarray) -> np.ndarray:
    """xb: [nb, 32] -> [nb, 22] (d f16, qh u32, qs[16])."""
    d = _amax_signed(xb) / F32(-16)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.minimum(np.trunc(xb * idd[:, None] + F32(16.5)), F32(31)).astype(np.uint8)
    return np.concatenate([fp16_bytes(d), _pack_qh(q), _pack_nibbles(q & np.uint8(15))], axis=1)


def quantize_q5_1(xb: np.ndarray) -> np.ndarray:
    """xb: [nb, 32] -> [nb, 24] (d f16, m f16, qh u32, qs[16])."""
    mn, mx = xb.min(axis=1), xb.max(axis=1)
    d = (mx - mn) / F32(31)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    # C: (uint8_t)(x0 + 0.5f), no clamp; x0 <= 31 + rounding so it stays <= 31
    q = np.trunc((xb - mn[:, None]) * idd[:, None] + F32(0.5)).astype(np.uint8)
    return np.concatenate(
        [fp16_bytes(d), fp16_bytes(mn), _pack_qh(q), _pack_nibbles(q & np.uint8(15))], axis=1
    )


# --- dispatch ------------------------------------------------------------------------------------


def _block_fns():
    from minfer.quants import quantize_k as k

    return {
        "Q4_0": (32, quantize_q4_0),
        "Q4_1": (32, quantize_q4_1),
        "Q5_0": (32, quantize_q5_0),
        "Q5_1": (32, quantize_q5_1),
        "Q8_0": (32, quantize_q8_0),
        "Q4_K": (256, k.quantize_q4_K),
        "Q5_K": (256, k.quantize_q5_K),
        "Q6_K": (256, k.quantize_q6_K),
    }


C_TYPES = ("Q4_K", "Q5_K", "Q6_K")  # types with a C twin (minfer/quants/ckernel.py)
QUANTIZABLE = ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

# rows per call of a block function: keeps the k-quant working set near the CPU caches
_CHUNK_WEIGHTS = 1 << 16


def type_name(qtype: int | str) -> str:
    import gguf

    if isinstance(qtype, str):
        name = qtype.upper()
        if name not in gguf.GGMLQuantizationType.__members__:
            raise Unsupported(
                f"unknown tensor type {qtype!r} (quantizable: {', '.join(QUANTIZABLE)})"
            )
    else:
        try:
            name = gguf.GGMLQuantizationType(int(qtype)).name
        except ValueError:
            raise Unsupported(f"unknown tensor type id {qtype}") from None
    if name not in QUANTIZABLE:
        raise Unsupported(f"cannot quantize to {name} (quantizable: {', '.join(QUANTIZABLE)})")
    return name


IMPLS = ("auto", "c", "numpy")


def quantize(x: np.ndarray, qtype: int | str, impl: str = "auto") -> np.ndarray:
    """x: float32 [rows, cols] -> uint8 [rows, row_bytes], bytes as llama.cpp writes them.

    F32 and F16 come back as their raw bytes (F16: round to nearest even, as ggml).
    impl (k-quants only; the other types have only the numpy path): "c" = the compiled twins
    in minfer/quants/kquants.c (BadInput if they cannot be built), "numpy" = the numpy ones,
    "auto" = C when available. Both give the same bytes (tests/test_quantize.py).
    """
    if impl not in IMPLS:
        raise BadInput(f"quantize: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    name = type_name(qtype)
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise BadInput(f"quantize: expected a [rows, cols] array, got shape {list(x.shape)}")
    if x.dtype != np.float32:
        raise BadInput(f"quantize: expected float32 input, got {x.dtype}")
    rows, cols = x.shape
    if name == "F32":
        return np.ascontiguousarray(x).view(np.uint8).reshape(rows, cols * 4)
    if name == "F16":
        return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(rows, cols * 2)
    bs, fn = _block_fns()[name]
    if cols % bs:
        raise Unsupported(f"{name}: row length {cols} is not a multiple of its block size {bs}")
    x = np.ascontiguousarray(x)
    nb_row = cols // bs
    row_bytes = nb_row * fn_type_size(name)
    if rows == 0:
        return np.empty((0, row_bytes), dtype=np.uint8)
    if name in C_TYPES and impl != "numpy":
        from minfer.quants import ckernel

        if impl == "c" or ckernel.library() is not None:
            return ckernel.quantize_k(x.reshape(-1, bs), name).reshape(rows, row_bytes)
    rows_per_chunk = max(1, _CHUNK_WEIGHTS // cols)
    parts = []
    with np.errstate(all="ignore"):  # 0/0 in masked-out lanes; C computes them too and discards
        for r0 in range(0, rows, rows_per_chunk):
            xb = x[r0 : r0 + rows_per_chunk].reshape(-1, bs)
            parts.append(fn(xb).reshape(-1, row_bytes))
    return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]


def fn_type_size(name: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1]
