"""`minfer check -m FILE`: the parity gate and greedy-32 identity across all GEMM paths.

1. Parity (docs/design.md gate 1): every MMQ path (R1, narrow, wide KD=4 and KD=8) against the numpy
   twin minfer.quants.mmq_ref on each distinct (type, N, K) of the model's q4_K / q6_K GEMM
   weights (real weights, random activations): M = 128, ragged M = 37 with N - 5 rows
   (accumulate mode), and M = 1. The GPU computes the full [M, N]; the float64 twin (slow in
   numpy at 8B shapes) is evaluated on a sample of weight rows that always includes the first
   and last tiles' edges. Gate: rel err (Frobenius) <= 1e-3.
2. greedy-32 identity (gate 3, tie-aware, minfer.gates.compare_greedy): the f16 path, every
   MMQ config and the CPU reference (ReferenceBackend, f32) decode 32 greedy tokens from the
   prompt. Each GPU path is compared to the CPU reference with tau = 2 * max|logit diff| at the
   last prompt position between the two engines (stated per row); exact n/32 counts reported.
   The MMQ paths are compared with a reference whose MMQ-routed weights see their input through
   the q8_1 grid (ReferenceBackend q8_1_inputs): the rounding MMQ does on purpose is then in
   both engines. Measured on SmolLM2 (11-layer slice, Q4_K_M requant: 11 MMQ weights): every MMQ
   path 32/32 exact, max|dlogit| 0.10 (tau 0.20), where against plain f32 it was 18/32 with a
   near-tie stop at step 1 (max|dlogit| 0.21, tau 0.41).
Runs in poison mode (RuntimeConfig.poison; CUDA graphs stay on, so the gate sees the path
prefill runs): every kernel output is NaN-filled before its launch, so a kernel that did not
run reads as NaN, never as stale numbers. A path whose backend raises (non-finite logits, a
kernel failure) is a FAIL row naming the error; the other paths still run.
Prints tables; exits 1 when anything fails or could not be run.
"""

from __future__ import annotations

import gc
import sys

import click
import numpy as np

from minfer.threads import threads_option

# path label -> GemmConfig fields ("f16" is GemmConfig(): MMQ off)
# (mmq-wgmma-kd4: q4_K and q6_K on the Hopper wgmma kernels where the GPU is sm_90; on other
#  GPUs it runs what mmq-wide-kd4 runs, and the parity rows name the kernel that ran;
#  -sb: q4_K / q6_K on the super-block kernels, per-256 activation scales, their own oracle)
PATHS = {"mmq-r1": dict(mmq=True, raw=False), "mmq-narrow": dict(mmq=True, wide=False),
         "mmq-wide-kd4": dict(mmq=True, kd=4, wgmma=False),
         "mmq-wide-kd8": dict(mmq=True, kd=8, wgmma=False),
         "mmq-wgmma-kd4": dict(mmq=True, kd=4, wgmma=True),
         "mmq-wgmma-kd4-sb": dict(mmq=True, kd=4, wgmma=True, sb=True)}
ALL_PATHS = {"f16": {}, **PATHS}
QNAME = {12: "q4_K", 14: "q6_K"}
PARITY_TOL = 1e-3


def gemm_weight_shapes(model) -> dict[tuple[int, int, int], str]:
    """(qtype, N, K) -> first weight name, for the model's MMQ-able GEMM weights."""
    from minfer.cuda.mmq import has_mmq

    c = model.config
    names = [f"blk.{i}.{n}.weight" for i in range(c.n_layers)
             for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                       "ffn_down")]
    names.append(model.output_name)
    shapes: dict[tuple[int, int, int], str] = {}
    for name in names:
        t = model.tensor(name)
        N, K = (int(s) for s in t.shape)
        if has_mmq(t.qtype) and K % 256 == 0:
            shapes.setdefault((int(t.qtype), N, K), name)
    return shapes


def sample_rows(rng, n: int, k: int = 256) -> np.ndarray:
    """Sorted weight-row indices: k random ones plus the first and last 8 (tile edges)."""
    edge = np.r_[np.arange(min(8, n)), np.arange(max(0, n - 8), n)]
    pick = rng.choice(n, size=min(k, n), replace=False)
    return np.unique(np.r_[edge, pick])


