"""Device arrays for the launchers: pycuda GPUArrays allocated through the Runtime.

The launchers take GPUArrays (shape + dtype travel with the pointer, so they can validate);
`rows(a, start, n)` is a view of rows [start, start+n) of a contiguous array (no copy), used for
"the last position only" and for writing into the KV cache at row pos0.
"""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError


def _ga():
    import pycuda.gpuarray as ga

    return ga


def empty(rt, shape, dtype, what: str = "buffer"):
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return _ga().GPUArray(shape, dtype, gpudata=rt.alloc(n, what))


def to_device(rt, arr: np.ndarray, what: str = "buffer"):
    arr = np.ascontiguousarray(arr)
    a = empty(rt, arr.shape, arr.dtype, what)
    if arr.size:
        a.set(arr)
    return a


def ptr(a) -> int:
    return int(a.gpudata)


def arg(a) -> np.uintp:
    """Kernel argument for a device array (pycuda does not take plain ints)."""
    return np.uintp(ptr(a))


def rows(a, start: int, n: int):
    """View of rows [start, start + n) along axis 0 of contiguous `a`."""
    if start < 0 or n < 0 or start + n > a.shape[0]:
        raise GPUError(f"row view [{start}, {start + n}) out of range for shape {a.shape}")
    row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize
    return _ga().GPUArray((n, *a.shape[1:]), a.dtype, gpudata=ptr(a) + start * row, base=a)


def reshape(a, shape):
    shape = tuple(int(s) for s in shape)
    if int(np.prod(shape)) != a.size:
        raise GPUError(f"cannot view shape {a.shape} as {shape}")
    return _ga().GPUArray(shape, a.dtype, gpudata=ptr(a), base=a)


def check(name: str, a, shape=None, dtype=None, align: int = 4) -> None:
    """Raise GPUError with a one-line message if `a` is not the expected device array."""
    if not hasattr(a, "gpudata"):
        raise GPUError(f"{name}: expected a device array (GPUArray), got {type(a).__name__}")
    if dtype is not None and np.dtype(a.dtype) not in tuple(np.dtype(d) for d in (
            dtype if isinstance(dtype, (tuple, list)) else (dtype,))):
        raise GPUError(f"{name}: dtype {a.dtype}, expected {dtype}")
    if shape is not None:
        if len(a.shape) != len(shape) or any(s is not None and int(s) != int(d)
                                             for s, d in zip(shape, a.shape)):
            raise GPUError(f"{name}: shape {tuple(a.shape)}, expected "
                           f"{tuple('*' if s is None else s for s in shape)}")
    if ptr(a) % align and a.size:
        raise GPUError(f"{name}: device pointer not {align}-byte aligned")


def poison(rt, *arrays) -> None:
    """NaN-fill each (contiguous) device array when rt is poisoning (debug / poison mode), so
    an output whose kernel did not run reads as NaN, not as the previous call's numbers."""
    if not getattr(rt, "poisoning", False):
        return
    for a in arrays:
        if a is not None and a.size:
            rt.poison(ptr(a), int(a.size) * np.dtype(a.dtype).itemsize)
