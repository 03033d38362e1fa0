"""Quantizer throughput on a random [4096, 4096] float32 matrix: wall clock with N worker
processes, and CPU-time throughput per core (less sensitive to other load on the machine).

    python scripts/bench_quantize.py [--types Q4_K,Q5_K,Q6_K] [--impl auto|c|numpy] [--procs 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

_X = None  # the matrix, inherited by the forked workers


def _work(item):
    from minfer.quants.quantize import quantize

    r0, r1, ty, impl = item
    t = time.process_time()
    quantize(_X[r0:r1], ty, impl=impl)
    return time.process_time() - t


def main() -> None:
    global _X
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--impl", default="auto")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4096)
    a = ap.parse_args()
    from minfer.quants import ckernel

    print(f"load average {os.getloadavg()}, C quantizers: {ckernel.library() is not None}")
    _X = np.random.default_rng(0).standard_normal((a.rows, 4096)).astype(np.float32)
    step = max(1, a.rows // (8 * a.procs))
    with mp.get_context("fork").Pool(a.procs) as pool:
        for ty in a.types.split(","):
            items = [(r, min(a.rows, r + step), ty, a.impl) for r in range(0, a.rows, step)]
            t0 = time.perf_counter()
            cpu = sum(pool.map(_work, items))
            wall = time.perf_counter() - t0
            n = _X.size
            print(f"{ty}: {n / wall / 1e6:6.1f} M weights/s wall on {a.procs} procs, "
                  f"{n / cpu / 1e6:6.1f} M weights/s per core (CPU time)", flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
