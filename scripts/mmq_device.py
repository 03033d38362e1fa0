"""Device run for the MMQ family: q8_1 prepass bit-exactness, parity of every MMQ variant
against minfer.quants.mmq_ref (ragged shapes too), then timing at M=512 on Llama-3-8B shapes.

python3 scripts/mmq_device.py [--quick]   (needs a GPU + pycuda; prints a table last)
"""

from __future__ import annotations

import sys
import time

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.config import GemmConfig
from minfer.cuda.mmq import Q4_K, Q6_K, mmq_linear, quantize_q8_1, wide_smem
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_ref import mmq_linear_ref
from minfer.quants.q8_1 import quantize_q8_1_raw

CFGS = {"r1": GemmConfig(mmq=True, raw=False), "narrow": GemmConfig(mmq=True, wide=False),
        "wide-kd4": GemmConfig(mmq=True, kd=4, wgmma=False),
        "wide-kd8": GemmConfig(mmq=True, kd=8, wgmma=False)}


def rand_weights(rng, qtype, N, K):
    kb = K // 256
    if qtype == Q4_K:
        w = rng.integers(0, 256, (N, kb, 144), dtype=np.uint8)
        for off in (0, 2):
            w[..., off:off + 2] = rng.uniform(1e-3, 2e-2, (N, kb)).astype(np.float16).view(
                np.uint8).reshape(N, kb, 2)
    else:
        w = rng.integers(0, 256, (N, kb, 210), dtype=np.uint8)
        w[..., 208:210] = rng.uniform(1e-4, 2e-3, (N, kb)).astype(np.float16).view(
            np.uint8).reshape(N, kb, 2)
    return w.reshape(N, -1)


def rel(y, r):
    return float(np.linalg.norm(y.astype(np.float64) - r) / max(np.linalg.norm(r), 1e-30))


def print_table(cols: list[str], rows, fmt: list[str]) -> None:
    """A markdown table: cols = header names (a trailing ':' right-aligns), fmt = one format
    spec per column ('' for str)."""
    print("\n| " + " | ".join(c.rstrip(":") for c in cols) + " |")
    print("| " + " | ".join("---:" if c.endswith(":") else "---" for c in cols) + " |")
    for r in rows:
        print("| " + " | ".join(format(v, f) for v, f in zip(r, fmt)) + " |")


def interleaved(rt, runs, rounds: int = 7, batch: int = 20):
    """runs: [(name, f(i))]; rounds of (A B C ...), each an event-timed batch of `batch` calls
    f(0..batch-1), queued behind a spin kernel (smoke.cu spin_cycles, 3 ms) so the batch runs
    back to back: the host's launch time (tens of µs a call from Python) stays out of the
    figure. -> {name: (median µs per call, (p90 - p10) / median)}."""
    times = {name: [] for name, _ in runs}
    spin = rt.function("smoke", "spin_cycles")
    for _ in range(rounds):
        for name, f in runs:
            a, b = rt.drv.Event(), rt.drv.Event()
            rt.launch(spin, (1,), (1,), (np.int64(6_000_000),))
            a.record()
            for i in range(batch):
                f(i)
            b.record()
            b.synchronize()
            times[name].append(a.time_till(b) * 1e3 / batch)
    out = {}
    for name, ts in times.items():
        ts = np.array(ts)
        us = float(np.median(ts))
        out[name] = (us, float((np.percentile(ts, 90) - np.percentile(ts, 10)) / us))
    return out


