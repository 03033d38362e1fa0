"""numpy views of the GGUF block layouts of kernels/quant_blocks.cuh (one structured dtype per type).

Packed (no padding), little-endian; tests/test_quant_layouts.py checks each itemsize against
gguf.GGML_QUANT_SIZES and every field offset against the header's static_asserts.
`raw.view(BLOCK_DTYPES["Q4_K"])` on raw rows [N, row_bytes] gives blocks [N, K / 256].
"""

from __future__ import annotations

import numpy as np

_F16 = "<f2"

BLOCK_DTYPES: dict[str, np.dtype] = {
    "Q4_0": np.dtype([("d", _F16), ("qs", "u1", 16)]),
    "Q4_1": np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", 16)]),
    "Q5_0": np.dtype([("d", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]),
    "Q5_1": np.dtype([("d", _F16), ("m", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]),
    "Q8_0": np.dtype([("d", _F16), ("qs", "i1", 32)]),
    "IQ4_NL": np.dtype([("d", _F16), ("qs", "u1", 16)]),
    "Q2_K": np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", _F16), ("dmin", _F16)]),
    "Q3_K": np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", _F16)]),
    "Q4_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", 128)]),
    "Q5_K": np.dtype(
        [("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    ),
    "Q6_K": np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", _F16)]),
    "IQ4_XS": np.dtype(
        [("d", _F16), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)]
    ),
}

# minfer's q8_1 raw activation block (docs/design.md): 40 B per 32 values, s = sum of qs.
Q8_1_RAW = np.dtype([("d", _F16), ("pad", "<u2"), ("qs", "i1", 32), ("s", "<i4")])

# f16 fields holding a scale (random test data must keep them finite for strict bit equality)
F16_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(f for f in dt.names if dt.fields[f][0] == np.dtype(_F16))
    for name, dt in BLOCK_DTYPES.items()
}
