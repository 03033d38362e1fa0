"""Build cubins into the cache ahead of a device call, so the call spends no device time
compiling (the cache key holds nvcc's version: a device with another nvcc builds its own).

MINFER_CACHE=.cubin_cache python3 scripts/prebuild.py NAME[:OPT,OPT ...] ...
then carry `.cubin_cache` (scripts/device_run.sh copies it into its cache). Each argument is a
kernel (kernels/NAME.cu) and, after a colon, one comma-separated option set (none: the plain
build); built for sm_90 as the launchers build them, with -arch=sm_90a where the source says
`minfer-archs: sm_90a`. What the f16 and blk forwards load (the launchers' dry pass,
minfer.cuda.load.prepare.needed_kernels, on the tiny llama, granite, olmo2, smollm3 and MoE
presets): attention:-DATT_WARPS=8,-DATT_KEYS=128 attention_sm90a attention_tok dequant
gemm_f16 gemm_f16_sm90a layers mmq_blk, and gemma_layers (gemma, granite), moe (the MoE
families); blk_split for --gemm blk-split.
"""

from __future__ import annotations

import sys

from minfer.cuda.runtime.build import compile_cubin, kernel_path, parse_ptxas


def options(name: str, opts: tuple[str, ...]) -> tuple[str, ...]:
    sm90a = "minfer-archs: sm_90a" in kernel_path(name).read_text()[:4000]
    return (("-arch=sm_90a",) if sm90a else ()) + opts


def main(args: list[str]) -> int:
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    for a in args:
        name, _, o = a.partition(":")
        opts = options(name, tuple(x for x in o.split(",") if x))
        _, rep = compile_cubin(name, "sm_90", opts, report=True)
        for r in parse_ptxas(rep).values():
            print(
                f"{name} {','.join(opts) or '(plain)'}: {r.name} {r.registers} regs, "
                f"spills {r.spill_stores}/{r.spill_loads}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
