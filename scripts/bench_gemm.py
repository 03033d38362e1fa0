#!/usr/bin/env python3
"""Benchmark gemm_f16_nt / gemv_f16 against torch.matmul (cuBLAS) on Llama-3-8B layer shapes.

Needs a GPU, pycuda and torch (torch for the comparison column, the random data and the GPU
sleep that keeps launch overhead out of the numbers; never a minfer dependency).

Method: inputs rotate over enough sets to exceed L2 (60 MB on the H200); each timed batch is
queued behind torch.cuda._sleep so the GPU runs the n launches back to back; CUDA events around
the batch; `--reps` batches, median and [min, max] reported. Every shape's picked kernel is also
checked against a float64 product of the same inputs (rel err).

    python3 scripts/bench_gemm.py [--sweep] [--reps 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

LLAMA3_8B = [  # (label, N, K): per-layer linear weights [N, K]
    ("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336),
]
GEMV_SHAPES = [("lm_head", 49152, 4096), ("q/o", 4096, 4096), ("down", 4096, 14336),
               ("k/v", 1024, 4096)]
L2_BYTES = 60 * 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every compiled variant too")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ms", type=float, default=3.0, help="GPU time per timed batch (ms)")
    ap.add_argument("--m", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--small-m", type=int, nargs="*", default=[2, 16, 64])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_gemm.py needs torch for the cuBLAS comparison", file=sys.stderr)
        return 2
    from minfer.cuda import devarray
    from minfer.cuda.gemm import GEMVS, TILES, WGMMA, gemm_f16_nt, pick_variant
    from minfer.cuda.runtime import get_runtime

    torch.zeros(1, device="cuda")  # torch and pycuda share the primary context, null stream
    rt = get_runtime()
    drv = rt.drv
    dev = torch.device("cuda")
    print(f"device: {rt.name}, {rt.sm_count} SMs, arch {rt.arch}, torch {torch.__version__}")

    # copy-bandwidth ceiling (bytes read + written)
    x = torch.empty(2**30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        y.copy_(x)
    e1.record()
    torch.cuda.synchronize()
    copy_gbs = 2 * 10 * x.numel() / (e0.elapsed_time(e1) * 1e-3) / 1e9
    del x, y
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (read + write)")

    def timed(launch, est_us: float) -> list[float]:
        """per-launch microseconds of `reps` batches, each queued behind a GPU sleep."""
        n = max(3, min(200, int(args.ms * 1e3 / max(est_us, 1.0))))
        out = []
        for _ in range(args.reps):
            torch.cuda._sleep(int((n * 60 + 300) * 1980))  # covers the host's launch time
            s, e = drv.Event(), drv.Event()
            s.record()
            for i in range(n):
                launch(i)
            e.record()
            e.synchronize()
            out.append(e.time_since(s) * 1e3 / n)
        return out

    def first_us(launch) -> float:
        launch(0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        launch(0)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e6

    def wrap(t):
        """A GPUArray view of torch tensor t's memory (no copy; it keeps t alive)."""
        return devarray.view(t.data_ptr(), tuple(t.shape), np.dtype(str(t.dtype).split(".")[1]),
                             base=t)

    rows = []
    shapes = [(M, lab, N, K) for M in args.m for lab, N, K in LLAMA3_8B]
    shapes += [(M, lab, N, K) for M in args.small_m for lab, N, K in LLAMA3_8B[:1]]
    shapes += [(1, lab, N, K) for lab, N, K in GEMV_SHAPES]
    for M, lab, N, K in shapes:
        flop = 2.0 * M * N * K
        set_bytes = 2 * (M * K + N * K)
        nsets = max(1, min(8, math.ceil(3 * L2_BYTES / set_bytes)))
        g = torch.Generator(device=dev).manual_seed(M * 7 + N + K)
        A = [torch.randn(M, K, device=dev, generator=g).half() for _ in range(nsets)]
        B = [(torch.randn(N, K, device=dev, generator=g) * 0.05).half() for _ in range(nsets)]
        C32 = torch.empty(M, N, device=dev, dtype=torch.float32)
        C16 = torch.empty(M, N, device=dev, dtype=torch.float16)
        dA, dB = [wrap(a) for a in A], [wrap(b) for b in B]
        d32, d16 = wrap(C32), wrap(C16)
        pick = pick_variant(M, N, K, rt.sm_count, rt.arch)

        def ours(variant, mode):
            def launch(i):
                j = i % nsets
                if mode == "f16":
                    gemm_f16_nt(dA[j], dB[j], np.float16, out=d16, rt=rt, variant=variant)
                elif mode == "f32":
                    gemm_f16_nt(dA[j], dB[j], np.float32, out=d32, rt=rt, variant=variant)
                else:
                    gemm_f16_nt(dA[j], dB[j], np.float32, accumulate=d32, rt=rt,
                                variant=variant)
            return launch

        def torch_mm(i):
            j = i % nsets
            torch.matmul(A[j], B[j].T, out=C16)

        # correctness of the picked kernel at this shape (float64 product on the GPU)
        gemm_f16_nt(dA[0], dB[0], np.float32, out=d32, rt=rt)
        ref = A[0].double() @ B[0].double().T
        rel = float((C32.double() - ref).norm() / ref.norm())
        del ref

        rec = {"M": M, "N": N, "K": K, "label": lab, "pick": pick, "rel_err": rel,
               "nsets": nsets, "variants": {}}
        cands = [pick]
        if args.sweep:
            pool = GEMVS if M == 1 else {**TILES, **(WGMMA if rt.arch == 'sm_90' else {})}
            cands += [v for v in pool if v != pick]
        for v in cands:
            est = first_us(ours(v, "f16"))
            ts = timed(ours(v, "f16"), est)
            rec["variants"][v] = ts
        for mode in ("f32", "acc"):
            ts = timed(ours(pick, mode), statistics.median(rec["variants"][pick]))
            rec[f"pick_{mode}"] = ts
        rec["pick_again"] = timed(ours(pick, "f16"), statistics.median(rec["variants"][pick]))
        est = first_us(torch_mm)
        rec["torch"] = timed(torch_mm, est)
        rows.append(rec)
        best = min(rec["variants"], key=lambda v: statistics.median(rec["variants"][v]))
        rec["best"] = best
        med = statistics.median(rec["variants"][pick])
        print(f"  {lab:8s} M={M:5d} N={N:6d} K={K:6d} pick={pick} {flop / med / 1e6:7.1f} "
              f"TFLOP/s  best={best} {flop / statistics.median(rec['variants'][best]) / 1e6:7.1f}"
              f"  torch {flop / statistics.median(rec['torch']) / 1e6:7.1f}  rel {rel:.1e}",
              flush=True)
        if args.sweep:
            print("    sweep: " + " ".join(
                f"{v.replace('gemm_f16_nt_', '').replace('gemv_f16_', '').replace('wgmma_f16_nt_', 'WG')}:"
                f"{flop / statistics.median(ts) / 1e6:.0f}" for v, ts in sorted(
                    rec["variants"].items(), key=lambda kv: statistics.median(kv[1]))),
                flush=True)
        del A, B, C32, C16, dA, dB, d32, d16  # the views keep their tensors alive
        torch.cuda.empty_cache()

    # host-side launcher overhead (no sync): tiny problem, many calls
    a = torch.randn(16, 64, device=dev).half()
    b = torch.randn(64, 64, device=dev).half()
    c = torch.empty(16, 64, device=dev)
    da, db, dc = wrap(a), wrap(b), wrap(c)
    for _ in range(10):
        gemm_f16_nt(da, db, np.float32, out=dc, rt=rt)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(500):
        gemm_f16_nt(da, db, np.float32, out=dc, rt=rt)
    host_us = (time.perf_counter() - t) / 500 * 1e6
    torch.cuda.synchronize()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": copy_gbs, "host_us": host_us, "rows": rows}, f, indent=1)

    def fmt(ts, flop):
        med = statistics.median(ts)
        return (f"{flop / med / 1e6:6.1f} [{flop / max(ts) / 1e6:5.1f},"
                f"{flop / min(ts) / 1e6:5.1f}]")

    print(f"\nlauncher host overhead: {host_us:.1f} us/call; copy ceiling {copy_gbs:.0f} GB/s")
    print("TFLOP/s median [min,max] over reps; ratio = ours(pick, f16 out) / torch (f16 out)")
    print(f"{'shape':8s} {'M':>5s} {'N':>6s} {'K':>6s} {'us':>8s} {'pick f16':>20s} "
          f"{'f32':>6s} {'acc':>6s} {'again':>6s} {'torch':>20s} {'ratio':>5s}  best/pick  "
          f"pick")
    for r in rows:
        flop = 2.0 * r["M"] * r["N"] * r["K"]
        tp, tt = r["variants"][r["pick"]], r["torch"]
        med = lambda ts: flop / statistics.median(ts) / 1e6  # noqa: E731
        extra = ""
        if r["M"] == 1:
            gbs = 2 * r["N"] * r["K"] / (statistics.median(tp) * 1e-6) / 1e9
            extra = f"  GEMV {gbs:.0f} GB/s ({gbs / copy_gbs * 100:.0f}% of copy)"
        print(f"{r['label']:8s} {r['M']:5d} {r['N']:6d} {r['K']:6d} "
              f"{statistics.median(tp):8.1f} {fmt(tp, flop):>20s} {med(r['pick_f32']):6.1f} "
              f"{med(r['pick_acc']):6.1f} {med(r['pick_again']):6.1f} {fmt(tt, flop):>20s} "
              f"{med(tp) / med(tt):5.2f}  "
              f"{statistics.median(tp) / statistics.median(r['variants'][r['best']]):.2f}"
              f"  {r['pick'].replace('gemm_f16_nt_', '').replace('wgmma_f16_nt_', 'WG')}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
