"""Attention geometry A/B on the device: parity of each AttnGeometry against the numpy twin
(minfer.reference.ops.attention), then interleaved timing at the 8B shape (Hq 32, Hkv 8, D 128)
at T = 512 and 2048 from position 0. Prints a table last.

python3 scripts/attn_device.py [W:K ...]   (default: 4:64 8:64 4:128 8:128; W warps, K keys)
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.attention import AttnGeometry, attention
from minfer.cuda.runtime import get_runtime
from minfer.reference import ops
from mmq_device import interleaved, print_table


def main() -> int:
    rt = get_runtime()
    specs = sys.argv[1:] or ["4:64", "8:64", "4:128", "8:128"]
    geoms = [AttnGeometry(*(int(v) for v in s.split(":"))) for s in specs]
    rng = np.random.default_rng(0)
    ok = True
    T, pos0, Hq, Hkv, D = 130, 21, 32, 8, 128
    S = pos0 + T
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    ref = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos0)
    qd, kd, vd = (da.to_device(rt, a) for a in (q, k, v))
    for g in geoms:
        o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
        attention(rt, o, qd, kd, vd, pos0, geom=g)
        got = o.get().astype(np.float64)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        good = bool(np.isfinite(got).all()) and err < 2e-3
        ok &= good
        print(f"parity {g}: rel {err:.2e} {'OK' if good else 'FAIL'}")
    rows = []
    for T in (512, 2048):
        q = da.to_device(rt, (rng.standard_normal((T, 32, 128))).astype(np.float16))
        kc = da.to_device(rt, (rng.standard_normal((T, 8, 128))).astype(np.float16))
        vc = da.to_device(rt, (rng.standard_normal((T, 8, 128))).astype(np.float16))
        o = da.empty(rt, (T, 32, 128), np.float16)
        runs = [(str(g), lambda i, g=g: attention(rt, o, q, kc, vc, 0, geom=g)) for g in geoms]
        res = interleaved(rt, runs, rounds=7, batch=10)
        flops = 4 * T * T / 2 * 128 * 32
        for g in geoms:
            us, spread = res[str(g)]
            rows.append((T, f"{g.warps}:{g.keys}", us, 100 * spread, flops / (us * 1e-6) / 1e12))
    print_table(["T:", "warps:keys", "µs:", "p90-p10 %:", "TFLOP/s:"], rows,
                ["d", "", ".1f", ".1f", ".0f"])
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
