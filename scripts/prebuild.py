"""Build cubins into the cache ahead of a device call (same nvcc version there: the cache key
includes it), so the call spends no device time compiling.

MINFER_CACHE=.devdata/mcache python3 scripts/prebuild.py mmq_blk [-DOPT,-DOPT2 ...]
(each argument after the kernel is one comma-separated option set; none: the plain build).
The kernels are built as the launchers build them: arch sm_90 with -arch=sm_90a.
"""

from __future__ import annotations

import sys

from minfer.cuda.runtime.build import compile_cubin, parse_ptxas


def main(args: list[str]) -> int:
    name, sets = args[0], [tuple(o for o in a.split(",") if o) for a in args[1:]] or [()]
    for opts in sets:
        _, rep = compile_cubin(name, "sm_90", ("-arch=sm_90a", *opts), report=True)
        for r in parse_ptxas(rep).values():
            print(
                f"{name} {','.join(opts) or '(plain)'}: {r.name} {r.registers} regs, "
                f"spills {r.spill_stores}/{r.spill_loads}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
