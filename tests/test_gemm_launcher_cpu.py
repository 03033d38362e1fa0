"""gemm_f16_nt's host side without a GPU: it takes devarray's GPUArrays (a stand-in here), checks
them, and launches the picked kernel with their pointers, M, N, K and the epilogue mode (a
recording fake runtime)."""

from __future__ import annotations

import numpy as np
import pytest
from fake_gpuarray import FakeGPUArray, install

from minfer.cuda import devarray as da
from minfer.cuda.gemm import MODE_ACC, MODE_F16, MODE_F32, VARIANTS, gemm_f16_nt, pick_variant
from minfer.errors import BadInput, GPUError

F16, F32 = np.float16, np.float32


class FakeRT:
    sm_count, arch = 132, "sm_90"

    def __init__(self):
        self.launches, self.allocs = [], []

    def function(self, name, entry, options=(), dyn_smem=0):
        return name, entry, options, dyn_smem

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, grid, block, [int(x) for x in args], smem))

    def alloc(self, nbytes, what="buffer"):
        self.allocs.append((nbytes, what))
        return 0x900000


@pytest.fixture(autouse=True)
def fake_pycuda(monkeypatch):
    install(monkeypatch)


def _launch(rt):
    (fn, grid, block, args, smem), = rt.launches
    return fn, grid, block, args, smem


@pytest.mark.parametrize("M,N,K", [(513, 1000, 136), (7, 200, 64), (1, 4099, 1032)])
@pytest.mark.parametrize("mode", ["f32", "f16", "acc"])
def test_launch_passes_pointers_and_sizes(M, N, K, mode):
    rt = FakeRT()
    a, b = da.view(0x10000, (M, K), F16), da.view(0x400000, (N, K), F16)
    c = da.view(0x800000, (M, N), F16 if mode == "f16" else F32)
    if mode == "acc":
        got = gemm_f16_nt(a, b, F32, accumulate=c, rt=rt)
    else:
        got = gemm_f16_nt(a, b, c.dtype, out=c, rt=rt)
    assert got is c
    v = pick_variant(M, N, K, rt.sm_count, rt.arch)
    kern = VARIANTS[v]
    fn, grid, block, args, smem = _launch(rt)
    assert fn == (kern.file, v, kern.options, kern.smem) and smem == kern.smem
    assert grid == (kern.grid(M, N),) and block == (kern.threads,)
    code = {"f32": MODE_F32, "f16": MODE_F16, "acc": MODE_ACC}[mode]
    sizes = [N, K] if M == 1 else [M, N, K]  # the GEMV entries take no M
    assert args == [0x10000, 0x400000, 0x800000, *sizes, code]


def test_allocates_out_when_none():
    rt = FakeRT()
    c = gemm_f16_nt(da.view(0x10000, (3, 16), F16), da.view(0x20000, (5, 16), F16), F16, rt=rt)
    assert (c.shape, c.dtype, da.ptr(c)) == ((3, 5), F16, 0x900000)
    assert rt.allocs == [(3 * 5 * 2, "gemm output")] and _launch(rt)[3][2] == 0x900000


def test_rejects_before_launching():
    rt = FakeRT()
    a, b = da.view(0x10000, (4, 16), F16), da.view(0x20000, (8, 16), F16)
    cases = [
        (GPUError, r"gemm_f16_nt A: device pointer 0x10002 not 16-byte aligned",
         dict(a=da.view(0x10002, (4, 16), F16))),
        (GPUError, r"gemm_f16_nt B: not contiguous \(shape \(8, 8\), strides \(32, 2\)\)",
         dict(b=FakeGPUArray((8, 8), F16, gpudata=0x20000, strides=(32, 2)))),
        (GPUError, "gemm_f16_nt out: device pointer 0x30004",
         dict(out=da.view(0x30004, (4, 8), F32))),
        (GPUError, "gemm_f16_nt A: expected a device array .* got ndarray",
         dict(a=np.zeros((4, 16), F16))),
        (BadInput, "float16, got float32", dict(a=da.view(0x10000, (4, 16), F32))),
        (BadInput, "inner dimensions", dict(b=da.view(0x20000, (8, 24), F16))),
        (BadInput, r"out is \(4, 8\) float16, expected \(4, 8\) float32",
         dict(out=da.view(0x30000, (4, 8), F16))),
        (BadInput, "either out or accumulate",
         dict(out=da.view(0x30000, (4, 8), F32), accumulate=da.view(0x40000, (4, 8), F32))),
        (BadInput, "M == 1 only", dict(variant="gemv_f16_r4")),
    ]
    for err, msg, kw in cases:
        kw = {"a": a, "b": b, **kw}
        with pytest.raises(err, match=msg):
            gemm_f16_nt(kw.pop("a"), kw.pop("b"), rt=rt, **kw)
    rt.arch = "sm_80"
    with pytest.raises(BadInput, match="needs an sm_90 GPU"):
        gemm_f16_nt(a, b, rt=rt, variant="wgmma_f16_nt_64x64x64_s4")
    assert rt.launches == [] and rt.allocs == []
