"""Interleaved A/B of wide-MMQ build variants (nvcc -D options) on the device.

python3 scripts/mmq_variants.py "NAME=KD:-DOPT ..." ...      e.g.  "u1=4:" "u2=8:-DMMQ_STAGE_U=2"
Each variant is checked against minfer.quants.mmq_ref on a ragged shape and on rows 0..15 of
each timing shape, then timed at M = 512 on the Llama-3-8B shapes: rounds of (A B C ...), each
a CUDA-event-timed batch of 20 back-to-back launches over 3 rotating weight sets; median and
p90-p10 spread over 7 rounds. Prints a table last. Uses the production launcher (mmq_linear).
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.config import GemmConfig
from minfer.cuda.mmq import Q4_K, Q6_K, mmq_linear, quantize_q8_1
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_ref import mmq_linear_ref
from minfer.quants.q8_1 import quantize_q8_1_raw

sys.path.insert(0, "scripts")
from mmq_device import interleaved, print_table, rand_weights, rel  # noqa: E402


def parse(spec: str):
    name, rest = spec.split("=", 1)
    kd, _, opts = rest.partition(":")
    return name, GemmConfig(mmq=True, kd=int(kd), wgmma=False), tuple(opts.split())


def main(specs: list[str]) -> int:
    rt = get_runtime()
    rng = np.random.default_rng(7)
    variants = [parse(s) for s in specs]
    fails = 0
    for qt in (Q4_K, Q6_K):   # ragged parity
        M, N, K = 77, 333, 1280
        w = rand_weights(rng, qt, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32)
        ref = mmq_linear_ref(x, w, qt, M, N, K)
        wd, xd = da.to_device(rt, w), da.to_device(rt, x)
        for name, cfg, opts in variants:
            out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
            mmq_linear(rt, xd, wd, qt, M, N, K, cfg, out, build_opts=opts)
            e = rel(out.get(), ref)
            fails += not e <= 1e-3
            print(f"parity {name:10} q{4 if qt == Q4_K else 6}_K {M}x{N}x{K}: {e:.2e}", flush=True)
    M = 512
    rows = []
    for qt, (N, K) in ((Q4_K, (4096, 4096)), (Q4_K, (14336, 4096)), (Q4_K, (4096, 14336)),
                       (Q6_K, (4096, 4096)), (Q6_K, (4096, 14336))):
        ws = [da.to_device(rt, rand_weights(rng, qt, N, K)) for _ in range(3)]
        x = rng.standard_normal((M, K)).astype(np.float32)
        q8 = quantize_q8_1(rt, da.to_device(rt, x))
        out = da.empty(rt, (M, N), np.float32)
        ref = mmq_linear_ref(quantize_q8_1_raw(x[:16]), ws[0].get(), qt, 16, N, K)
        for name, cfg, opts in variants:
            mmq_linear(rt, q8, ws[0], qt, M, N, K, cfg, out, build_opts=opts)
            e = rel(out.get()[:16], ref)
            fails += not e <= 1e-3
        res = interleaved(rt, [(name, (lambda c, o: lambda i: mmq_linear(
            rt, q8, ws[i % 3], qt, M, N, K, c, out, build_opts=o))(cfg, opts))
            for name, cfg, opts in variants])
        for name, (us, spread) in res.items():
            rows.append((f"q{4 if qt == Q4_K else 6}_K", f"{N}x{K}", name, us,
                         2 * M * N * K / us / 1e6, spread))
        for w in ws:
            w.gpudata.free()
    print_table(["type", "N x K", "variant", "µs:", "TOPS:", "p90-p10:"], rows,
                ["", "", "", ".1f", ".0f", ".1%"])
    print("ALL OK" if not fails else f"{fails} PARITY FAILURES")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
