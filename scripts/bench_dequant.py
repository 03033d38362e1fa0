"""Throughput of dq_f16_<type> on the GPU (run on the device machine).

For each type: raw [N, K] -> f16 [N, K], timed with CUDA events (median of reps), reported as
GB/s of (source bytes + output bytes) and as a fraction of a device-to-device copy of the output
size (read + write) measured in the same process. Usage:
    python3 scripts/bench_dequant.py [--shape 14336x4096] [--types Q4_K,Q6_K] [--grids 0,4,8,16]
"""

from __future__ import annotations

import argparse

import numpy as np

from minfer.cuda.dequant import DequantConfig, dequant_f16
from minfer.cuda.runtime import get_runtime
from minfer.quants import BY_NAME, SUPPORTED
from minfer.quants.testdata import random_raw


def timed(rt, fn, reps: int = 20) -> float:
    """Median milliseconds of fn() over reps, after 3 warm-ups."""
    drv = rt.drv
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = drv.Event(), drv.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(b.time_since(a))
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="14336x4096")
    ap.add_argument("--types", default=",".join(SUPPORTED))
    ap.add_argument("--grids", default="0", help="ctas_per_sm values to compare (0: 1 CTA/item)")
    args = ap.parse_args()
    N, K = (int(x) for x in args.shape.split("x"))
    rt = get_runtime()
    grids = [int(g) for g in args.grids.split(",")]
    out = rt.alloc(N * K * 2, "bench output")
    scratch = rt.alloc(N * K * 2, "bench copy")
    ms_copy = timed(rt, lambda: rt.drv.memcpy_dtod(scratch, out, N * K * 2))
    copy_gbs = 2 * N * K * 2 / ms_copy / 1e6
    print(f"device {rt.name} ({rt.arch}, {rt.sm_count} SMs); shape {N}x{K}; "
          f"d2d copy of {N * K * 2 / 1e6:.0f} MB: {ms_copy * 1e3:.1f} us = {copy_gbs:.0f} GB/s")
    print(f"{'type':7} {'grid':>5} {'src MB':>8} {'us':>8} {'GB/s':>7} {'% copy':>7}")
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        t = BY_NAME[name]
        raw = random_raw(t.qtype, N, K, rng)
        src = rt.alloc(raw.nbytes, "bench source")
        rt.drv.memcpy_htod(src, raw)
        for g in grids:
            cfg = DequantConfig(ctas_per_sm=g)
            ms = timed(rt, lambda: dequant_f16(rt, src, t.qtype, N, K, out_dev=out, cfg=cfg))
            gbs = (raw.nbytes + N * K * 2) / ms / 1e6
            print(f"{name:7} {g:5d} {raw.nbytes / 1e6:8.1f} {ms * 1e3:8.1f} {gbs:7.0f} "
                  f"{100 * gbs / copy_gbs:6.0f}%")
        del src


if __name__ == "__main__":
    main()