def main(quick: bool) -> int:
    rt = get_runtime()
    print(f"device {rt.name} {rt.arch} SMs {rt.sm_count} smem_optin {rt.smem_optin}; "
          f"wide smem KD4 {wide_smem(4)} KD8 {wide_smem(8)}", flush=True)
    rng = np.random.default_rng(1234)
    fails = 0
    # 1. q8_1 prepass bit-exactness (f32 and f16 inputs; zero block included)
    for dt in (np.float32, np.float16):
        x = (rng.standard_normal((77, 4096)) * rng.uniform(0.01, 30, (77, 1))).astype(dt)
        x[3, 64:96] = 0
        x[5, :32] = 1.0 / 254 * np.arange(32)   # exact .5 ties of x/d
        q = quantize_q8_1(rt, da.to_device(rt, x)).get()
        ok = np.array_equal(q, quantize_q8_1_raw(x.astype(np.float32)))
        fails += not ok
        print(f"q8_1 prepass {np.dtype(dt).name}: {'bit-identical' if ok else 'MISMATCH'}")
    # 2. parity
    shapes = [(77, 200, 512), (64, 128, 1024), (1, 45, 256), (130, 333, 2048), (512, 576, 1536)]
    rows = []
    for qt in (Q4_K, Q6_K):
        for (M, N, K) in shapes:
            w = rand_weights(rng, qt, N, K)
            x = rng.standard_normal((M, K)).astype(np.float32)
            ref = mmq_linear_ref(x, w, qt, M, N, K)
            wd, xd = da.to_device(rt, w), da.to_device(rt, x)
            for name, cfg in CFGS.items():
                out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
                mmq_linear(rt, xd, wd, qt, M, N, K, cfg, out)
                y = out.get()
                e = rel(y, ref) if np.isfinite(y).all() else float("inf")
                ok = e <= 1e-3
                fails += not ok
                rows.append((("q4_K" if qt == Q4_K else "q6_K"), name, f"{M}x{N}x{K}", e, ok))
            # accumulate epilogue (wide kd4)
            base = rng.standard_normal((M, N)).astype(np.float32)
            out = da.to_device(rt, base)
            mmq_linear(rt, xd, wd, qt, M, N, K, CFGS["wide-kd4"], out, accumulate=True)
            e = rel(out.get(), ref + base)
            fails += e > 1e-3
            rows.append((("q4_K" if qt == Q4_K else "q6_K"), "wide-kd4 acc", f"{M}x{N}x{K}", e,
                         e <= 1e-3))
    print("\nparity (rel L2 err vs mmq_ref float64, gate 1e-3)")
    for r in rows:
        print(f"  {r[0]:5} {r[1]:13} {r[2]:>16} {r[3]:.2e} {'ok' if r[4] else 'FAIL'}")
    sys.stdout.flush()
    # 3. timing at M = 512 (Llama-3-8B shapes), 3 rotating weight sets
    drv = rt.drv
    M = 512
    tshapes = [(4096, 4096), (14336, 4096), (4096, 14336)]
    trows = []
    for qt in (Q4_K, Q6_K):
        for (N, K) in (tshapes if qt == Q4_K else tshapes[:1]):
            ws = [da.to_device(rt, rand_weights(rng, qt, N, K)) for _ in range(3)]
            x = rng.standard_normal((M, K)).astype(np.float32)
            xd = da.to_device(rt, x)
            q8 = quantize_q8_1(rt, xd)
            out = da.empty(rt, (M, N), np.float32)
            # sampled correctness on the timing shape: rows 0..15 of the output
            for name, cfg in CFGS.items():
                if quick and name == "r1":
                    continue
                mmq_linear(rt, q8, ws[0], qt, M, N, K, cfg, out)
                y = out.get()[:16]
                ref = mmq_linear_ref(quantize_q8_1_raw(x[:16]), ws[0].get(), qt, 16, N, K)
                e = rel(y, ref)
                fails += e > 1e-3
                reps = 10 if name in ("r1", "narrow") else 30
                for i in range(3):
                    mmq_linear(rt, q8, ws[i % 3], qt, M, N, K, cfg, out)
                ts = []   # back-to-back launches between one event pair: host launch cost hidden
                for _ in range(5):
                    a, b = drv.Event(), drv.Event()
                    a.record()
                    for i in range(reps):
                        mmq_linear(rt, q8, ws[i % 3], qt, M, N, K, cfg, out)
                    b.record()
                    b.synchronize()
                    ts.append(a.time_till(b) * 1e3 / reps)
                us = float(np.median(ts))
                spread = (np.percentile(ts, 90) - np.percentile(ts, 10)) / us
                gmac = M * N * K / 1e9
                trows.append(("q4_K" if qt == Q4_K else "q6_K", name, f"{N}x{K}", us, us / gmac,
                              2 * gmac * 1e9 / us / 1e6, spread, e))
            # prepass cost
            ts = []
            for _ in range(5):
                a, b = drv.Event(), drv.Event()
                a.record()
                for i in range(50):
                    quantize_q8_1(rt, xd, q8)
                b.record()
                b.synchronize()
                ts.append(a.time_till(b) * 1e3 / 50)
            trows.append(("-", "q8_1 prepass", f"{M}x{K}", float(np.median(ts)), 0, 0, 0, 0))
            for w in ws:
                w.gpudata.free()
    print("\nparity (rel L2 err vs mmq_ref float64, gate 1e-3)")
    for r in rows:
        print(f"  {r[0]:5} {r[1]:13} {r[2]:>16} {r[3]:.2e} {'ok' if r[4] else 'FAIL'}")
    print(f"\ntiming M={M} (median; TOPS = 2*M*N*K/t; int8 mma.sync ceiling 1267)")
    print(f"  {'type':5} {'variant':13} {'NxK':>11} {'us':>9} {'us/GMAC':>8} {'TOPS':>7} "
          f"{'%ceil':>6} {'p90-p10':>7} {'relerr':>8}")
    for r in trows:
        print(f"  {r[0]:5} {r[1]:13} {r[2]:>11} {r[3]:9.1f} {r[4]:8.2f} {r[5]:7.1f} "
              f"{100 * r[5] / 1267:6.1f} {r[6]:7.1%} {r[7]:8.1e}")
    print(f"\n{'ALL OK' if not fails else f'{fails} FAILURES'}")
    return 1 if fails else 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main("--quick" in sys.argv)
    print(f"({time.time() - t0:.0f} s)")
    sys.exit(rc)
