"""The prefill attention alone, timed with CUDA events, for `ncu` and A/B timing (device).

python3 scripts/attn_one.py [--tokens 2048,8192,16384] [--impl wg|mma] [--heads 32:8]
    [--head-dim 128] [--launches 10] [--opts=-DATT_WG_NOLOAD,-DATT_WG_NOEXP] [--grid sm,items]
    [--loads tma,cp]
Prints per length: µs per launch (median of 7 groups, ± half the spread) and TFLOP/s with the
causal FLOPs counted once (4 T^2 / 2 Hq D). --opts: the wgmma kernel's timing builds
(kernels/attention_sm90a.cu's header; wrong results: what the loads / the ex2 cost). --grid:
the wgmma kernel's grids to compare, their groups interleaved (sm: persistent, one block per
SM; items: one block per item; default: wg_blocks' choice); --loads: its K/V loads (tma, cp:
cp.async; default: the launcher's), every grid with every load.
Under ncu, profile one launch:
ncu -k regex:attn_wg --launch-skip 2 --launch-count 1 python3 scripts/attn_one.py --tokens 8192
"""

import argparse

import numpy as np

from minfer.cuda.ops.attention import attention, wg_blocks
from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.profile import interleaved_us
from minfer.cuda.runtime.runtime import get_runtime

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", default="2048,8192,16384")
ap.add_argument("--impl", default="wg")
ap.add_argument("--heads", default="32:8")
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--launches", type=int, default=10)
ap.add_argument("--opts", default="", help="comma-separated nvcc -D options (timing builds)")
ap.add_argument("--grid", default="default", help="comma-separated: default, sm, items")
ap.add_argument("--loads", default="default", help="comma-separated: default, tma, cp")
a = ap.parse_args()
Hq, Hkv = map(int, a.heads.split(":"))
D, rt, rng = a.head_dim, get_runtime(), np.random.default_rng(0)
opts = tuple(o for o in a.opts.split(",") if o)
for T in map(int, a.tokens.split(",")):
    q, k, v = (
        da.to_device(rt, rng.standard_normal((T, h, D)).astype(np.float16)) for h in (Hq, Hkv, Hkv)
    )
    o = da.empty(rt, (T, Hq, D), np.float16, "o")
    grids = {
        g: {
            "default": None,
            "sm": wg_blocks(rt.sm_count, T, Hq // Hkv, Hkv, True),
            "items": wg_blocks(rt.sm_count, T, Hq // Hkv, Hkv, False),
        }[g]
        for g in a.grid.split(",")
    }
    loads = {x: {"default": None, "tma": True, "cp": False}[x] for x in a.loads.split(",")}
    wg = a.impl == "wg"
    runs = {
        " ".join(n for n in (g, x) if n != "default"): (
            lambda b=b, t=t, o=o, q=q, k=k, v=v: attention(
                rt,
                o,
                q,
                k,
                v,
                0,
                impl=a.impl,
                build_opts=opts,
                blocks=b if wg else None,
                tma=t if wg else None,
            )
        )
        for g, b in grids.items()
        for x, t in loads.items()
    }
    us = interleaved_us(rt, runs, launches=a.launches, warm=3)  # (7 groups, interleaved)
    flop = 4 * T * T / 2 * Hq * D
    for g, u in us.items():
        med = float(np.median(u))
        name = a.impl + (f" {g}" if g else "") + (" " + a.opts if opts else "")
        print(
            f"attention {name} T={T:6} Hq:Hkv={Hq}:{Hkv} D={D}: {med:9.1f} ± "
            f"{(max(u) - min(u)) / 2:.1f} µs  {flop / med / 1e6:6.1f} TFLOP/s",
            flush=True,
        )
    del q, k, v, o
