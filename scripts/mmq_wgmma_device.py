"""Device check and timing of the Hopper wgmma MMQ kernel against the wide mma.sync kernel.

python3 scripts/mmq_wgmma_device.py ["NAME=-DOPT,-DOPT2" ...]   (default: the launcher's build)
1. bitwise: split_q8_1 and repack_q4k against their numpy twins (ragged shapes);
2. parity of every variant against minfer.quants.mmq_ref (float64) on ragged shapes;
3. timing at M = 512 on the Llama-3-8B shapes, interleaved rounds (wide KD=4 mma.sync, then
   each wgmma variant), each a CUDA-event-timed batch of 20 launches over 3 rotating weight
   sets; median and p90-p10 spread over 7 rounds. Prints a table last.
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.config import GemmConfig
from minfer.cuda.mmq import Q4_K, mmq_linear, quantize_q8_1
from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack_q4k, split_q8_1
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_ref import mmq_linear_ref
from minfer.quants.mmq_wgmma_ref import repack_q4k_ref, split_q8_1_ref

sys.path.insert(0, "scripts")
from mmq_device import interleaved, print_table, rand_weights, rel  # noqa: E402


def main(specs: list[str]) -> int:
    rt = get_runtime()
    rng = np.random.default_rng(11)
    variants = [(s.split("=", 1)[0], tuple(o for o in s.split("=", 1)[1].split(",") if o))
                for s in specs] or [
        ("wgmma", ())]
    fails = 0
    # 1. bitwise layouts
    M, N, K = 77, 333, 1280
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rand_weights(rng, Q4_K, N, K)
    aq, ta = split_q8_1(rt, da.to_device(rt, x))
    raq, rta = split_q8_1_ref(x)
    ok = np.array_equal(aq.get(), raq) and np.array_equal(ta.get().view(np.uint32),
                                                          rta.view(np.uint32))
    print(f"split_q8_1 bitwise {M}x{K}: {'OK' if ok else 'MISMATCH'}")
    fails += not ok
    xh = x.astype(np.float16)
    aqh, tah = split_q8_1(rt, da.to_device(rt, xh))
    raqh, rtah = split_q8_1_ref(xh.astype(np.float32))
    ok = np.array_equal(aqh.get(), raqh) and np.array_equal(tah.get(), rtah)
    print(f"split_q8_1 f16 bitwise: {'OK' if ok else 'MISMATCH'}")
    fails += not ok
    r = repack_q4k(rt, da.to_device(rt, w), N, K)
    rw, rtw = repack_q4k_ref(w, N, K)
    ok = np.array_equal(r.wq.get(), rw) and np.array_equal(r.tw.get(), rtw)
    print(f"repack_q4k bitwise {N}x{K}: {'OK' if ok else 'MISMATCH'}")
    fails += not ok
    # 2. parity
    for (M, N, K) in ((77, 333, 1280), (1, 8, 256), (128, 64, 256), (300, 1000, 4096),
                      (129, 200, 512)):
        w = rand_weights(rng, Q4_K, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32)
        ref = mmq_linear_ref(x, w, Q4_K, M, N, K)
        wr = repack_q4k(rt, da.to_device(rt, w), N, K)
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
            print(f"parity {name:12} {M}x{N}x{K}: {e:.2e} (+=: {e2:.2e})", flush=True)
    # 3. timing
    M = 512
    rows = []
    wide = GemmConfig(mmq=True, kd=4, wgmma=False)
    for (N, K) in ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 4096)):
        raws = [da.to_device(rt, rand_weights(rng, Q4_K, N, K)) for _ in range(3)]
        reps = [repack_q4k(rt, r_, N, K) for r_ in raws]
        x = rng.standard_normal((M, K)).astype(np.float32)
        xd = da.to_device(rt, x)
        q8 = quantize_q8_1(rt, xd)
        sp = split_q8_1(rt, xd)
        out = da.empty(rt, (M, N), np.float32)
        ref = mmq_linear_ref(x[:16], raws[0].get(), Q4_K, 16, N, K)
        for name, opts in variants:
            mmq_wgmma_linear(rt, sp, reps[0], M, N, K, out, build_opts=opts)
            e = rel(out.get()[:16], ref)
            fails += not e <= 1e-3
        runs = [("wide-kd4", lambda i: mmq_linear(rt, q8, raws[i % 3], Q4_K, M, N, K, wide, out))]
        runs += [(name, (lambda o: lambda i: mmq_wgmma_linear(rt, sp, reps[i % 3], M, N, K, out,
                                                              build_opts=o))(opts))
                 for name, opts in variants]
        runs += [("split-prepass", lambda i: split_q8_1(rt, xd, *sp)),
                 ("q8_1-prepass", lambda i: quantize_q8_1(rt, xd, q8))]
        for name, (us, spread) in interleaved(rt, runs).items():
            rows.append((f"{N}x{K}", name, us, 2 * M * N * K / us / 1e6, spread))
        for r_ in raws:
            r_.gpudata.free()
        for r_ in reps:
            r_.free()
    print_table(["N x K (M=512)", "kernel", "µs:", "TOPS:", "p90-p10:"], rows,
                ["", "", ".1f", ".0f", ".1%"])
    print("ALL OK" if not fails else f"{fails} FAILURES")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
