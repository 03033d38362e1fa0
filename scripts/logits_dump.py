"""Every GEMM path's logits on one model, for a bitwise before / after comparison of two trees.

    python3 scripts/logits_dump.py MODEL OUT.npz [--paths f16,blk,...] [--tokens 300]
    python3 scripts/logits_dump.py --compare A.npz B.npz

Per path (a `--gemm` name; those the GPU cannot run are skipped and said): a fixed prompt of
`--tokens` pseudo-random ids in chunks of 128 (prefill, chunked: the graphs of two shapes),
then 4 greedy decode steps; the prompt's last logits and each step's are kept. It imports only
what every tree since the path table has (CudaBackend, GemmChoice), so run it with
PYTHONPATH pointing at an older tree to dump that tree's numbers.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def dump(model_path: str, out: str, paths: list[str], n: int) -> None:
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.gguf.loader import load_model

    m = load_model(model_path)
    ids = np.random.default_rng(0).integers(0, m.config.vocab_size, n).astype(np.int32)
    res = {}
    for p in paths:
        try:
            be = CudaBackend(m, GemmChoice(p), max_tokens=n + 8, ubatch=128)
        except Exception as e:  # a path this GPU does not run
            print(f"{p}: skipped ({e})")
            continue
        rows = []
        for s in range(0, n, 128):
            logits = be.forward(ids[s : s + 128], s)
        rows.append(logits)
        for k in range(4):
            tok = np.array([int(np.argmax(rows[-1]))], np.int32)
            rows.append(be.forward(tok, n + k))
        res[p] = np.stack(rows)
        print(f"{p}: {be.route_summary()}")
        del be
    np.savez(out, **res)


def compare(a: str, b: str) -> int:
    A, B = np.load(a), np.load(b)
    bad = 0
    for p in sorted(set(A) | set(B)):
        if p not in A or p not in B:
            print(f"| {p} | only in {'A' if p in A else 'B'} |")
            bad += 1
            continue
        same = np.array_equal(A[p].view(np.uint32), B[p].view(np.uint32))
        d = float(np.abs(A[p].astype(np.float64) - B[p]).max())
        print(f"| {p} | {'bitwise identical' if same else f'DIFFERENT (max |d| {d:.3g})'} |")
        bad += not same
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--paths", default="f16,blk,wide-kd4,wide-kd8,narrow,r1")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--compare", action="store_true")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.files))
    dump(a.files[0], a.files[1], a.paths.split(","), a.tokens)


if __name__ == "__main__":
    main()
