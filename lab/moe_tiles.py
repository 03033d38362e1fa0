"""The grouped expert GEMMs' tiles, counted on the host: for a MoE shape and a prompt length,
route T tokens to k of E experts (uniformly at random, as a synthetic model's router spreads
them; --skew S draws experts with weights 1 / rank^S instead, a real router's imbalance) and
count what `moe_blk_body` launches: each expert's rows cut into BM-row tiles, the tiles' row
utilization (rows / (tiles x BM)), the output tiles per layer (x ceil(N / 128) column tiles)
and the waves they make on the SMs with one CTA a tile. Prints one row per (T, BM).

    python3 lab/moe_tiles.py --preset qwen3-30b-a3b --tokens 512,2048,8192 --bm 128,64

Why: at 2,048 tokens the blk expert GEMMs ran at 0.33 / 0.22 of the int8 ceiling on an H100
(docs/families.md), far below the dense GEMMs' 0.81; this says how much of that the tiles'
padding and count alone explain, before any kernel is timed.
"""

from __future__ import annotations

import argparse

import numpy as np


def route(T: int, E: int, k: int, skew: float, rng) -> np.ndarray:
    """rows per expert [E] of T tokens each sent to k distinct experts."""
    p = 1.0 / np.arange(1, E + 1) ** skew
    p /= p.sum()
    counts = np.zeros(E, np.int64)
    for _ in range(T):
        counts[rng.choice(E, size=k, replace=False, p=p)] += 1
    return counts


def tiles(counts: np.ndarray, bm: int) -> tuple[int, float]:
    """(row tiles, their row utilization) of experts with `counts` rows, bm rows a tile."""
    t = int(np.sum((counts + bm - 1) // bm))
    return t, float(counts.sum()) / max(t * bm, 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--bm", default="128,64", help="row tile heights to compare")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--skew", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from minfer.tools.synth import PRESETS

    s = PRESETS[a.preset]
    E, k, d, fe = s.n_expert, s.n_expert_used, s.d_model, s.d_ff_exp or s.d_ff
    rng = np.random.default_rng(a.seed)
    print(f"{a.preset}: {E} experts, {k} used, d {d}, expert ff {fe}; skew {a.skew}")
    print("| tokens | BM | gate|up tiles | down tiles | row use | waves (gate|up) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for T in (int(t) for t in a.tokens.split(",")):
        counts = route(T, E, k, a.skew, rng)
        for bm in (int(b) for b in a.bm.split(",")):
            rt, use = tiles(counts, bm)
            gu, dn = rt * -(-2 * fe // 128), rt * -(-d // 128)
            print(f"| {T:,} | {bm} | {gu:,} | {dn:,} | {use:.2f} | {gu / a.sms:.1f} |")


if __name__ == "__main__":
    main()
