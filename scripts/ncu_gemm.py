"""The f16 GEMM picks at the engine's 8B shapes, for ncu: one warm-up launch, then gate|up
(f32 out), attn_output and ffn_down (accumulating) once each at M rows (default 2048).

ncu --clock-control none --kernel-name regex:wgmma_f16 --launch-skip 1 --launch-count 3 \
    --csv --metrics ... python3 scripts/ncu_gemm.py [M] > ncu.log
python3 scripts/ncu_gemm.py --table ncu.log     (off the device too: one block per launch)
"""

import csv
import sys


def table(path: str) -> None:
    """ncu --csv output -> per launch (ID, kernel): its metrics, one per line."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        print("no ncu rows in", path)
        return
    h = rows[0]
    iid, ik, im, iv = (h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value"))
    out: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows[1:]:
        if len(r) > iv:
            out.setdefault((r[iid], r[ik].split("(")[0]), {})[r[im]] = r[iv]
    for (i, k), m in out.items():
        print(f"launch {i}: {k}")
        for name in sorted(m):
            print(f"    {name} {m[name]}")


def main(M: int) -> None:
    import numpy as np

    from minfer.cuda import devarray as da
    from minfer.cuda.gemm import gemm_f16_nt
    from minfer.cuda.runtime import get_runtime

    rt = get_runtime()
    rng = np.random.default_rng(0)

    def dev(shape, scale=1.0):
        return da.to_device(rt, (rng.standard_normal(shape) * scale).astype(np.float16))

    A, A2 = dev((M, 4096)), dev((M, 14336))
    Wgu, Wo, Wd = dev((28672, 4096), 0.05), dev((4096, 4096), 0.05), dev((4096, 14336), 0.05)
    C = da.empty(rt, (M, 28672), np.float32)
    X = da.to_device(rt, np.zeros((M, 4096), np.float32))
    gemm_f16_nt(A, Wgu, np.float32, out=C, rt=rt)   # warm-up (skipped)
    gemm_f16_nt(A, Wgu, np.float32, out=C, rt=rt)
    gemm_f16_nt(A, Wo, np.float32, accumulate=X, rt=rt)
    gemm_f16_nt(A2, Wd, np.float32, accumulate=X, rt=rt)
    rt.synchronize()
    print("done", M)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
