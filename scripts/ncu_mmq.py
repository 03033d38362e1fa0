"""Warp instructions per GMAC of every MMQ variant (the seeds' first-order predictor), by ncu.

Run under Nsight Compute on the device (Firecracker machines; clocks left alone):
  ncu --clock-control none --kernel-name regex:mmq --metrics \
      smsp__inst_executed.sum,gpu__time_duration.sum --csv python3 scripts/ncu_mmq.py > ncu.csv
  python3 scripts/ncu_mmq.py --table ncu.csv
Launches each variant once (after one warm-up launch that ncu also records; the table keeps the
last) at M = 512 on the Llama-3-8B q-proj shape, q4_K, N = K = 4096.
"""

from __future__ import annotations

import csv
import io
import sys

import numpy as np

M, N, K = 512, 4096, 4096
CFGS = {"r1": dict(mmq=True, raw=False), "narrow": dict(mmq=True, wide=False),
        "wide-kd4": dict(mmq=True, kd=4), "wide-kd8": dict(mmq=True, kd=8)}


def launch_all() -> None:
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import Q4_K, mmq_linear, quantize_q8_1
    from minfer.cuda.runtime import get_runtime
    from minfer.quants.testdata import random_raw

    rt = get_runtime()
    rng = np.random.default_rng(0)
    w = da.to_device(rt, random_raw(Q4_K, N, K, rng))
    q8 = quantize_q8_1(rt, da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32)))
    out = da.empty(rt, (M, N), np.float32)
    for cfg in CFGS.values():
        for _ in range(2):
            mmq_linear(rt, q8, w, Q4_K, M, N, K, GemmConfig(**cfg), out)
    rt.synchronize()


def table(path: str) -> None:
    """ncu's CSV -> markdown. Launch IDs come in CFGS order, two per variant (warm-up, then
    the one kept); KD=4 and KD=8 share an entry name, so rows are told apart by ID."""
    text = open(path).read()
    rows = list(csv.DictReader(io.StringIO(text[text.find('"ID"'):])))
    by_id: dict[int, dict[str, str]] = {}
    for r in rows:
        d = by_id.setdefault(int(r["ID"]), {"kernel": r["Kernel Name"].split("(")[0]})
        d[r["Metric Name"]] = r["Metric Value"].replace(",", "")
        d["unit:" + r["Metric Name"]] = r["Metric Unit"]
    ids = sorted(by_id)
    gmac = M * N * K / 1e9
    print(f"| variant | kernel (q4_K, M={M}, N=K={N}) | warp inst (M) | M inst / GMAC | time |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, i in zip(CFGS, ids[1::2]):
        v = by_id[i]
        inst = float(v.get("smsp__inst_executed.sum", "nan"))
        t = v.get("gpu__time_duration.sum", "nan")
        print(f"| {name} | {v['kernel']} | {inst / 1e6:.1f} | {inst / 1e6 / gmac:.2f} | "
              f"{t} {v.get('unit:gpu__time_duration.sum', '')} |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        launch_all()
