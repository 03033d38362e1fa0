"""Isolated GEMM timing at the Llama-3-8B shapes: the f16 path against the block-scaled int8
path (and its build variants), TFLOP/s or TOPS = 2 M N K / t (device machine).

python3 scripts/gemm_blk_bench.py [--tokens 512,2048] [--min-ms 300]
Each row: after a --min-ms pre-roll of back-to-back launches (the board at its power state),
the median of 7 CUDA-event-timed batches of 10 launches; ± half the spread of those 7. The
configs of one shape run interleaved, batch by batch. "blk + prepass" includes the activations'
operand prepass (part of the path's cost), the other blk rows are the GEMM alone (build
variants; -DBLK_NOFOLD is a timing build without the folds). Each GEMM reads the token operand
the forward gives it: one scale per token for qkv and gate|up (mmq_blk_tok: the fold without
its FMUL, once per pair of blocks), per (token, block) for attn_output and ffn_down.
attn_output and ffn_down run C += (the forward adds them to the residual), qkv C =, gate|up its
swiglu epilogue.

python3 scripts/gemm_blk_bench.py --one PATH,N,K,M [--opts -DX,-DY]: one GEMM launched four
times, untimed, for ncu (`ncu -k regex:'mmq_blk|wgmma_f16' --launch-skip 2 --launch-count 1`);
PATH f16 | blk | blk-tok (blk on a per-token operand: the GEMMs after an rmsnorm); the gate|up
shape (N = 28672) runs the swiglu epilogue."""

import argparse

import numpy as np

from minfer.cuda.paths.blk.launch import blk_operand, blk_weight, mmq_blk_linear
from minfer.cuda.paths.f16.gemm import gemm_f16_nt
from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.profile import interleaved_us
from minfer.cuda.runtime.runtime import get_runtime

SHAPES = {
    "qkv": (6144, 4096),
    "attn_output": (4096, 4096),
    "gate|up": (28672, 4096),
    "ffn_down": (4096, 14336),
}
ap = argparse.ArgumentParser()
ap.add_argument("--tokens", default="512,2048")
ap.add_argument("--min-ms", type=float, default=300)
ap.add_argument("--variants", default="-,-DBLK_FOLD=1,-DBLK_NOFOLD")
ap.add_argument("--one", help="PATH,N,K,M: one GEMM launched four times, for ncu")
ap.add_argument("--opts", default="", help="--one's nvcc -D options, comma-separated")
a = ap.parse_args()
rt = get_runtime()
rng = np.random.default_rng(0)


def one(path: str, N: int, K: int, M: int, opts: tuple) -> None:
    glu = N == 28672
    x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float16))
    w16 = da.to_device(rt, (rng.standard_normal((N, K)) * 0.02).astype(np.float16))
    out = da.empty(rt, (M, N // 2) if glu else (M, N), np.float16 if glu else np.float32, "out")
    if path.startswith("blk"):
        wb, tt = blk_weight(rt, w16), blk_operand(rt, x, per_token=path == "blk-tok")
    for _ in range(4):
        if path.startswith("blk"):
            mmq_blk_linear(rt, tt, wb, M, N, K, out, build_opts=opts, glu=glu)
        else:
            gemm_f16_nt(x, w16, np.float16 if glu else np.float32, out=out, rt=rt, glu=glu)
    rt.synchronize()
    print("ok")


if a.one:
    p, *nkm = a.one.split(",")
    one(p, *map(int, nkm), tuple(o for o in a.opts.split(",") if o))
    raise SystemExit(0)
variants = [tuple(v.split()) if v != "-" else () for v in a.variants.split(",")]
print(f"{'GEMM':12} {'M':>5} {'config':22} {'us':>9} {'T(FL)OPS':>9} {'x f16':>6}")
for M in (int(t) for t in a.tokens.split(",")):
    for name, (N, K) in SHAPES.items():
        x = da.to_device(rt, (rng.standard_normal((M, K))).astype(np.float16))
        w16 = da.to_device(rt, (rng.standard_normal((N, K)) * 0.02).astype(np.float16))
        wb = blk_weight(rt, w16)
        out = da.to_device(rt, np.zeros((M, N), np.float32))
        glu = name == "gate|up"
        h = da.empty(rt, (M, N // 2), np.float16, "h")
        tt = blk_operand(rt, x)
        tok = blk_operand(rt, x, per_token=True)

        acc = name in ("attn_output", "ffn_down")  # C += the residual, as in the forward

        def f16():
            if glu:
                gemm_f16_nt(x, w16, np.float16, out=h, rt=rt, glu=True)
            elif acc:
                gemm_f16_nt(x, w16, np.float32, accumulate=out, rt=rt)
            else:
                gemm_f16_nt(x, w16, np.float32, out=out, rt=rt)

        def blk(opts, prepass=False, x_op=tt):
            def run():
                if prepass:
                    blk_operand(rt, x, x_op.tt, per_token=x_op.per_token)
                mmq_blk_linear(
                    rt,
                    x_op,
                    wb,
                    M,
                    N,
                    K,
                    h if glu else out,
                    accumulate=acc,
                    build_opts=opts,
                    glu=glu,
                )

            return run

        op = tt if acc else tok  # the forward's operand: per token after a norm
        cfgs = {
            "f16": f16,
            "blk + prepass": blk((), True, x_op=op),
            **{"blk " + (" ".join(o) or "default"): blk(o, x_op=op) for o in variants},
        }
        times = interleaved_us(rt, cfgs, preroll_ms=a.min_ms)  # (compile, pre-roll, 7 x 10)
        base = float(np.median(times["f16"]))
        for k, ts in times.items():
            med, band = float(np.median(ts)), (max(ts) - min(ts)) / 2
            print(
                f"{name:12} {M:5} {k:22} {med:7.1f}±{band:<4.1f} "
                f"{2 * M * N * K / med / 1e6:9.0f} {base / med:6.2f}",
                flush=True,
            )
        for arr in (x, w16, out, h):
            arr.gpudata.free()
        wb.wb.gpudata.free()
        tt.tt.gpudata.free()
        tok.tt.gpudata.free()
