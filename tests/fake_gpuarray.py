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
        self.strides = strides or tuple(self.dtype.itemsize * int(np.prod(self.shape[i + 1:]))
                                        for i in range(len(self.shape)))


def install(monkeypatch) -> None:
    from minfer.cuda.runtime import devarray

    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=FakeGPUArray))
