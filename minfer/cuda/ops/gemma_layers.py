"""Launchers for kernels/gemma_layers.cu: what gemma2 / gemma3 add to the llama forward (the
embedding scale, GeGLU, the post-attention / post-FFN norms before the residual add, final
logit soft-capping), and granite's scaled residual add (scale_add). Numpy twins: minfer.reference.ops.geglu, ops.rmsnorm (+ the add), and
ReferenceBackend._embed / _head (scale, soft-cap); tests/gpu/test_gemma_layers.py compares."""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

_F = "gemma_layers"


def scale(rt, y, s: float) -> None:
    """y f32 (any shape) *= s (rounded per element, as numpy's float32 product)."""
    da.check("scale y", y, None, np.float32)
    n = int(y.size)
    rt.launch(
        rt.function(_F, "scale_f32"),
        ((n + 255) // 256,),
        (256,),
        (da.arg(y), np.int64(n), np.float32(s)),
    )


def softcap(rt, y, cap: float) -> None:
    """y f32 (any shape) = tanh(y * (1 / cap)) * cap (the reference's _head, in float32)."""
    da.check("softcap y", y, None, np.float32)
    if not cap > 0:
        raise GPUError(f"softcap: cap must be > 0, got {cap}")
    n = int(y.size)
    inv = np.float32(1.0) / np.float32(cap)
    rt.launch(
        rt.function(_F, "softcap_f32"),
        ((n + 255) // 256,),
        (256,),
        (da.arg(y), np.int64(n), np.float32(cap), inv),
    )


def geglu(rt, y, g, u=None) -> None:
    """y f16 [T, F] = gelu(g) * u, g/u f32 [T, F]; u None: g is the fused gate|up output
    [T, 2F] (gate first)."""
    da.check("geglu g", g, (None, None), np.float32)
    T, W = g.shape
    if u is None:
        if W % 2:
            raise GPUError(f"geglu gate|up: {W} columns, expected 2F")
        F, gp, up, ldg = W // 2, da.ptr(g), da.ptr(g) + 4 * (W // 2), W
    else:
        F = W
        da.check("geglu u", u, (T, F), np.float32)
        gp, up, ldg = da.ptr(g), da.ptr(u), F
    da.check("geglu y", y, (T, F), np.float16)
    geglu_rows(rt, y, gp, up, ldg, T, F)


def geglu_interleaved(rt, y, gu) -> None:
    """y f16 [T, F] = gelu(gate) * up from an interleaved gate|up output (layers.
    interleaved_rows: the geglu GEMM epilogue's function where a GEMM wrote f32)."""
    from minfer.cuda.ops.layers import interleaved_rows

    geglu_rows(rt, y, *interleaved_rows(y, gu, "geglu"))


def geglu_rows(rt, y, g: int, u: int, ldg: int, T: int, F: int) -> None:
    """geglu_f32_f16 over T rows of F features (f32 gate / up rows of stride ldg at g / u)."""
    rt.launch(
        rt.function(_F, "geglu_f32_f16"),
        ((F + 255) // 256, T),
        (256,),
        (da.arg(y), np.int64(F), np.uintp(g), np.uintp(u), np.int64(ldg), np.int32(F)),
    )


def rmsnorm_add(rt, x, t, w, eps: float) -> None:
    """x f32 [T, D] += rmsnorm(t f32 [T, D]) * w f32 [D] (gemma's post norms)."""
    da.check("post norm x", x, (None, None), np.float32)
    T, D = x.shape
    da.check("post norm t", t, (T, D), np.float32, align=16)
    da.check("post norm w", w, (D,), np.float32)
    rt.launch(
        rt.function(_F, "rmsnorm_add_f32"),
        (T,),
        (256,),
        (da.arg(x), da.arg(t), da.arg(w), np.int32(D), np.float32(eps)),
    )


def scale_add(rt, x, t, s: float) -> None:
    """x f32 += t f32 * s (same shape; the product rounded first: granite's residual_scale).
    Numpy twin: x + t * np.float32(s) (ReferenceBackend._layer)."""
    da.check("scale_add x", x, None, np.float32)
    da.check("scale_add t", t, tuple(x.shape), np.float32)
    n = int(x.size)
    rt.launch(
        rt.function(_F, "scale_add_f32"),
        ((n + 255) // 256,),
        (256,),
        (da.arg(x), da.arg(t), np.int64(n), np.float32(s)),
    )
