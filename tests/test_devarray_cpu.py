"""minfer.cuda.runtime.devarray without a GPU: the pointer and shape arithmetic of view / rows /
reshape, the contiguity test, and check's messages, on a stand-in for pycuda's GPUArray."""

from __future__ import annotations

import numpy as np
import pytest
from fake_gpuarray import FakeGPUArray, install

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


@pytest.fixture(autouse=True)
def fake_pycuda(monkeypatch):
    install(monkeypatch)


def test_view_wraps_foreign_memory():
    owner = object()
    v = da.view(0x1000, (3, 4), np.float16, base=owner)
    assert (da.ptr(v), v.shape, v.dtype, v.base) == (0x1000, (3, 4), np.float16, owner)
    assert da.view(np.uint64(0x2000), 5, "float32").shape == (5,)  # int-likes, a bare length
    with pytest.raises(GPUError, match="negative dimension"):
        da.view(0x1000, (2, -1), np.float16)


def test_rows_offsets_by_whole_rows():
    a = da.view(0x10000, (10, 3, 4), np.float32)
    r = da.rows(a, 7, 2)
    assert da.ptr(r) == 0x10000 + 7 * 3 * 4 * 4 and r.shape == (2, 3, 4) and r.base is a
    flat = da.view(0x10000, (100,), np.float16)  # 1-D: one element per "row"
    assert da.ptr(da.rows(flat, 9, 91)) == 0x10000 + 18
    assert da.rows(a, 10, 0).shape == (0, 3, 4)
    for start, n in ((-1, 1), (9, 2), (0, -1)):
        with pytest.raises(GPUError, match="out of range"):
            da.rows(a, start, n)


def test_reshape_keeps_the_pointer():
    a = da.rows(da.view(0x10000, (64,), np.float32), 16, 48)
    r = da.reshape(a, (6, 8))
    assert da.ptr(r) == 0x10000 + 64 and r.shape == (6, 8) and r.base is a
    with pytest.raises(GPUError, match="cannot view"):
        da.reshape(a, (7, 7))


def test_contiguous_agrees_with_numpy():
    x = np.empty((6, 8, 4), np.float16)
    for v in (
        x,
        x[2:5],
        x[:, :3],
        x.transpose(1, 0, 2),
        x[:, 1:2],
        x[::2],
        x[:1, :, :2],
        x[:, :, 0],
        np.empty((1, 5))[:, ::2],
        np.empty((3, 1))[::1, :],
    ):
        assert da.contiguous(v) == v.flags.c_contiguous, (v.shape, v.strides)


def test_check_messages():
    a = da.view(0x1002, (4, 16), np.float16)
    with pytest.raises(GPUError, match=r"^x: device pointer 0x1002 not 16-byte aligned$"):
        da.check("x", a, align=16)
    da.check("x", a, (4, None), np.float16, align=2)
    with pytest.raises(GPUError, match="expected a device array .* got ndarray"):
        da.check("x", np.zeros((4, 16), np.float16))
    s = FakeGPUArray((4, 8), np.float16, gpudata=0x1000, strides=(32, 2))  # a[:, :8] of [4, 16]
    da.check("x", s, align=16)  # strided views pass unless asked
    with pytest.raises(GPUError, match=r"x: not contiguous \(shape \(4, 8\), strides \(32, 2\)\)"):
        da.check("x", s, align=16, require_contiguous=True)
