"""The GPU calibration of blk-split's kept channels: a backend loaded as blk (ffn_down on f16,
its input the f16 activation itself) has its ffn_down routes wrapped by ProbeRoute, which adds
the column sums of squares of each input it gets (col_sumsq_f16) into a per-weight f32
buffer, then runs the route as before. minfer.engine.calib runs the calibration text through
it and takes busiest(mean square) per weight (outliers.busiest)."""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


class ProbeRoute:
    """`inner` (a route whose input is the f16 activation: operand None) with its input's
    column sums of squares added into acc (f32 [K] on the device) before each run; rows: the
    rows seen (host side: the backend runs eagerly, graphs=False, so each run is a call)."""

    def __init__(self, inner, acc, name: str = ""):
        if inner.operand is not None:
            raise GPUError(
                f"calibration: {name or inner.weight} reads the {inner.operand.name} form, "
                "not its f16 input (load the calibration backend on a path that leaves it f16)"
            )
        self.inner, self.acc, self.rows = inner, acc, 0

    def __getattr__(self, key):  # operand, name, glu, accumulates, ...: the inner route's
        return getattr(self.inner, key)

    def run(self, rt, scratch, C, x, w, mode: str) -> None:
        from minfer.cuda.paths.blk.split import col_sumsq_f16

        col_sumsq_f16(rt, x, self.acc)
        self.rows += int(x.shape[0])
        self.inner.run(rt, scratch, C, x, w, mode)


def probe(rt, lin: dict, shapes: dict) -> dict:
    """Wrap the routes of `shapes` (weight name -> (N, K)) in `lin` (a backend's name -> route,
    the dict its Forward reads) by ProbeRoutes over zeroed f32 [K] buffers -> name -> probe."""
    out = {}
    for n, (_, K) in shapes.items():
        acc = da.to_device(rt, np.zeros(int(K), np.float32), f"calibration {n}")
        out[n] = lin[n] = ProbeRoute(lin[n], acc, n)
    return out


def mean_squares(probes: dict) -> dict:
    """name -> f64 [K]: each probe's sums of squares over its rows (GPUError: a weight never
    ran)."""
    idle = [n for n, p in probes.items() if not p.rows]
    if idle:
        raise GPUError(f"calibration: no input reached {', '.join(sorted(idle)[:3])}")
    return {n: p.acc.get().astype(np.float64) / p.rows for n, p in probes.items()}


__all__ = ["ProbeRoute", "mean_squares", "probe"]
