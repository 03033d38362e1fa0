"""`minfer check -m FILE [--gemm NAME]`: the GPU gates (minfer.tools.check: parity of every
GEMM path against its numpy twin in every form the forward runs it, greedy-32 identity against
the CPU reference, packed batches against each prompt alone) as tables; exits 1 when anything
fails or could not be run."""

from __future__ import annotations

import sys

import click

from minfer.commands.gemm_flags import gemm_options
from minfer.host.threads import threads_option
from minfer.tools.check import (
    PARITY_TOL,
    batch_rows,
    identity_rows,
    moe_experts_of,
    moe_rows,
    parity_rows,
    table_paths,
)


@click.command("check")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, as for prefill).",
)
@click.option("-p", "--prompt", default="The capital of France is", show_default=True)
@click.option("--parity-only", is_flag=True, help="Skip the greedy-32 identity runs.")
@click.option("--identity-only", is_flag=True, help="Skip the parity gate.")
@click.option("--no-batch", is_flag=True, help="Skip the packed-batch rows.")
@threads_option
@gemm_options
def check(
    model_path: str | None,
    prompt: str,
    parity_only: bool,
    identity_only: bool,
    no_batch: bool,
    gemm,
) -> int:
    """GPU gate: parity (every GEMM path vs its numpy twin) and greedy-32 identity across paths
    (--gemm: one path; default every path of the table). Needs a CUDA GPU (it checks our
    kernels against the CPU reference)."""
    from minfer.cuda.runtime.runtime import RuntimeConfig, get_runtime
    from minfer.errors import GPUError
    from minfer.gguf.loader import load_model

    try:  # before the default model is fetched
        rt = get_runtime(RuntimeConfig(poison=True))
    except GPUError as e:
        # the runtime's own advice (--backend cpu) is for prefill: check has no CPU mode
        reason = str(e).split("; use --backend cpu")[0]
        raise GPUError(
            f"minfer check tests the GPU kernels against the CPU reference and needs "
            f"a CUDA GPU: {reason} (the CPU reference alone: minfer prefill "
            f"--backend cpu)"
        ) from None
    if model_path is None:
        from minfer.gguf.fetch import default_model_path

        model_path = default_model_path()
    model = load_model(model_path)
    click.echo(model.describe())
    was = rt.cfg.poison
    rt.cfg.poison = True  # the runtime may predate this command (in-process callers, tests)
    try:
        paths = table_paths(gemm)
        prow = [] if identity_only else parity_rows(rt, model, paths=paths)
        if not identity_only and getattr(model.config, "n_expert", 0):
            # the experts' grouped GEMMs of each checked path that brings its own (f16, blk)
            prow += moe_rows(rt, model, experts=moe_experts_of(rt, paths))
        irow = [] if parity_only else identity_rows(model, prompt, paths=paths)
        brow = [] if parity_only or no_batch else batch_rows(model, paths=paths)
    finally:
        rt.cfg.poison = was
    if not identity_only:
        click.echo(f"\nparity vs numpy twin (gate rel err <= {PARITY_TOL:g}):")
        click.echo("| weight | path | MxNxK | rel err | |\n| --- | --- | ---: | ---: | --- |")
        for what, path, shape, err, ok in prow:
            click.echo(f"| {what} | {path} | {shape} | {err:.2e} | {'ok' if ok else 'FAIL'} |")
        if not prow:
            click.echo("(no GEMM weight any path of the table takes: nothing to gate)")
    if not parity_only:
        click.echo(
            "\ngreedy-32 identity vs the CPU reference (tie-aware; tau = 2 * max|logit "
            "diff| at the last prompt position; MMQ paths vs the reference with the same "
            "input rounding: q8_1, or blk's rotated int8 on blk):"
        )
        click.echo(
            "| path | exact | max abs dlogit | tau | verdict | |\n"
            "| --- | ---: | ---: | ---: | --- | --- |"
        )
        for path, exact, n, diff, tau, detail, ok in irow:
            click.echo(
                f"| {path} | {exact}/{n} | {diff:.4f} | {tau:.4f} | {detail} | "
                f"{'ok' if ok else 'FAIL'} |"
            )
    if brow:
        click.echo(
            "\npacked batch vs each prompt alone, same path (11 prompts: lengths 1 .. 65 "
            "in chunks of 64, a duplicate, 3 sharing a prefix; tie-aware greedy-32 per "
            "prompt, tau = 2 * the largest difference measured: every prompt row's "
            "log-prob, a decode step's logits alone vs batched):"
        )
        click.echo(
            "| path | prompts exact | max abs difference | tau | verdict | |\n"
            "| --- | ---: | ---: | ---: | --- | --- |"
        )
        for path, exact, n, diff, tau, detail, ok in brow:
            click.echo(
                f"| {path} | {exact}/{n} | {diff:.2e} | {tau:.4f} | {detail} | "
                f"{'ok' if ok else 'FAIL'} |"
            )
    fails = (
        sum(not r[-1] for r in prow) + sum(not r[-1] for r in irow) + sum(not r[-1] for r in brow)
    )
    click.echo(
        f"\ncheck: {'PASS' if not fails else f'{fails} FAILED'} ({len(prow)} parity rows, "
        f"{len(irow)} identity rows, {len(brow)} batch rows)"
    )
    if fails:
        sys.exit(1)
    return 0
