"""The seeds' exact int8 family (docs/design.md, seeds r15/r16): q4_K / q6_K weights kept as their
raw GGUF bytes, activations quantized to q8_1 raw blocks (40 B per 32 values) by a prepass,
the MMQ kernels (minfer.cuda.paths.q8_1.launch): R1 word-level (r1), narrow raw (narrow), wide raw with
KD = 4 or 8 super-blocks staged per pass (wide-kd4, wide-kd8; over the GPU's opt-in shared
memory the chooser runs narrow: the smem guard). Twin: minfer.cuda.paths.q8_1.twin on the q8_1 grid."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.paths.base import (
    Q4_K,
    Q6_K,
    RAW_BYTES,
    Emulation,
    GemmPath,
    LinearRoute,
    Operand,
)
from minfer.cuda.paths.q8_1.twin import Q8_1Grid
from minfer.cuda.runtime import devarray as da


def _prepass_q8_1(rt, A, buf):
    from minfer.cuda.paths.q8_1.launch import quantize_q8_1

    M, K = A.shape
    q8 = da.reshape(da.rows(buf, 0, M * (K // 32) * 40), (M, K // 32 * 40))
    da.poison(rt, q8)
    return quantize_q8_1(rt, A, q8)


Q8_1 = Operand(
    "q8_1", "q8", _prepass_q8_1, part="q8_1 scratch", nbytes=lambda M, K: M * K // 32 * 40
)


class RawInt8Route(LinearRoute):
    """The MMQ kernel of the path on the raw GGUF bytes, reading the q8_1 operand."""

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        from minfer.cuda.paths.q8_1.launch import mmq_linear
        from minfer.errors import Unsupported

        if mode == "f16":
            raise Unsupported(f"{self.name} writes f32, this GEMM needs f16 output")
        M, N = C.shape
        K = x.shape[1] * 32 // 40
        if mode != "acc":
            da.poison(rt, C)
        p = self.path
        mmq_linear(rt, x, w, self.qtype, M, N, K, p.family, p.kd, C, accumulate=mode == "acc")


@dataclass(frozen=True)
class RawInt8Path(GemmPath):
    family: str = "wide"  # the kernel family: r1, narrow, wide (minfer.cuda.paths.q8_1.launch)
    int8 = True
    operand = Q8_1
    grid = Q8_1Grid()
    emulations = {
        "q8_1": Emulation(grid, help="the wide / narrow / r1 kernels"),
        "q8_1-all": Emulation(grid, every=True, help="their grid on every GEMM"),
    }
    scratch_parts = ("q8_1 scratch",)

    def smem(self, qtype: int) -> int | None:
        from minfer.cuda.paths.q8_1.launch import wide_smem

        return wide_smem(self.kd, qtype) if self.kd else None

    def route(self, qtype: int, choice, name: str = "") -> RawInt8Route:
        return RawInt8Route(self, qtype, choice, name)

    def dest(self, rt, rows: int, K: int, row_bytes: int, name: str):
        from minfer.cuda.paths.q8_1 import upload

        return upload.dest(rt, rows, row_bytes, f"fused raw weight {name}")

    def upload(self, rt, up, parts, name: str, dst=None, glu: bool = False):
        from minfer.cuda.paths.q8_1 import upload

        assert not glu  # (no glu epilogue: plan_glu asks GemmPath.glu)
        return upload.upload(rt, up, parts, name, dst)

    def twin(self, x, w_raw, qtype: int, M: int, N: int, K: int, name: str = ""):
        from minfer.cuda.paths.q8_1.twin import mmq_linear_ref

        return mmq_linear_ref(np.asarray(x, np.float32), w_raw, qtype, M, N, K)


def _raw(name: str, kernel: str, family: str, kd: int = 0) -> RawInt8Path:
    return RawInt8Path(
        name, kernel, frozenset({Q4_K, Q6_K}), None, 256, RAW_BYTES, kd=kd, family=family
    )


WIDE_KD4 = _raw("wide-kd4", "mmq_raw_wide_nt_kernel", "wide", 4)
WIDE_KD8 = _raw("wide-kd8", "mmq_raw_wide_nt_kernel", "wide", 8)
NARROW = _raw("narrow", "mmq_raw_nt_kernel", "narrow")
R1 = _raw("r1", "mmq_nt_kernel", "r1")
