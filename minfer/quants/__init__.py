"""Quantization types: one traits record per GGUF type, the reference dequant (gguf's).

`traits_of(qtype)` is the single place that says whether minfer supports a tensor type.
Dequantized reference values are exactly `gguf.quants.dequantize` (docs/design.md): the GPU dequant
kernels are tested bit for bit against this function cast to f16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.errors import Unsupported


@dataclass(frozen=True)
class QuantTraits:
    name: str  # ggml name, e.g. "Q4_K"
    qtype: int  # gguf.GGMLQuantizationType value
    block_size: int  # weights per block
    type_size: int  # bytes per block

    def row_bytes(self, n_cols: int) -> int:
        if n_cols % self.block_size:
            raise Unsupported(
                f"{self.name}: row length {n_cols} is not a multiple of "
                f"its block size {self.block_size}"
            )
        return n_cols // self.block_size * self.type_size


# The types real llama GGUFs use and minfer runs (issue 2, item 2).
SUPPORTED = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
)


def _build() -> dict[int, QuantTraits]:
    import gguf

    out = {}
    for name in SUPPORTED:
        qt = gguf.GGMLQuantizationType[name]
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        out[int(qt)] = QuantTraits(name, int(qt), bs, ts)
    return out


TRAITS: dict[int, QuantTraits] = _build()
BY_NAME: dict[str, QuantTraits] = {t.name: t for t in TRAITS.values()}


def traits_of(qtype: int, where: str = "tensor") -> QuantTraits:
    t = TRAITS.get(int(qtype))
    if t is None:
        import gguf

        try:
            name = gguf.GGMLQuantizationType(int(qtype)).name
        except ValueError:
            name = f"unknown type id {int(qtype)}"
        raise Unsupported(
            f"{where}: unsupported tensor type {name} (supported: {', '.join(SUPPORTED)})"
        )
    return t


def dequantize(data: np.ndarray, qtype: int) -> np.ndarray:
    """Reference dequant to float32: gguf.quants.dequantize, shape [..., cols]."""
    import gguf

    traits_of(qtype)
    if int(qtype) == int(gguf.GGMLQuantizationType.F32):
        return np.asarray(data, dtype=np.float32)
    return gguf.quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType(int(qtype))).astype(
        np.float32, copy=False
    )
