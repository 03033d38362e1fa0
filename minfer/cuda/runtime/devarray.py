"""Device arrays for the launchers: pycuda GPUArrays allocated through the Runtime.

The launchers take GPUArrays (shape + dtype travel with the pointer, so they can validate);
`rows(a, start, n)` is a view of rows [start, start+n) of a contiguous array (no copy), used for
"the last position only" and for writing into the KV cache at row pos0. `view(p, shape, dtype)`
is the general form: a GPUArray over memory at address p that something else owns (an offset
into a larger buffer, a torch tensor in the benchmarks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from minfer.errors import GPUError


def _ga():
    import pycuda.gpuarray as ga

    return ga


def _shape(shape) -> tuple:
    return tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))


def empty(rt, shape, dtype, what: str = "buffer"):
    shape = _shape(shape)
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


def view(p: int, shape, dtype, base=None):
    """A contiguous GPUArray over device memory at address `p` (no copy, never freed by the
    view): `base`, when given, is the owner the view keeps alive (a GPUArray, a torch tensor)."""
    shape = _shape(shape)
    if any(s < 0 for s in shape):
        raise GPUError(f"view: negative dimension in shape {shape}")
    return _ga().GPUArray(shape, np.dtype(dtype), gpudata=int(p), base=base)


def rows(a, start: int, n: int):
    """View of rows [start, start + n) along axis 0 of contiguous `a`."""
    if start < 0 or n < 0 or start + n > a.shape[0]:
        raise GPUError(f"row view [{start}, {start + n}) out of range for shape {a.shape}")
    row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize
    return view(ptr(a) + start * row, (n, *a.shape[1:]), a.dtype, base=a)


def reshape(a, shape):
    shape = _shape(shape)
    if int(np.prod(shape)) != a.size:
        raise GPUError(f"cannot view shape {a.shape} as {shape}")
    return view(ptr(a), shape, a.dtype, base=a)


def contiguous(a) -> bool:
    """True when `a` is C-contiguous (what the kernels' pointer arithmetic assumes); a GPUArray
    can be strided (a[:, :8], a.T). Cheaper than pycuda's memoized flags on a fresh view."""
    step = a.dtype.itemsize
    for n, s in zip(reversed(a.shape), reversed(a.strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def check(
    name: str, a, shape=None, dtype=None, align: int = 4, require_contiguous: bool = False
) -> None:
    """Raise GPUError with a one-line message if `a` is not the expected device array."""
    if not hasattr(a, "gpudata"):
        raise GPUError(f"{name}: expected a device array (GPUArray), got {type(a).__name__}")
    if dtype is not None and np.dtype(a.dtype) not in tuple(
        np.dtype(d) for d in (dtype if isinstance(dtype, (tuple, list)) else (dtype,))
    ):
        raise GPUError(f"{name}: dtype {a.dtype}, expected {dtype}")
    if shape is not None:
        if len(a.shape) != len(shape) or any(
            s is not None and int(s) != int(d) for s, d in zip(shape, a.shape)
        ):
            raise GPUError(
                f"{name}: shape {tuple(a.shape)}, expected "
                f"{tuple('*' if s is None else s for s in shape)}"
            )
    if ptr(a) % align and a.size:
        raise GPUError(f"{name}: device pointer {ptr(a):#x} not {align}-byte aligned")
    if require_contiguous and not contiguous(a):
        raise GPUError(
            f"{name}: not contiguous (shape {tuple(a.shape)}, strides {tuple(a.strides)})"
        )


def poison(rt, *arrays) -> None:
    """NaN-fill each (contiguous) device array when rt is poisoning (debug / poison mode), so
    an output whose kernel did not run reads as NaN, not as the previous call's numbers."""
    if not getattr(rt, "poisoning", False):
        return
    for a in arrays:
        if a is not None and a.size:
            rt.poison(ptr(a), int(a.size) * np.dtype(a.dtype).itemsize)


class DeviceArrays:
    """Mixin of a dataclass that holds a weight as device arrays (the repacked MMQ layouts):
    `nbytes` of its array fields and `free` for them (fields that are not device arrays, like
    N and K, are skipped)."""

    def _arrays(self) -> list:
        vals = (getattr(self, f.name) for f in dataclasses.fields(self))
        return [v for v in vals if hasattr(v, "gpudata")]

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self._arrays()))

    def free(self) -> None:
        for a in self._arrays():
            a.gpudata.free()
