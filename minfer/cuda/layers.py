"""Launchers for kernels/layers.cu: rmsnorm, rope, swiglu, add, f32->f16 copy, argmax.

Each launcher validates shapes/dtypes (GPUError with a one-line message) and launches through
`rt.launch`. Numpy twins: minfer.reference.ops (rmsnorm, rope, swiglu); the tests in
tests/gpu/test_layers.py call these launchers and compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda import devarray as da
from minfer.errors import GPUError

_F = "layers"


@dataclass
class RopeTable:
    """cos/sin f32 [n_pos, rope_dim/2] on the device, angles by the reference's formula."""

    cos: object
    sin: object
    n_pos: int
    rope_dim: int
    base: float

    @classmethod
    def build(cls, rt, n_pos: int, base: float, rope_dim: int) -> "RopeTable":
        from minfer.reference.ops import rope_cos_sin

        c, s = rope_cos_sin(np.arange(n_pos), base, rope_dim, np.float32)
        return cls(da.to_device(rt, c.astype(np.float32), "rope cos table"),
                   da.to_device(rt, s.astype(np.float32), "rope sin table"), n_pos, rope_dim,
                   base)


def rmsnorm(rt, y, x, w, eps: float) -> None:
    """y[T, D] (f16 or f32) = rmsnorm(x f32 [T, D]) * w f32 [D]."""
    da.check("rmsnorm x", x, (None, None), np.float32)
    T, D = x.shape
    da.check("rmsnorm w", w, (D,), np.float32)
    da.check("rmsnorm y", y, (T, D), (np.float16, np.float32))
    entry = "rmsnorm_f32_f16" if y.dtype == np.float16 else "rmsnorm_f32_f32"
    fn = rt.function(_F, entry)
    rt.launch(fn, (T,), (256,), (da.arg(y), np.int32(D), da.arg(x), np.int32(D), da.arg(w),
                                 np.int32(D), np.float32(eps)))


def _rope_check(x, table: RopeTable, pos0: int, rope_dim: int):
    T, H, D = x.shape
    if rope_dim % 2 or rope_dim > D or D % 2:
        raise GPUError(f"rope: rope_dim {rope_dim} must be even and <= head_dim {D} (even)")
    if rope_dim != table.rope_dim:
        raise GPUError(f"rope: table built for rope_dim {table.rope_dim}, asked {rope_dim}")
    if pos0 < 0 or pos0 + T > table.n_pos:
        raise GPUError(f"rope: positions [{pos0}, {pos0 + T}) outside the table's "
                       f"{table.n_pos} positions")
    return T, H, D


def rope(rt, x, table: RopeTable, pos0: int, rope_dim: int, neox: bool) -> None:
    """In place on x [T, H, D] (f32 or f16) at positions pos0..pos0+T-1."""
    da.check("rope x", x, (None, None, None), (np.float32, np.float16))
    T, H, D = _rope_check(x, table, pos0, rope_dim)
    entry = "rope_f32" if x.dtype == np.float32 else "rope_f16"
    fn = rt.function(_F, entry)
    npair = H * D // 2
    rt.launch(fn, (T, (npair + 127) // 128), (128,),
              (da.arg(x), np.int64(H * D), np.int32(H), np.int32(D), np.int32(rope_dim),
               np.int32(bool(neox)), da.arg(table.cos), da.arg(table.sin), np.int32(pos0)))


def rope_to_f16(rt, dst, src, table: RopeTable, pos0: int, rope_dim: int, neox: bool) -> None:
    """dst f16 [T, H, D] = rope(src f32 [T, H, D]); dst may be a view into the KV cache."""
    da.check("rope src", src, (None, None, None), np.float32)
    T, H, D = _rope_check(src, table, pos0, rope_dim)
    da.check("rope dst", dst, (T, H, D), np.float16)
    fn = rt.function(_F, "rope_f32_f16")
    npair = H * D // 2
    rt.launch(fn, (T, (npair + 127) // 128), (128,),
              (da.arg(dst), np.int64(H * D), da.arg(src), np.int64(H * D), np.int32(H),
               np.int32(D), np.int32(rope_dim), np.int32(bool(neox)), da.arg(table.cos),
               da.arg(table.sin), np.int32(pos0)))


def swiglu(rt, y, g, u) -> None:
    """y f16 [T, F] = silu(g) * u, g/u f32 [T, F]."""
    da.check("swiglu g", g, (None, None), np.float32)
    T, F = g.shape
    da.check("swiglu u", u, (T, F), np.float32)
    da.check("swiglu y", y, (T, F), np.float16)
    fn = rt.function(_F, "swiglu_f32_f16")
    rt.launch(fn, ((F + 255) // 256, T), (256,),
              (da.arg(y), np.int64(F), da.arg(g), da.arg(u), np.int64(F), np.int32(F)))


def add(rt, y, x) -> None:
    """y += x (f32, same shape)."""
    da.check("add y", y, None, np.float32)
    da.check("add x", x, tuple(y.shape), np.float32)
    fn = rt.function(_F, "add_f32")
    n = int(y.size)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(y), da.arg(x), np.int64(n)))


def to_f16(rt, dst, src) -> None:
    """dst f16 [T, ...] = src f32 [T, ...] (same shape); the KV-cache append of V."""
    da.check("to_f16 src", src, None, np.float32)
    da.check("to_f16 dst", dst, tuple(src.shape), np.float16)
    T = int(src.shape[0])
    W = int(src.size // max(T, 1))
    fn = rt.function(_F, "cvt_f32_f16")
    rt.launch(fn, ((W + 255) // 256, T), (256,),
              (da.arg(dst), np.int64(W), da.arg(src), np.int64(W), np.int32(W)))


def argmax(rt, out, x) -> None:
    """out int32 [1] = first index of the max of x f32 [n]."""
    da.check("argmax x", x, None, np.float32)
    da.check("argmax out", out, (1,), np.int32)
    fn = rt.function(_F, "argmax_f32")
    rt.launch(fn, (1,), (1024,), (da.arg(out), da.arg(x), np.int32(x.size)))


def add_bias(rt, y, b) -> None:
    """y f32 [T, N] += b f32 [N] (the qkv bias of qwen2-style models)."""
    da.check("bias y", y, (None, None), np.float32)
    T, N = y.shape
    da.check("bias b", b, (N,), np.float32)
    fn = rt.function(_F, "add_bias_f32")
    rt.launch(fn, ((N + 255) // 256, T), (256,), (da.arg(y), da.arg(b), np.int32(N)))
