"""Device check and timing of the super-block MMQ kernels (kernels/mmq_sb_q4k.cu, mmq_sb_q6k.cu)
against the wgmma kernels they would replace.

python3 scripts/mmq_sb_device.py [--types q4_K,q6_K] ["NAME=-DOPT,-DOPT2" ...]
(default: both types, the launcher's build). Per type:
1. bitwise: the q8s split prepass (f32 and f16 input; signed for q6_K) and the SB repack
   against their twins;
2. parity against minfer.quants.mmq_sb_ref.mmq_sb_linear_ref (float64) on ragged shapes, = and
   +=, and with the grid capped (stream-K over super-blocks), plus a bitwise second launch;
3. timing at M = 512 on the Llama-3-8B shapes of the type, interleaved rounds (the wgmma
   kernel, then each SB variant, N = 4096 also as C +=, then both prepasses); median and
   p90-p10 over 7 rounds. SB_SHAPES=NxK,... restricts the q4_K shapes (quick A/B calls),
   SB_M sets M.
SB_NOCHECK=1 skips steps 1-2 (timing-only builds such as the kernel's SB_DIAG_* options).
Prints a table last.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.layers import swiglu
from minfer.cuda.mmq_sb import (mmq_sb_linear, repack_sb, sb_operand, sb_operand_swiglu,
                                sb_tokens, split_q8s)
from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack, split6_q8_1, split_q8_1
from minfer.cuda.runtime import get_runtime
from minfer.quants.mmq_sb_ref import (mmq_sb_linear_ref, repack_q4k_sb_ref, repack_q6k_sb_ref,
                                      sb_tokens_ref, split_q8s_ref)

sys.path.insert(0, "scripts")
from mmq_device import interleaved, print_table, rand_weights, rel  # noqa: E402
from mmq_wgmma_device import same  # noqa: E402

Q4_K, Q6_K = 12, 14
NAME = {Q4_K: "q4_K", Q6_K: "q6_K"}
SHAPES6 = ((4096, 14336), (4096, 4096), (14336, 4096))
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (5120, 4096), (6144, 4096), (28672, 4096))
if os.environ.get("SB_SHAPES"):   # e.g. SB_SHAPES=28672x4096,4096x4096 (quick A/B calls)
    SHAPES = tuple(tuple(int(v) for v in s.split("x")) for s in os.environ["SB_SHAPES"].split(","))


def check(rt, rng, qt, variants) -> int:
    fails, tn, q6 = 0, NAME[qt], qt == Q6_K
    M, N, K = 77, 333, 1280
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rand_weights(rng, qt, N, K)
    for xin in (x, x.astype(np.float16)):
        ok = all(same(a, b) for a, b in zip(split_q8s(rt, da.to_device(rt, xin), signed=q6),
                                            split_q8s_ref(xin.astype(np.float32), signed=q6)))
        print(f"{tn} q8s split {xin.dtype} bitwise {M}x{K}: {'OK' if ok else 'MISMATCH'}")
        fails += not ok
    r = repack_sb(rt, da.to_device(rt, w), qt, N, K)
    got, want = ((r.wp, r.ts), repack_q6k_sb_ref(w, N, K)) if q6 else (
        (r.wb,), (repack_q4k_sb_ref(w, N, K),))
    ok = all(same(a, b) for a, b in zip(got, want))
    print(f"{tn} sb repack bitwise {N}x{K}: {'OK' if ok else 'MISMATCH'}")
    fails += not ok
    if not q6:   # the token operand, an all-zero super-block included
        x0 = x.copy()
        x0[3, 256:512] = 0
        ok = True
        for a_, t_ in (split_q8s_ref(x), split_q8s_ref(x0)):
            ok &= same(sb_tokens(rt, da.to_device(rt, a_), da.to_device(rt, t_)),
                       sb_tokens_ref(a_, t_, M, K))
        print(f"{tn} sb token operand bitwise {M}x{K}: {'OK' if ok else 'MISMATCH'}")
        fails += not ok
        ok = all(same(sb_operand(rt, da.to_device(rt, x_)).tt, sb_tokens_ref(
            *split_q8s_ref(x_.astype(np.float32)), M, K)) for x_ in (x0, x0.astype(np.float16)))
        print(f"{tn} sb operand (one launch) bitwise {M}x{K}: {'OK' if ok else 'MISMATCH'}")
        fails += not ok
    for (M, N, K) in ((77, 333, 1280), (1, 8, 256), (128, 64, 256), (300, 1000, 4096),
                      (129, 200, 512), (65, 129, 768), (512, 1000, 4096)):
        w = rand_weights(rng, qt, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32)
        if K >= 512:
            x[M // 2, 256:512] = 0   # an all-zero super-block
        ref = mmq_sb_linear_ref(x, w, M, N, K, qt)
        wr = repack_sb(rt, da.to_device(rt, w), qt, N, K)
        xd = da.to_device(rt, x)
        for name, opts in variants:
            for sms in (None, 5):   # 5 SMs: stream-K splits on every multi-tile shape
                out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
                mmq_sb_linear(rt, xd, wr, M, N, K, out, build_opts=opts, sms=sms)
                y = out.get()
                e = rel(y, ref)
                mmq_sb_linear(rt, xd, wr, M, N, K, out, build_opts=opts, sms=sms)
                again = np.array_equal(out.get(), y)
                acc0 = rng.standard_normal((M, N)).astype(np.float32)
                out2 = da.to_device(rt, acc0)
                mmq_sb_linear(rt, xd, wr, M, N, K, out2, accumulate=True, build_opts=opts, sms=sms)
                e2 = rel(out2.get() - acc0, ref)
                fails += not (e <= 1e-3 and e2 <= 1e-3 and again)
                print(f"{tn} sb parity {name:10} sms={sms} {M}x{N}x{K}: {e:.2e} (+=: {e2:.2e})"
                      f"{'' if again else ' NOT DETERMINISTIC'}", flush=True)
    return fails


def time_all(rt, rng, qt, variants):
    M, rows, q6 = int(os.environ.get("SB_M", 512)), [], qt == Q6_K
    for (N, K) in (SHAPES6 if q6 else SHAPES):
        raws = [da.to_device(rt, rand_weights(rng, qt, N, K)) for _ in range(3)]
        wg = [repack(rt, r_, qt, N, K) for r_ in raws]
        sb = [repack_sb(rt, r_, qt, N, K) for r_ in raws]
        xd = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
        splitw = split6_q8_1 if q6 else split_q8_1
        sp, sq = splitw(rt, xd), split_q8s(rt, xd, signed=q6)
        out = da.empty(rt, (M, N), np.float32)
        runs = [("wgmma", lambda i: mmq_wgmma_linear(rt, sp, wg[i % 3], M, N, K, out))]
        if not q6:
            sq = (*sq, sb_tokens(rt, *sq))   # q4_K's operand: the split and its token blocks
        runs += [(name, (lambda o: lambda i: mmq_sb_linear(rt, sq, sb[i % 3], M, N, K, out,
                                                           build_opts=o))(opts))
                 for name, opts in variants]
        if N == 4096:
            runs += [("wgmma +=", lambda i: mmq_wgmma_linear(rt, sp, wg[i % 3], M, N, K, out,
                                                             accumulate=True))]
            runs += [(name + " +=", (lambda o: lambda i: mmq_sb_linear(
                rt, sq, sb[i % 3], M, N, K, out, accumulate=True, build_opts=o))(opts))
                for name, opts in variants]
        runs += [("split " + ("q8_1x2" if q6 else "q8_1"), lambda i: splitw(rt, xd, *sp)),
                 ("split q8s", lambda i: split_q8s(rt, xd, *sq[:2], signed=q6))]
        if not q6:
            runs += [("sb token operand", lambda i: sb_tokens(rt, *sq)),
                     ("sb operand, one launch", lambda i: sb_operand(rt, xd, sq[2]))]
            if K > 4096:   # ffn_down's input: from the gate and up outputs
                g, u = (da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
                        for _ in range(2))
                f16 = da.empty(rt, (M, K), np.float16)

                def three(i):
                    swiglu(rt, f16, g, u)
                    sb_tokens(rt, *split_q8s(rt, f16, *sq[:2]), sq[2])

                runs += [("swiglu, split, operand", three),
                         ("swiglu + operand, one launch",
                          lambda i: sb_operand_swiglu(rt, g, u, sq[2]))]
        for name, (us, spread) in interleaved(rt, runs).items():
            rows.append((NAME[qt], f"{N}x{K}", name, us, 2 * M * N * K / us / 1e6, spread))
        for a in raws:
            a.gpudata.free()
        for a in wg + sb:
            a.free()
    return rows


def main(args: list[str]) -> int:
    rt = get_runtime()
    rng = np.random.default_rng(7)
    types = [Q4_K, Q6_K]
    if args and args[0] == "--types":
        types, args = [{"q4_K": Q4_K, "q6_K": Q6_K}[t] for t in args[1].split(",")], args[2:]
    variants = [(s.split("=", 1)[0], tuple(o for o in s.split("=", 1)[1].split(",") if o))
                for s in args] or [("sb", ())]
    fails, rows = 0, []
    for qt in types if not os.environ.get("SB_NOCHECK") else ():
        fails += check(rt, rng, qt, variants)
    for qt in types:
        rows += time_all(rt, rng, qt, variants)
    head = f"N x K (M={os.environ.get('SB_M', 512)})"
    print_table(["type", head, "kernel", "µs:", "TOPS:", "p90-p10:"], rows,
                ["", "", "", ".1f", ".0f", ".1%"])
    print("ALL OK" if not fails else f"{fails} FAILURES")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
