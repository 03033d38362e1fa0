"""A CPU stand-in for pycuda's GPUArray (the constructor keywords minfer.cuda.runtime.devarray uses,
C-contiguous strides unless given), so devarray and the launchers that take its arrays can be
tested without a GPU. `install(monkeypatch)` makes devarray build these."""

from __future__ import annotations

import types

import numpy as np


class FakeGPUArray:
    def __init__(self, shape, dtype, gpudata=None, base=None, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.gpudata, self.base = gpudata, base
        self.strides = strides or tuple(
            self.dtype.itemsize * int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape))
        )


_NEXT = [1 << 20]  # the next free fake device address


def fake_dev(shape, dtype) -> FakeGPUArray:
    """A FakeGPUArray at its own running address (256-byte aligned, a 256-byte gap after it):
    launch records tell arrays apart by their pointers."""
    a = FakeGPUArray(shape, dtype, gpudata=_NEXT[0])
    _NEXT[0] += (int(np.prod(shape)) * np.dtype(dtype).itemsize + 255) // 256 * 256 + 256
    return a


def install(monkeypatch) -> None:
    from minfer.cuda.runtime import devarray

    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=FakeGPUArray))


class FakeStream:
    def synchronize(self):
        pass


class FakeEvent:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


def _dtoh_zeros(dst, src, stream=None):
    dst[...] = 0  # (a fake device's memory reads zeros, as the fake arrays' get())


def upload_drv() -> dict:
    """The driver calls of the streaming weight upload (minfer.cuda.runtime.upload) and of
    packed_launch, as a fake drv namespace's attributes: pinned buffers are plain numpy, async
    uploads do nothing, async read-backs give zeros."""
    return dict(
        pagelocked_empty=lambda shape, dtype: np.empty(shape, dtype),
        memcpy_htod_async=lambda dst, src, stream=None: None,
        memcpy_dtoh_async=_dtoh_zeros,
        Stream=FakeStream,
        Event=FakeEvent,
    )
