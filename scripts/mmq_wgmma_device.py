"""Device check and timing of the Hopper wgmma MMQ kernels against the wide mma.sync kernels.

python3 scripts/mmq_wgmma_device.py [--types q4_K,q6_K] ["NAME=-DOPT,-DOPT2" ...]
(default: both types, the launcher's build). Per type:
1. bitwise: the split prepass (f32 and f16 input) and the weight repack against their numpy
   twins (ragged shapes);
2. parity of every variant against minfer.quants.mmq_ref (float64) on ragged shapes, = and +=;
3. timing at M = 512 on the Llama-3-8B shapes, interleaved rounds (wide KD=4 mma.sync, then
   each wgmma variant, with N = 4096 also as C += (the residual GEMMs), then the prepasses), each a CUDA-event-timed batch of 20 launches over
   3 rotating weight sets; median and p90-p10 spread over 7 rounds. Prints a table last.
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.config import GemmConfig
from minfer.cuda.mmq import Q4_K, Q6_K, mmq_linear, quantize_q8_1
from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack, split6_q8_1, split_q8_1
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_ref import mmq_linear_ref
from minfer.quants.mmq_wgmma_ref import (repack_q4k_ref, repack_q6k_ref, split6_q8_1_ref,
                                         split_q8_1_ref)

sys.path.insert(0, "scripts")
from mmq_device import interleaved, print_table, rand_weights, rel  # noqa: E402


# qtype -> (name, split launcher, split twin, repack twin, timed (N, K) shapes at M = 512)
TYPES = {Q4_K: ("q4_K", split_q8_1, split_q8_1_ref, repack_q4k_ref,
                ((4096, 4096), (14336, 4096), (4096, 14336), (5120, 4096), (6144, 4096),
                 (28672, 4096))),
         Q6_K: ("q6_K", split6_q8_1, split6_q8_1_ref, repack_q6k_ref,
                ((4096, 14336), (4096, 4096), (1024, 4096), (14336, 4096)))}


def same(dev, ref) -> bool:
    """Bitwise equality of a device array and its twin (any dtypes of equal size)."""
    a, b = np.ascontiguousarray(dev.get()), np.ascontiguousarray(ref)
    return a.nbytes == b.nbytes and np.array_equal(a.view(np.uint8).ravel(), b.view(np.uint8).ravel())


def main(args: list[str]) -> int:
    rt = get_runtime()
    rng = np.random.default_rng(11)
    types = [Q4_K, Q6_K]
    if args and args[0] == "--types":
        names = {v[0]: k for k, v in TYPES.items()}
        types, args = [names[t] for t in args[1].split(",")], args[2:]
    variants = [(s.split("=", 1)[0], tuple(o for o in s.split("=", 1)[1].split(",") if o))
                for s in args] or [("wgmma", ())]
    fails, rows = 0, []
    for qt in types:
        f, r = check_and_time(rt, rng, qt, variants)
        fails, rows = fails + f, rows + r
    print_table(["type", "N x K (M=512)", "kernel", "µs:", "TOPS:", "p90-p10:"], rows,
                ["", "", "", ".1f", ".0f", ".1%"])
    print("ALL OK" if not fails else f"{fails} FAILURES")
    return 1 if fails else 0


def check_and_time(rt, rng, qt, variants):
    tname, split, split_ref, repack_ref, shapes = TYPES[qt]
    fails = 0
    # 1. bitwise layouts
    M, N, K = 77, 333, 1280
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rand_weights(rng, qt, N, K)
    for xin in (x, x.astype(np.float16)):
        ok = all(same(a, b) for a, b in zip(split(rt, da.to_device(rt, xin)),
                                            split_ref(xin.astype(np.float32))))
        print(f"{tname} split {xin.dtype} bitwise {M}x{K}: {'OK' if ok else 'MISMATCH'}")
        fails += not ok
    r = repack(rt, da.to_device(rt, w), qt, N, K)
    ok = all(same(a, b) for a, b in zip((r.wq, r.tw), repack_ref(w, N, K)))
    print(f"{tname} repack bitwise {N}x{K}: {'OK' if ok else 'MISMATCH'}")
    fails += not ok
    # 2. parity
    for (M, N, K) in ((77, 333, 1280), (1, 8, 256), (128, 64, 256), (300, 1000, 4096),
                      (129, 200, 512), (65, 129, 768)):
        w = rand_weights(rng, qt, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32)
        ref = mmq_linear_ref(x, w, qt, M, N, K)
        wr = repack(rt, da.to_device(rt, w), qt, N, K)
        xd = da.to_device(rt, x)
        for name, opts in variants:
            out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
            mmq_wgmma_linear(rt, xd, wr, M, N, K, out, build_opts=opts)
            e = rel(out.get(), ref)
            acc0 = rng.standard_normal((M, N)).astype(np.float32)
            out2 = da.to_device(rt, acc0)
            mmq_wgmma_linear(rt, xd, wr, M, N, K, out2, accumulate=True, build_opts=opts)
            e2 = rel(out2.get() - acc0, ref)
            fails += not (e <= 1e-3 and e2 <= 1e-3)
            print(f"{tname} parity {name:12} {M}x{N}x{K}: {e:.2e} (+=: {e2:.2e})", flush=True)
    # 3. timing
    M = 512
    rows = []
    wide = GemmConfig(mmq=True, kd=4, wgmma=False)
    for (N, K) in shapes:
        raws = [da.to_device(rt, rand_weights(rng, qt, N, K)) for _ in range(3)]
        reps = [repack(rt, r_, qt, N, K) for r_ in raws]
        x = rng.standard_normal((M, K)).astype(np.float32)
        xd = da.to_device(rt, x)
        q8 = quantize_q8_1(rt, xd)
        sp = split(rt, xd)
        out = da.empty(rt, (M, N), np.float32)
        ref = mmq_linear_ref(x[:16], raws[0].get(), qt, 16, N, K)
        for name, opts in variants:
            mmq_wgmma_linear(rt, sp, reps[0], M, N, K, out, build_opts=opts)
            e = rel(out.get()[:16], ref)
            fails += not e <= 1e-3
        runs = [("wide-kd4", lambda i: mmq_linear(rt, q8, raws[i % 3], qt, M, N, K, wide, out))]
        runs += [(name, (lambda o: lambda i: mmq_wgmma_linear(rt, sp, reps[i % 3], M, N, K, out,
                                                              build_opts=o))(opts))
                 for name, opts in variants]
        if N == 4096:   # the residual GEMMs (attn_output, ffn_down) run C +=
            runs += [(name + " +=", (lambda o: lambda i: mmq_wgmma_linear(
                rt, sp, reps[i % 3], M, N, K, out, accumulate=True, build_opts=o))(opts))
                for name, opts in variants]
        runs += [("split-prepass", lambda i: split(rt, xd, *sp)),
                 ("q8_1-prepass", lambda i: quantize_q8_1(rt, xd, q8))]
        for name, (us, spread) in interleaved(rt, runs).items():
            rows.append((tname, f"{N}x{K}", name, us, 2 * M * N * K / us / 1e6, spread))
        for r_ in raws:
            r_.gpudata.free()
        for r_ in reps:
            r_.free()
    return fails, rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
