"""Attention kernel A/B on the device: parity of each kernel (attention.cu geometries, the wgmma
kernel) against the numpy twin (minfer.reference.ops.attention), then interleaved timing at the
8B shape (Hq 32, Hkv 8, D 128) at T = 512 and 2048 from position 0. Prints a table last.

python3 scripts/attn_device.py [W:K | wg ...]   (default: 8:128 wg; W:K: attention.cu with W warps
and K-key tiles; wg: attention_sm90a.cu, the wgmma kernel)
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
    specs = sys.argv[1:] or ["8:128", "wg"]
    # (label, attention() keyword arguments) per kernel
    geoms = [(s, {"impl": "wg"} if s == "wg" else
              {"geom": AttnGeometry(*(int(v) for v in s.split(":")))}) for s in specs]
    rng = np.random.default_rng(0)
    ok = True
    T, pos0, Hq, Hkv, D = 130, 21, 32, 8, 128
    S = pos0 + T
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    ref = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos0)
    qd, kd, vd = (da.to_device(rt, a) for a in (q, k, v))
    for g, kw in geoms:
        o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
        attention(rt, o, qd, kd, vd, pos0, **kw)
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
        runs = [(g, lambda i, kw=kw: attention(rt, o, q, kc, vc, 0, **kw)) for g, kw in geoms]
        res = interleaved(rt, runs, rounds=7, batch=10)
        flops = 4 * T * T / 2 * 128 * 32
        for g, _ in geoms:
            us, spread = res[g]
            rows.append((T, g, us, 100 * spread, flops / (us * 1e-6) / 1e12))
    print_table(["T:", "kernel", "µs:", "p90-p10 %:", "TFLOP/s:"], rows,
                ["d", "", ".1f", ".1f", ".0f"])
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
