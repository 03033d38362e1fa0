"""gemm_f16_nt's host side without a GPU: it takes devarray's GPUArrays (a stand-in here), checks
them, and launches the picked kernel with their pointers, M, N, K and the epilogue mode (a
recording fake runtime)."""

from __future__ import annotations

import numpy as np
import pytest
from fake_gpuarray import FakeGPUArray, install

from minfer.cuda.paths.f16.gemm import (
    MODE_ACC,
    MODE_F16,
    MODE_F32,
    VARIANTS,
    gemm_f16_nt,
    pick_variant,
)
from minfer.cuda.runtime import devarray as da
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
    ((fn, grid, block, args, smem),) = rt.launches
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
        (
            GPUError,
            r"gemm_f16_nt A: device pointer 0x10002 not 16-byte aligned",
            dict(a=da.view(0x10002, (4, 16), F16)),
        ),
        (
            GPUError,
            r"gemm_f16_nt B: not contiguous \(shape \(8, 8\), strides \(32, 2\)\)",
            dict(b=FakeGPUArray((8, 8), F16, gpudata=0x20000, strides=(32, 2))),
        ),
        (
            GPUError,
            "gemm_f16_nt out: device pointer 0x30004",
            dict(out=da.view(0x30004, (4, 8), F32)),
        ),
        (
            GPUError,
            "gemm_f16_nt A: expected a device array .* got ndarray",
            dict(a=np.zeros((4, 16), F16)),
        ),
        (BadInput, "float16, got float32", dict(a=da.view(0x10000, (4, 16), F32))),
        (BadInput, "inner dimensions", dict(b=da.view(0x20000, (8, 24), F16))),
        (
            BadInput,
            r"out is \(4, 8\) float16, expected \(4, 8\) float32",
            dict(out=da.view(0x30000, (4, 8), F16)),
        ),
        (
            BadInput,
            "either out or accumulate",
            dict(out=da.view(0x30000, (4, 8), F32), accumulate=da.view(0x40000, (4, 8), F32)),
        ),
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


def _rope_target(monkeypatch, T=16, Hq=4, Hkv=2, D=64, S=40, rope_dim=64, neox=False):
    """A layers.QkvRope over stand-in arrays; returns it and the struct bytes it uploaded."""
    from minfer.cuda.ops import layers as L

    sent = []

    def to_device(rt, arr, what="buffer"):
        sent.append(np.array(arr, copy=True))
        return da.view(0xA00000, arr.shape, arr.dtype)

    monkeypatch.setattr(da, "to_device", to_device)
    table = L.RopeTable(
        da.view(0x50000, (S, rope_dim // 2), F32),
        da.view(0x60000, (S, rope_dim // 2), F32),
        S,
        rope_dim,
        10000.0,
    )
    t = L.QkvRope(
        FakeRT(),
        da.view(0x10000, (T, Hq, D), F16),
        da.view(0x20000, (S, Hkv, D), F16),
        da.view(0x30000, (S, Hkv, D), F16),
        table,
        da.view(0x40000, (T, 2), np.int32),
        rope_dim,
        neox,
    )
    return t, sent


def test_rope_target_packs_the_struct(monkeypatch):
    from minfer.cuda.ops.layers import ROPE_QKV_DTYPE

    t, sent = _rope_target(monkeypatch, rope_dim=48)
    (raw,) = sent
    rec = np.frombuffer(raw.tobytes(), ROPE_QKV_DTYPE)[0]
    assert raw.nbytes == 64
    assert [int(rec[f]) for f in ("q16", "kc", "vc", "cos", "sin", "tok")] == [
        0x10000,
        0x20000,
        0x30000,
        0x50000,
        0x60000,
        0x40000,
    ]
    assert [int(rec[f]) for f in ("qd", "kd", "D", "half_r")] == [256, 128, 64, 24]


@pytest.mark.parametrize("M", [1, 7, 16])
def test_rope_launch_passes_the_struct_as_c(monkeypatch, M):
    from minfer.cuda.paths.f16.gemm import EPILOGUE_TILE, MODE_ROPE

    t, _ = _rope_target(monkeypatch)
    rt = FakeRT()
    rt.arch = "sm_80"  # (the mma.sync tiles: no tensor maps to make)
    a, b = da.view(0x100000, (M, 72), F16), da.view(0x400000, (512, 72), F16)
    assert gemm_f16_nt(a, b, rt=rt, rope=t, hi=3 + M) is t
    fn, grid, block, args, smem = _launch(rt)
    v = EPILOGUE_TILE if M == 1 else pick_variant(M, 512, 72, rt.sm_count, rt.arch)
    assert fn[1] == v  # M == 1: a tile kernel (the GEMV has no rope epilogue)
    assert args == [0x100000, 0x400000, 0xA00000, M, 512, 72, MODE_ROPE]


def test_rope_launch_refuses_misfits(monkeypatch):
    t, _ = _rope_target(monkeypatch)  # T = 16 rows of q16, 40 cache rows, N = 512
    rt = FakeRT()
    a, b = da.view(0x100000, (8, 72), F16), da.view(0x400000, (512, 72), F16)
    with pytest.raises(GPUError, match=r"slots \(below 43\) exceed the cache's 40 rows"):
        gemm_f16_nt(a, b, rt=rt, rope=t, hi=43)
    with pytest.raises(GPUError, match="the GEMM has 504 columns"):
        gemm_f16_nt(a, da.view(0x400000, (504, 72), F16), rt=rt, rope=t)
    with pytest.raises(GPUError, match="17 rows, q16 holds 16"):
        gemm_f16_nt(da.view(0x100000, (17, 72), F16), b, rt=rt, rope=t)
    with pytest.raises(BadInput, match="no out, accumulate or glu"):
        gemm_f16_nt(a, b, F16, rt=rt, rope=t, glu=True)
    assert not rt.launches
    with pytest.raises(GPUError, match="neox"):
        _rope_target(monkeypatch, neox=True)
    with pytest.raises(GPUError, match="head_dim 4 < 8"):
        _rope_target(monkeypatch, D=4, rope_dim=4)


@pytest.mark.parametrize("M", [1, 300])
@pytest.mark.parametrize("glu,mode", [(True, 3), ("silu", 3), ("gelu", 5)])
def test_glu_launch_mode(glu, mode, M):
    """glu True / "silu" launch the swiglu epilogue (mode 3), "gelu" gemma's geglu (mode 5), on
    a tile kernel even at M == 1 (the GEMV has no epilogue); out is f16 [M, N / 2]."""
    from minfer.cuda.paths.f16.gemm import EPILOGUE_TILE, MODE_GEGLU, MODE_GLU

    assert (MODE_GLU, MODE_GEGLU) == (3, 5)
    rt = FakeRT()
    rt.arch = "sm_80"  # (the mma.sync tiles: no tensor maps to make)
    a, b = da.view(0x100000, (M, 64), F16), da.view(0x400000, (256, 64), F16)
    out = da.view(0x800000, (M, 128), F16)
    gemm_f16_nt(a, b, F16, out=out, rt=rt, glu=glu)
    fn, _, _, args, _ = _launch(rt)
    assert fn[1] == (EPILOGUE_TILE if M == 1 else pick_variant(M, 256, 64, rt.sm_count, rt.arch))
    assert args == [0x100000, 0x400000, 0x800000, M, 256, 64, mode]
    with pytest.raises(BadInput, match="'tanh' is not one of"):
        gemm_f16_nt(a, b, F16, out=out, rt=rt, glu="tanh")
