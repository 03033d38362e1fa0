"""Small dequant/embed launches for compute-sanitizer (exact-size buffers, ragged shapes):
    compute-sanitizer --tool memcheck python3 scripts/memcheck_dequant.py"""

from __future__ import annotations

import numpy as np

from minfer.cuda.dequant import dequant_f16, embed_rows
from minfer.cuda.runtime import get_runtime
from minfer.quants import BY_NAME, SUPPORTED
from minfer.quants.testdata import random_raw


def main() -> None:
    rt = get_runtime()
    rng = np.random.default_rng(0)
    for name in SUPPORTED:
        t = BY_NAME[name]
        for N, K in ((1, max(t.block_size, 8) if t.block_size > 1 else 13), (3, 3 * max(t.block_size, 1) * 32)):
            raw = random_raw(t.qtype, N, K, rng)
            src = rt.alloc(raw.nbytes)
            rt.drv.memcpy_htod(src, raw)
            out = rt.alloc(N * K * 2)
            dequant_f16(rt, src, t.qtype, N, K, out_dev=out)
            ids = np.array([N - 1, 0, -5, N], np.int32)
            ids_dev = rt.alloc(ids.nbytes)
            rt.drv.memcpy_htod(ids_dev, ids)
            eout = rt.alloc(ids.size * K * 4)
            embed_rows(rt, src, t.qtype, ids_dev, ids.size, K, eout, V=N)
            rt.synchronize()
    print("memcheck run done:", len(SUPPORTED), "types")


if __name__ == "__main__":
    main()
