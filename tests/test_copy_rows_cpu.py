"""CPU: copy_kv's launcher (layers.copy_rows, kernels/layers.cu copy_rows_u128) refuses what
its 16-byte copies cannot do, and launches one grid over every buffer; the plan's MoE kernel
choice (MINFER_MOE_GEMM) is read in plan/config and refused by name when unknown."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.ops import layers as L
from minfer.errors import BadInput, GPUError


class FakeRT:
    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return (name, entry)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, grid, block, [int(a) for a in args]))


class Ptrs:  # a device u64 [B] array's face, as devarray.check reads it
    def __init__(self, n):
        self.gpudata, self.shape, self.size = 1 << 20, (n,), n
        self.dtype, self.strides = np.dtype(np.uint64), (8,)


def test_one_launch_covers_every_buffer():
    rt = FakeRT()
    L.copy_rows(rt, Ptrs(64), 128 * 256, 256 * 256, 9 * 256)
    ((fn, grid, block, args),) = rt.launches
    assert fn == ("layers", "copy_rows_u128") and grid == (1, 64) and block == (256,)
    assert args[1:] == [128 * 256, 256 * 256, 9 * 256]
    L.copy_rows(rt, Ptrs(2), 0, 1 << 30, 1 << 24)  # 1M 16-byte words: the grid stops at 1024
    assert rt.launches[-1][1] == (1024, 2)


@pytest.mark.parametrize(
    "src,dst,n",
    [(8, 4096, 256), (0, 4096, 100), (0, 128, 256), (-16, 4096, 16)],
    ids=["unaligned", "ragged", "overlapping", "negative"],
)
def test_what_16_byte_copies_cannot_do_is_refused(src, dst, n):
    with pytest.raises(GPUError, match="copy_rows"):
        L.copy_rows(FakeRT(), Ptrs(4), src, dst, n)


def test_the_moe_kernel_choice():
    from minfer.cuda.plan.config import moe_kernel

    assert moe_kernel({}) == "mma" and moe_kernel({"MINFER_MOE_GEMM": " WMMA "}) == "wmma"
    with pytest.raises(BadInput, match="MINFER_MOE_GEMM='cutlass'"):
        moe_kernel({"MINFER_MOE_GEMM": "cutlass"})