def parity_rows(rt, model, seed: int = 0, n_sample: int = 256):
    """[(what, path, shape, rel_err, ok)] for each MMQ path on the model's MMQ weight shapes."""
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import mmq_linear, pick_variant
    from minfer.quants.mmq_ref import mmq_linear_ref
    from minfer.quants.mmq_sb_ref import mmq_sb_linear_ref

    rng = np.random.default_rng(seed)
    rows = []
    for (qt, N, K), name in gemm_weight_shapes(model).items():
        raw = np.ascontiguousarray(model.tensor(name).data).view(np.uint8).reshape(N, -1)
        for M, n, acc in ((128, N, False), (37, max(1, N - 5), True), (1, N, False)):
            cols = sample_rows(rng, n, n_sample)
            x = rng.standard_normal((M, K)).astype(np.float32)
            wsel = np.ascontiguousarray(raw[cols])
            refs = {"q8_1": mmq_linear_ref(x, wsel, qt, M, len(cols), K)}
            base = (rng.standard_normal((M, n)).astype(np.float32)
                    * float(np.abs(refs["q8_1"]).mean())
                    if acc else np.full((M, n), np.nan, np.float32))
            xd = da.to_device(rt, x, "parity x")
            wd = da.to_device(rt, np.ascontiguousarray(raw[:n]).reshape(-1), "parity w")
            for path, kw in PATHS.items():
                out = da.to_device(rt, base, "parity out")
                cfg = GemmConfig(**kw)
                mmq_linear(rt, xd, wd, qt, M, n, K, cfg, out, accumulate=acc)
                v = pick_variant(cfg, rt.smem_optin, qt, rt.arch)   # what ran, for f32 x
                if v.kind == "sb":   # its activations are quantized per 256: its own oracle
                    if "q8s" not in refs:
                        refs["q8s"] = mmq_sb_linear_ref(x, wsel, M, len(cols), K, qt)
                    ref = refs["q8s"]
                else:
                    ref = refs["q8_1"]
                y = out.get()[:, cols].astype(np.float64)
                if acc:
                    y -= base[:, cols]
                err = (float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
                       if np.isfinite(y).all() else float("inf"))
                shape = f"{M}x{n}x{K}" + (" +=" if acc else "")
                ran = f"{path} [{v.label}]" if "wgmma" in path else path   # the kernel that ran
                rows.append((f"{QNAME[qt]} {name}", ran, shape, err, err <= PARITY_TOL))
            del xd, wd
    return rows


def identity_verdict(ref, res):
    """(GreedyVerdict, max|logit diff|) of engine result `res` vs the CPU reference `ref`."""
    from minfer import gates

    diff = gates.logit_error(res.last_logits, ref.last_logits)
    v = gates.compare_greedy(res.greedy_ids, ref.greedy_ids, ref.step_margins, 2.0 * diff)
    return v, diff


def prompt_ids(model, prompt: str, echo=click.echo) -> list[int]:
    """The prompt's token ids; a model whose tokenizer minfer cannot build gets 16 fixed
    pseudo-random ids instead (said on one line): identity needs ids, not text."""
    from minfer.errors import BadInput, MinferError
    from minfer.tokenizer import Tokenizer

    try:
        ids = Tokenizer.from_metadata(model.metadata).encode(prompt)
    except MinferError as e:
        ids = [int(i) for i in np.random.default_rng(0).integers(0, model.config.vocab_size, 16)]
        echo(f"(tokenizer unavailable: {e}; using 16 fixed pseudo-random token ids)")
    if not ids:
        raise BadInput(f"prompt {prompt!r} encodes to no tokens")
    return ids


