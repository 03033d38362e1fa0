"""The blk expert GEMMs one CTA a tile (what ships) against the persistent entries (`_p`: at
most a CTA an SM walking the live tiles), on one MoE layer's shapes at several prompt lengths:
µs a launch (CUDA events, the median of 7 batches of 10, the two interleaved after a 300 ms
pre-roll) and whether their outputs are the same bytes. Random weights, uniform routing (the
sort's host twin, as the GPU tests group).

    python3 lab/moe_persist.py --preset qwen3-30b-a3b --tokens 512,2048,8192

Why: at 2,048 tokens the expert GEMMs move their weights at ~1.7 TB/s and each of ~2,200 tiles
pays its pipeline fill and epilogue unhidden (lab/moe_tiles.py, docs/families.md).
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", default="512,2048,8192")
    a = ap.parse_args(argv)
    from minfer.cuda.ops import moe as M
    from minfer.cuda.paths.blk import moe as B
    from minfer.cuda.paths.blk.launch import blk_weight
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.runtime.profile import interleaved_us
    from minfer.cuda.runtime.runtime import get_runtime
    from minfer.tools.synth import PRESETS

    rt = get_runtime()
    s = PRESETS[a.preset]
    E, k, d, fe = s.n_expert, s.n_expert_used, s.d_model, s.d_ff_exp or s.d_ff
    rng = np.random.default_rng(0)

    def experts(N, K):
        wb = da.empty(rt, B.experts_shape(E, N, K), np.uint8)
        for e in range(E):
            w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float16)
            blk_weight(rt, da.to_device(rt, w), out=da.reshape(da.rows(wb, e, 1), wb.shape[1:]))
        return B.BlkExperts(wb, E, N, K)

    wgu, wdn = experts(2 * fe, d), experts(d, fe)
    print(f"{a.preset}: {E} experts, {k} used, d {d}, expert ff {fe}; {rt.sm_count} SMs")
    print("| tokens | GEMM | one CTA a tile µs | persistent µs | ratio | same bytes |")
    print("| ---: | --- | ---: | ---: | ---: | --- |")
    for T in (int(t) for t in a.tokens.split(",")):
        P = T * k
        sel = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
        offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
        perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
        M.sort_ref(offs, toff, perm, rowpos, sel, E, B.BM)
        od, td = da.to_device(rt, offs), da.to_device(rt, toff)
        h16 = da.to_device(rt, rng.standard_normal((T, d)).astype(np.float16))
        tt = da.empty(rt, B.operand_shape(P, E, d), np.uint8)
        B.operand(rt, tt, h16, od, td, da.to_device(rt, perm), k, per_token=True)
        act = da.to_device(rt, np.zeros((P, fe), np.float16))
        B.grouped_gemm(rt, act, tt, wgu, od, td, True)
        tt2 = da.empty(rt, B.operand_shape(P, E, fe), np.uint8)
        B.operand(rt, tt2, act, od, td)
        for name, out, x, w, glu in (
            ("gate|up", (P, fe, np.float16), tt, wgu, True),
            ("down", (P, d, np.float32), tt2, wdn, False),
        ):
            outs = [da.to_device(rt, np.zeros(out[:2], out[2])) for _ in range(2)]

            def run(p, outs=outs, x=x, w=w, glu=glu):
                B.grouped_gemm(rt, outs[p], x, w, od, td, glu, persistent=bool(p))

            us = interleaved_us(rt, {p: (lambda p=p: run(p)) for p in (0, 1)}, preroll_ms=300)
            m0, m1 = float(np.median(us[0])), float(np.median(us[1]))
            same = np.array_equal(outs[0].get().view(np.uint8), outs[1].get().view(np.uint8))
            print(f"| {T:,} | {name} | {m0:,.1f} | {m1:,.1f} | {m0 / m1:.2f}x | {same} |")


if __name__ == "__main__":
    main()
