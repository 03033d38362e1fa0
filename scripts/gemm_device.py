"""f16 GEMM A/B on the device without torch: the engine's Llama-3-8B GEMMs (fused qkv and
gate|up with f32 out, attn_output and ffn_down accumulating into f32) at M = 512 and 2048, each
variant cross-checked against the current pick's output, then timed interleaved (median of 7
event-timed batches queued behind a spin kernel); gate|up also as the engine runs it, the glu
epilogue against f32 out + the swiglu launch (random weights: the interleave does not change
the timing). Prints a table last.

python3 scripts/gemm_device.py [VARIANT ...]   (default: the pick and every wgmma_f16_tma_* entry)
A VARIANT may carry extra nvcc options after an @ (comma-separated): ENTRY@-DNAME=VALUE builds
a copy of ENTRY with them, to A/B a kernel's compile-time knob in the same process, e.g.
wgmma_f16_tma_128x256x64_s4@-DACC_PREFETCH_KTILES=0. qkv also runs as the engine runs it: the
rope epilogue (gemm mode 4) against f32 out + the rope_qkv launch.
"""

from __future__ import annotations

import sys

import numpy as np

from minfer.cuda import devarray as da
from minfer.cuda.gemm import TMA, gemm_f16_nt, pick_variant
from minfer.cuda.runtime import get_runtime
from mmq_device import interleaved, print_table

SHAPES = [("qkv", 6144, 4096, "f32"), ("o", 4096, 4096, "acc"),
          ("gate_up", 28672, 4096, "f32"), ("down", 4096, 14336, "acc")]
L2_BYTES = 60 * 2**20


def _with_options(spec: str) -> str:
    """Register ENTRY@OPT,OPT as a copy of ENTRY's table row built with the extra options."""
    from dataclasses import fields

    from minfer.cuda.gemm import VARIANTS

    if "@" in spec and spec not in VARIANTS:
        entry, _, opts = spec.partition("@")
        base = VARIANTS[entry]
        cls = type(base)
        sub = type(cls.__name__ + "Opt", (cls,), {"options": cls.options + tuple(opts.split(","))})
        VARIANTS[spec] = sub(**{f.name: getattr(base, f.name) for f in fields(base)})
    return spec


def _rope_rows(rt, M, A, Bs, nsets, C, flop, rows):
    """qkv as the engine runs it: the rope epilogue against f32 out + rope_qkv (8B heads)."""
    from minfer.cuda import layers as L

    Hq, Hkv, D = 32, 8, 128
    table = L.RopeTable.build(rt, M, 500000.0, D)
    pos = da.to_device(rt, np.zeros(1, np.int32))
    q16 = da.empty(rt, (M, Hq, D), np.float16)
    kc, vc = (da.empty(rt, (M, Hkv, D), np.float16) for _ in range(2))
    target = L.QkvRope(rt, q16, kc, vc, table, pos, D, False)

    def fused(i):
        gemm_f16_nt(A, Bs[i % nsets], rt=rt, rope=target)

    def plain(i):
        gemm_f16_nt(A, Bs[i % nsets], np.float32, out=C, rt=rt)
        L.rope_qkv(rt, q16, C, C, C, kc, vc, table, 0, pos, D, False, (0, Hq * D, (Hq + Hkv) * D))

    res = interleaved(rt, [("f32 + rope_qkv", plain), ("rope epilogue", fused)], rounds=7,
                      batch=10)
    base = res["f32 + rope_qkv"][0]
    for name in ("f32 + rope_qkv", "rope epilogue"):
        us, spread = res[name]
        rows.append((M, "qkv", "roped f16", name, us, 100 * spread, flop / us / 1e6, base / us))


def main() -> int:
    rt = get_runtime()
    extra = [_with_options(v) for v in sys.argv[1:]] or sorted(TMA)
    rng = np.random.default_rng(0)
    rows, ok = [], True
    for M in (512, 2048):
        for lab, N, K, mode in SHAPES:
            nsets = 1 if 2 * N * K > L2_BYTES else 3   # weights rotate past the L2
            A = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float16))
            Bs = [da.to_device(rt, (rng.standard_normal((N, K)) * 0.05).astype(np.float16))
                  for _ in range(nsets)]
            C = da.empty(rt, (M, N), np.float32)
            pick = pick_variant(M, N, K, rt.sm_count, rt.arch)
            variants = [pick] + [v for v in extra if v != pick]

            def call(v, i):
                if mode == "acc":
                    gemm_f16_nt(A, Bs[i % nsets], np.float32, accumulate=C, rt=rt, variant=v)
                else:
                    gemm_f16_nt(A, Bs[i % nsets], np.float32, out=C, rt=rt, variant=v)

            outs = {}
            for v in variants:   # f32 out of the same inputs: every variant against the pick
                gemm_f16_nt(A, Bs[0], np.float32, out=C, rt=rt, variant=v)
                outs[v] = C.get().astype(np.float64)
            ref = outs[pick]
            for v in variants[1:]:
                err = float(np.linalg.norm(outs[v] - ref) / np.linalg.norm(ref))
                good = err < 1e-5 and bool(np.isfinite(outs[v]).all())
                ok &= good
                print(f"{lab} M={M} {v}: rel {err:.1e} against {pick} {'OK' if good else 'FAIL'}",
                      flush=True)
            res = interleaved(rt, [(v, lambda i, v=v: call(v, i)) for v in variants],
                              rounds=7, batch=10)
            flop = 2.0 * M * N * K
            base = res[pick][0]
            for v in variants:
                us, spread = res[v]
                rows.append((M, lab, mode, v.replace("wgmma_f16_", ""), us, 100 * spread,
                             flop / us / 1e6, base / us))
            if lab == "qkv":
                _rope_rows(rt, M, A, Bs, nsets, C, flop, rows)
            if lab == "gate_up":   # the glu epilogue against f32 out + the swiglu launch
                from minfer.cuda.layers import swiglu_fused

                Y = da.empty(rt, (M, N // 2), np.float16)

                def glu(i):
                    gemm_f16_nt(A, Bs[i % nsets], np.float16, out=Y, rt=rt, glu=True)

                def plain(i):
                    gemm_f16_nt(A, Bs[i % nsets], np.float32, out=C, rt=rt)
                    swiglu_fused(rt, Y, C)

                res = interleaved(rt, [("f32 + swiglu", plain), ("glu epilogue", glu)],
                                  rounds=7, batch=10)
                base = res["f32 + swiglu"][0]
                for name in ("f32 + swiglu", "glu epilogue"):
                    us, spread = res[name]
                    rows.append((M, lab, "f16 out", name, us, 100 * spread, flop / us / 1e6,
                                 base / us))
                del Y
            del A, Bs, C
    print_table(["M:", "gemm", "mode", "variant", "µs:", "p90-p10 %:", "TFLOP/s:", "vs pick:"],
                rows, ["d", "", "", "", ".1f", ".1f", ".0f", ".3f"])
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
