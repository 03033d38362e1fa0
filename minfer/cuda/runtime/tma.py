"""TMA tensor maps for the Hopper kernels: cuTensorMapEncodeTiled through ctypes on libcuda.

The pycuda wheel does not wrap the tensor-map API; a map is a 128-byte opaque value the kernel
takes by value (a `const __grid_constant__` parameter), so it travels as a uint8 [128] numpy
array, which pycuda packs into the argument buffer as 128 raw bytes. Encoding is host work (no
GPU call), so maps are cached by (address, shape, box): an engine's buffers are fixed, and a
replayed CUDA graph holds the maps it captured.

    tmap_f16_2d(ptr, rows, cols, box_rows)   # row-major f16 [rows, cols], box 64 cols x box_rows,
                                             # 128-byte swizzle, zero fill past the edges
    TMA_PARAM_PAD                            # the argument tuple's first item before the maps
"""

from __future__ import annotations

import ctypes

import numpy as np

from minfer.errors import GPUError

# cuda.h enums (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion, ...FloatOOBfill)
_F16, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZERO = 6, 0, 3, 3, 0
BOX_COLS = 64  # 64 halves = one 128-byte swizzle row
_CACHE_MAX = 4096
# A kernel taking tensor maps by value declares them first: the sm_90 parameter block starts at
# constant offset 0x210, so the first 64-byte aligned map sits 48 bytes in; pycuda packs
# arguments from byte 0, so these 48 bytes of padding go first in the argument tuple (the
# kernels' magic last argument traps a launch whose layout does not match).
TMA_PARAM_PAD = np.zeros((-0x210) % 64, np.uint8)
_cache: dict[tuple, np.ndarray] = {}
_encode = None


def _encoder():
    global _encode
    if _encode is None:
        from minfer.cuda.runtime.graph import libcuda

        fn = getattr(libcuda("TMA tensor maps"), "cuTensorMapEncodeTiled", None)
        if fn is None:
            raise GPUError("TMA tensor maps: this driver has no cuTensorMapEncodeTiled")
        fn.restype = ctypes.c_int
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        _encode = fn
    return _encode


def tmap_f16_2d(ptr: int, rows: int, cols: int, box_rows: int) -> np.ndarray:
    """The tensor map of a row-major f16 [rows, cols] tensor at device address `ptr` (16-byte
    aligned, cols % 8 == 0), read in boxes of BOX_COLS columns x box_rows rows (<= 256) into
    shared memory in the 128-byte swizzle; coordinates past the tensor read as zeros."""
    key = (int(ptr), int(rows), int(cols), int(box_rows))
    m = _cache.get(key)
    if m is not None:
        return m
    if ptr % 16 or cols % 8 or not 1 <= box_rows <= 256 or rows < 1:
        raise GPUError(f"TMA tensor map: bad f16 [{rows}, {cols}] at {ptr:#x}, box {box_rows}")
    raw = np.zeros(128 + 64, np.uint8)  # the map is written 64-byte aligned
    off = (-raw.ctypes.data) % 64
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * 2)
    box = (ctypes.c_uint32 * 2)(BOX_COLS, box_rows)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encoder()(
        raw.ctypes.data + off,
        _F16,
        2,
        ctypes.c_void_p(int(ptr)),
        dims,
        strides,
        box,
        estr,
        _INTERLEAVE_NONE,
        _SWIZZLE_128B,
        _L2_256B,
        _OOB_ZERO,
    )
    if rc != 0:
        raise GPUError(
            f"TMA tensor map: cuTensorMapEncodeTiled failed with CUresult {rc} "
            f"(f16 [{rows}, {cols}] at {ptr:#x}, box {box_rows})"
        )
    m = raw[off : off + 128].copy()
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = m
    return m