def identity_rows(model, prompt: str, n_greedy: int = 32, echo=click.echo):
    """[(path, exact, n, max_diff, tau, detail, ok)] greedy identity of every GPU path vs the
    CPU reference (tie-aware)."""
    from minfer import engine
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.config import GemmConfig
    from minfer.errors import GPUError
    from minfer.reference.forward import ReferenceBackend

    ids = prompt_ids(model, prompt, echo)
    refs = {((), ()): engine.run(ReferenceBackend(model), ids, n_greedy, 512)}
    gc.collect()
    rows = []
    max_tokens = max(64, len(ids) + n_greedy)
    for path, kw in ALL_PATHS.items():
        be = None
        try:
            be = CudaBackend(model, GemmConfig(**kw), max_tokens=max_tokens, ubatch=512)
            echo(f"{path:<13} {be.route_summary()}")
            res = engine.run(be, ids, n_greedy, 512)
        except GPUError as e:  # e.g. non-finite logits: this path fails, the others still run
            echo(f"{path:<13} error: {e}")
            rows.append((path, 0, n_greedy, float("inf"), float("nan"), f"error: {e}", False))
        else:
            # the reference rounds the inputs of exactly the weights this path runs on MMQ,
            # through the grid of the kernel that runs them (q8_1; q8s for SB)
            q8 = tuple(sorted(n for n, (p, _) in be.routes.items()
                              if p.startswith("mmq") and p != "mmq-sb"))
            q8s = tuple(sorted(n for n, (p, _) in be.routes.items() if p == "mmq-sb"))
            if (q8, q8s) not in refs:
                refs[(q8, q8s)] = engine.run(ReferenceBackend(
                    model, q8_1_inputs=frozenset(q8), q8s_inputs=frozenset(q8s)), ids, n_greedy, 512)
            v, diff = identity_verdict(refs[(q8, q8s)], res)
            ref_name = ("cpu" if not q8 + q8s else
                        f"cpu+q8_1 ({len(q8)} inputs)" + (f"+q8s ({len(q8s)})" if q8s else ""))
            rows.append((path, v.exact, v.n, diff, v.tau, f"vs {ref_name}: {v.describe()}", v.ok))
        del be
        gc.collect()  # free this backend's device memory before the next one
    return rows


@click.command("check")
@click.option("-m", "--model", "model_path", type=click.Path(dir_okay=False),
              help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, as for prefill).")
@click.option("-p", "--prompt", default="The capital of France is", show_default=True)
@click.option("--parity-only", is_flag=True, help="Skip the greedy-32 identity runs.")
@click.option("--identity-only", is_flag=True, help="Skip the parity gate.")
@threads_option
def check(model_path: str | None, prompt: str, parity_only: bool, identity_only: bool) -> int:
    """GPU gate: parity (every MMQ path vs the numpy twin) and greedy-32 identity across paths.
    Needs a CUDA GPU (it checks our kernels against the CPU reference)."""
    from minfer.cuda.runtime import RuntimeConfig, get_runtime
    from minfer.errors import GPUError
    from minfer.loader import load_model

    try:  # before the default model is fetched
        rt = get_runtime(RuntimeConfig(poison=True))
    except GPUError as e:
        # the runtime's own advice (--backend cpu) is for prefill: check has no CPU mode
        reason = str(e).split("; use --backend cpu")[0]
        raise GPUError(f"minfer check tests the GPU kernels against the CPU reference and needs "
                       f"a CUDA GPU: {reason} (the CPU reference alone: minfer prefill "
                       f"--backend cpu)") from None
    if model_path is None:
        from minfer.fetch import default_model_path

        model_path = default_model_path()
    model = load_model(model_path)
    click.echo(model.describe())
    was = rt.cfg.poison
    rt.cfg.poison = True  # the runtime may predate this command (in-process callers, tests)
    try:
        prow = [] if identity_only else parity_rows(rt, model)
        irow = [] if parity_only else identity_rows(model, prompt)
    finally:
        rt.cfg.poison = was
    if not identity_only:
        click.echo(f"\nparity vs numpy twin (gate rel err <= {PARITY_TOL:g}, KD=4 and KD=8):")
        click.echo("| weight | path | MxNxK | rel err | |\n| --- | --- | ---: | ---: | --- |")
        for what, path, shape, err, ok in prow:
            click.echo(f"| {what} | {path} | {shape} | {err:.2e} | {'ok' if ok else 'FAIL'} |")
        if not prow:
            click.echo("(no q4_K / q6_K GEMM weight with K % 256 == 0 in this model: "
                       "nothing to gate; every path runs f16 here)")
    if not parity_only:
        click.echo("\ngreedy-32 identity vs the CPU reference (tie-aware; tau = 2 * max|logit "
                   "diff| at the last prompt position; MMQ paths vs the reference with the same "
                   "input rounding: q8_1, or q8s per 256 on SB):")
        click.echo("| path | exact | max abs dlogit | tau | verdict | |\n"
                   "| --- | ---: | ---: | ---: | --- | --- |")
        for path, exact, n, diff, tau, detail, ok in irow:
            click.echo(f"| {path} | {exact}/{n} | {diff:.4f} | {tau:.4f} | {detail} | "
                       f"{'ok' if ok else 'FAIL'} |")
    fails = sum(not r[-1] for r in prow) + sum(not r[-1] for r in irow)
    click.echo(f"\ncheck: {'PASS' if not fails else f'{fails} FAILED'} ({len(prow)} parity rows, "
               f"{len(irow)} identity rows)")
    if fails:
        sys.exit(1)
    return 0
