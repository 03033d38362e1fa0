"""One calling convention for every path of minfer.cuda.plan.paths.TABLE (what `minfer check` and
the parity tests iterate):

    w = prepare(rt, w_raw, qtype, N, K)                     # raw GGUF rows on the device
    launch(rt, x, w, qtype, M, N, K, path, out, accumulate)  # x f32 [M, K]; out f32 [M, N]
    twin(x, w_raw, qtype, M, N, K) -> float64 [M, N]        # numpy, on the host

The engine calls the launchers themselves (minfer.cuda.backend); these adapt their arguments.
"""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da


def prepare_f16(rt, w_raw, qtype: int, N: int, K: int):
    from minfer.cuda.ops.dequant import dequant_f16

    out = da.empty(rt, (N, K), np.float16, "f16 weight")
    dequant_f16(rt, w_raw, qtype, N, K, out_dev=out)
    return out


def _f16_input(rt, x, M: int, K: int):
    """x as f16 [M, K] (converted on the device when it is f32): what the f16 and blk launchers
    read."""
    from minfer.cuda.ops.layers import to_f16

    if x.dtype == np.float16:
        return x
    x16 = da.empty(rt, (M, K), np.float16, "f16 activations")
    to_f16(rt, x16, x)
    return x16


def launch_f16(rt, x, w, qtype: int, M: int, N: int, K: int, path, out,
               accumulate: bool = False) -> None:
    from minfer.cuda.ops.gemm import gemm_f16_nt

    x = _f16_input(rt, x, M, K)
    if accumulate:
        gemm_f16_nt(x, w, np.float32, accumulate=out, rt=rt)
    else:
        gemm_f16_nt(x, w, np.float32, out=out, rt=rt)


def twin_f16(x, w_raw, qtype: int, M: int, N: int, K: int) -> np.ndarray:
    from minfer.cuda.ops.dequant import dequant_f16_ref

    a = np.asarray(x, np.float32).reshape(M, K).astype(np.float16).astype(np.float64)
    return a @ dequant_f16_ref(w_raw, qtype, N, K).astype(np.float64).T


def prepare_raw(rt, w_raw, qtype: int, N: int, K: int):
    return w_raw


def launch_raw(rt, x, w, qtype: int, M: int, N: int, K: int, path, out,
               accumulate: bool = False) -> None:
    from minfer.cuda.ops.mmq import mmq_linear

    mmq_linear(rt, x, w, qtype, M, N, K, path, out, accumulate=accumulate)


def twin_q8_1(x, w_raw, qtype: int, M: int, N: int, K: int) -> np.ndarray:
    from minfer.quants.mmq_ref import mmq_linear_ref

    return mmq_linear_ref(x, w_raw, qtype, M, N, K)


def prepare_blk(rt, w_raw, qtype: int, N: int, K: int):
    from minfer.cuda.ops.mmq_blk import blk_weight

    w16 = prepare_f16(rt, w_raw, qtype, N, K)
    w = blk_weight(rt, w16)
    rt.synchronize()
    w16.gpudata.free()
    return w


def launch_blk(rt, x, w, qtype: int, M: int, N: int, K: int, path, out,
               accumulate: bool = False) -> None:
    from minfer.cuda.ops.mmq_blk import mmq_blk_linear

    mmq_blk_linear(rt, _f16_input(rt, x, M, K), w, M, N, K, out, accumulate)


def twin_blk(x, w_raw, qtype: int, M: int, N: int, K: int) -> np.ndarray:
    from minfer.cuda.ops.dequant import dequant_f16_ref
    from minfer.quants.blk_ref import blk_linear_ref

    return blk_linear_ref(np.asarray(x, np.float32).reshape(M, K),
                          dequant_f16_ref(w_raw, qtype, N, K))
