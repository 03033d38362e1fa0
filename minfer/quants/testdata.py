"""Test data for the dequant kernels: random raw GGUF blocks, and the NaN-aware bit equality rule.

Random bytes can encode NaN/Inf f16 scales. Two rules, both used by the tests:
- `random_raw(..., finite=True)` rewrites every f16 scale field (and every f32/f16/bf16 value of
  the float types) to a finite value: then the reference has no NaN and the kernel output must
  be equal byte for byte (memcmp).
- finite=False keeps the raw bytes; then `nan_aware_equal` is the rule: the NaN positions must
  be the same and every non-NaN element equal bit for bit (a NaN's payload is not compared:
  numpy and the GPU convert NaN to f16 with different payloads; Inf must match exactly).
"""

from __future__ import annotations

import numpy as np

from minfer.quants import traits_of
from minfer.quants.layouts import BLOCK_DTYPES, F16_FIELDS


def _finite_bits(bits: np.ndarray, exp_mask: int, flip: int) -> np.ndarray:
    """Make float bit patterns finite: an all-ones exponent loses its top bit."""
    bad = (bits & exp_mask) == exp_mask
    bits[bad] ^= bits.dtype.type(flip)
    return bits


def _scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """f16 scales: half realistic (1e-4..1e-1, either sign), half arbitrary finite bit patterns
    (subnormals and huge values too, so f16 overflow and tiny results are exercised)."""
    real = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-4, -1, n)).astype(np.float16)
    wild = _finite_bits(rng.integers(0, 1 << 16, n, dtype=np.uint16), 0x7C00, 0x4000)
    return np.where(rng.random(n) < 0.5, real.view(np.uint16), wild)


def random_raw(
    qtype: int, n_rows: int, n_cols: int, rng: np.random.Generator, finite: bool = True
) -> np.ndarray:
    """Raw GGUF rows [n_rows, row_bytes] (uint8) of type qtype."""
    t = traits_of(qtype)
    rb = t.row_bytes(n_cols)
    raw = rng.integers(0, 256, (n_rows, rb), dtype=np.uint8)
    if not finite:
        return raw
    if t.name == "F32":
        _finite_bits(raw.view(np.uint32), 0x7F800000, 0x40000000)
    elif t.name == "F16":
        _finite_bits(raw.view(np.uint16), 0x7C00, 0x4000)
    elif t.name == "BF16":
        _finite_bits(raw.view(np.uint16), 0x7F80, 0x4000)
    else:
        blocks = raw.reshape(-1).view(BLOCK_DTYPES[t.name])
        for f in F16_FIELDS[t.name]:
            blocks[f] = _scales(rng, blocks.shape[0]).view(np.float16)
    return raw


def nan_aware_equal(got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
    """(ok, message): same shape/dtype, same NaN positions, other elements bit-identical."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    gn, wn = np.isnan(got), np.isnan(want)
    ui = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    diff = (gn != wn) | (~wn & (got.view(ui) != want.view(ui)))
    if not diff.any():
        return True, ""
    idx = np.argwhere(diff)
    first = tuple(int(i) for i in idx[0])
    return False, (
        f"{len(idx)} elements differ; first at {first}: got {got[first]!r} "
        f"(0x{int(got.view(ui)[first]):x}) want {want[first]!r} "
        f"(0x{int(want.view(ui)[first]):x})"
    )
