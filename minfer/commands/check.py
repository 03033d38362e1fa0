"""`minfer check -m FILE`: the parity gate and greedy-32 identity across all GEMM paths.

1. Parity: every MMQ path (R1, narrow, wide KD=4/8; q4_K and q6_K kernels) against the numpy
   twin minfer.quants.mmq_ref on the model's own q4_K/q6_K weight shapes (real weights, random
   activations) and on ragged cuts of them (M and N not multiples of any tile): rel err <= 1e-3.
2. greedy-32 identity (tie-aware, minfer.gates): the f16 path, every MMQ config and the CPU
   reference produce the same 32 greedy tokens for the prompt.
Prints a table; exits 1 when anything fails or could not be run.
"""

from __future__ import annotations

import sys

import click
import numpy as np

PATHS = {"mmq-r1": dict(mmq=True, raw=False), "mmq-narrow": dict(mmq=True, wide=False),
         "mmq-wide-kd4": dict(mmq=True, kd=4), "mmq-wide-kd8": dict(mmq=True, kd=8)}
QNAME = {12: "q4_K", 14: "q6_K"}


def parity_rows(rt, model, seed: int = 0, max_shapes: int = 8):
    """[(what, path, shape, rel_err, ok)] for each MMQ path on the model's MMQ weight shapes."""
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import has_mmq, mmq_linear
    from minfer.quants.mmq_ref import mmq_linear_ref

    rng = np.random.default_rng(seed)
    shapes: dict[tuple, str] = {}
    for name, t in model.tensors.items():
        if len(t.shape) == 2 and has_mmq(t.qtype) and t.shape[1] % 256 == 0:
            shapes.setdefault((t.qtype, *t.shape), name)
    rows = []
    for (qt, N, K), name in list(shapes.items())[:max_shapes]:
        raw = np.ascontiguousarray(model.tensors[name].data).view(np.uint8).reshape(N, -1)
        for M, n in ((64, N), (37, max(1, N - 5))):     # tile-aligned M, then ragged M and N
            w = np.ascontiguousarray(raw[:n])
            x = rng.standard_normal((M, K)).astype(np.float32)
            ref = mmq_linear_ref(x, w, qt, M, n, K)
            xd, wd = da.to_device(rt, x), da.to_device(rt, w.reshape(-1))
            for path, kw in PATHS.items():
                out = da.to_device(rt, np.full((M, n), np.nan, np.float32))
                mmq_linear(rt, xd, wd, qt, M, n, K, GemmConfig(**kw), out)
                y = out.get().astype(np.float64)
                err = (float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
                       if np.isfinite(y).all() else float("inf"))
                rows.append((f"{QNAME[qt]} {name}", path, f"{M}x{n}x{K}", err, err <= 1e-3))
    return rows


def identity_rows(model_path: str, prompt: str):
    """[(what, path, detail, ok)] greedy-32 identity vs the CPU reference (tie-aware)."""
    try:
        from minfer import engine, gates
        from minfer.cuda.backend import CudaBackend
        from minfer.cuda.config import GemmConfig
        from minfer.loader import load_model
        from minfer.reference.forward import ReferenceBackend
        from minfer.tokenizer import Tokenizer
    except ImportError as e:
        return [("greedy-32", "all", f"NOT RUN: {e}", False)]
    if not hasattr(gates, "greedy_identity"):
        return [("greedy-32", "all", "NOT RUN: minfer.gates.greedy_identity missing", False)]
    model = load_model(model_path)
    ids = Tokenizer.from_metadata(model.metadata).encode(prompt)
    ref = engine.run(ReferenceBackend(model), ids, 32, 512)
    rows = []
    for path, kw in {"f16": {}, **PATHS}.items():
        be = CudaBackend(model, GemmConfig(**kw))
        res = engine.run(be, ids, 32, 512)
        verdict = gates.greedy_identity(ref, res)   # engineer "reference": tie-aware gate
        rows.append(("greedy-32", path, str(verdict), bool(verdict)))
    return rows


@click.command("check")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(dir_okay=False),
              help="GGUF model file.")
@click.option("-p", "--prompt", default="The capital of France is", show_default=True)
@click.option("--parity-only", is_flag=True, help="Skip the greedy-32 identity runs.")
def check(model_path: str, prompt: str, parity_only: bool) -> int:
    """Parity gate (every MMQ path vs the numpy twin) and greedy-32 identity across paths."""
    from minfer.cuda.runtime import get_runtime
    from minfer.loader import load_model

    rt = get_runtime()
    model = load_model(model_path)
    prow = parity_rows(rt, model)
    click.echo(f"{'parity (gate rel err <= 1e-3)':<44} {'path':<13} {'MxNxK':>16} {'rel err':>9}")
    for what, path, shape, err, ok in prow:
        click.echo(f"{what[:44]:<44} {path:<13} {shape:>16} {err:9.2e} {'ok' if ok else 'FAIL'}")
    if not prow:
        click.echo("(no q4_K / q6_K weight with K % 256 == 0 in this model: nothing to gate)")
    irow = [] if parity_only else identity_rows(model_path, prompt)
    for what, path, detail, ok in irow:
        click.echo(f"{what:<12} {path:<13} {'ok' if ok else 'FAIL'}  {detail}")
    fails = sum(not r[-1] for r in prow) + sum(not r[-1] for r in irow)
    click.echo(f"\ncheck: {'PASS' if not fails else f'{fails} FAILED'}")
    if fails:
        sys.exit(1)
    return 0
