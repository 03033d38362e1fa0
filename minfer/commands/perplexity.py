"""`minfer perplexity`: perplexity of a model over a text, and KL divergence against the logits
of another run (design gate 6; docs/perplexity.md). The windows, the math and minfer's logits
file are minfer.tools.perplexity.windows's, llama.cpp's log-prob file minfer.tools.perplexity.llamacpp',
the printing minfer.tools.perplexity.report's, the run (the backend's window_logits per window)
minfer.tools.perplexity.run's; this module reads and checks the options.

Options are checked before the default model is fetched; a --kld-base file's header before the
model loads (its ctx and chunks are the defaults of a --kld-base run) and against the text's
token ids once they are known, so a base from another text, ctx or vocabulary is refused with
one `error:` line (exit 2) before any forward runs. A llama.cpp base carries its token ids:
they are the windows, and no text is read (as llama-perplexity --kl-divergence).
llama-perplexity's spelling: --kl-divergence-base F writes llama.cpp's file F; with
--kl-divergence it reads F as the base.
--emulate GRID runs the CPU backend on an int8 path's number grids (minfer.tools.perplexity.emulate).
"""

from __future__ import annotations

import click

from minfer.commands.gemm_flags import check_gemm_backend, gemm_choice, gemm_options
from minfer.cuda.paths import EMULATIONS
from minfer.errors import BadInput
from minfer.host.threads import threads_option
from minfer.tools.perplexity.run import DEFAULT_CHUNKS, DEFAULT_CTX


def check_options(
    ctx: int | None,
    chunks: int | None,
    save: str | None,
    base: str | None,
    emulate: str | None = None,
    backend: str | None = None,
):
    if ctx is not None and ctx < 4:
        raise BadInput(f"--ctx must be >= 4 (half of each window is scored), got {ctx}")
    if chunks is not None and chunks < -1:
        raise BadInput(
            f"--chunks must be >= -1 (-1 or 0: every window of the text, -1 as "
            f"llama-perplexity), got {chunks}"
        )
    if save is not None and base is not None:
        raise BadInput("give either --save-logits or --kld-base, not both")
    if emulate is not None and backend is not None and backend.lower() != "cpu":
        raise BadInput(
            f"--emulate {emulate} runs on the CPU backend (--backend cpu), not {backend}"
        )


@click.command("perplexity")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, as for prefill).",
)
@click.option(
    "-f",
    "--file",
    "text_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="UTF-8 text to score (default: the shipped minfer/data/gnu-gpl.txt, ~11,700 tokens).",
)
@click.option(
    "-c",
    "--ctx",
    "--ctx-size",
    "ctx",
    type=int,
    default=None,
    help=f"Window length in tokens (default {DEFAULT_CTX}, or the --kld-base file's); "
    "positions ctx/2 .. ctx-2 of each window are scored.",
)
@click.option(
    "--chunks",
    type=int,
    default=None,
    help=f"Windows to run (default {DEFAULT_CHUNKS}, or the --kld-base file's; "
    "-1 (llama-perplexity's) or 0: every window of the text).",
)
@click.option(
    "--save-logits",
    "save_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the scored rows' f32 logits to FILE (the base of a --kld-base run).",
)
@click.option(
    "--kld-base",
    "base_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Compare with a base run's file: minfer's --save-logits or llama.cpp's "
    "--kl-divergence-base (told by its magic): KL divergence, same top-1, "
    "max |dlogit|.",
)
@click.option(
    "--kl-divergence-base",
    "--save-all-logits",
    "lc_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="As llama-perplexity: write llama.cpp's log-prob file (which llama.cpp's "
    "--kl-divergence reads); with --kl-divergence, read FILE as the base.",
)
@click.option(
    "--kl-divergence",
    "kl_divergence",
    is_flag=True,
    help="As llama-perplexity: compare with the --kl-divergence-base FILE.",
)
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(["cpu", "cuda"], case_sensitive=False),
    default=None,
    help="cuda or cpu (the numpy reference); default: cuda if a GPU is usable.",
)
@click.option(
    "--emulate",
    type=click.Choice(list(EMULATIONS)),
    default=None,
    help="CPU: round the GEMM inputs as that GPU path does ("
    + "; ".join(f"{k}: {e.help}" for k, (_, e) in EMULATIONS.items())
    + "), to measure its distribution gate without a GPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@threads_option
@gemm_options
def perplexity(
    model_path,
    text_path,
    ctx,
    chunks,
    save_path,
    base_path,
    lc_path,
    kl_divergence,
    backend_kind,
    emulate,
    as_json,
    gemm,
) -> None:
    """Perplexity over a text in non-overlapping windows (as llama-perplexity), and the KL
    divergence against a saved run's logits (as its --kl-divergence)."""
    from minfer.commands.prefill import check_backend, pick_backend_kind
    from minfer.host.fileio import check_output_path
    from minfer.tools.perplexity.run import run
    from minfer.tools.prefill.one import UBATCH

    base_path, lc_save = llamacpp_names(lc_path, kl_divergence, base_path)
    if save_path is not None and lc_save is not None:
        raise BadInput(
            "give either --save-logits (minfer's f32 logits) or --kl-divergence-base "
            "(llama.cpp's log-probs), not both"
        )
    check_options(ctx, chunks, save_path or lc_save, base_path, emulate, backend_kind)
    kind, why = pick_backend_kind(backend_kind or ("cpu" if emulate else None))
    check_backend(kind, None)
    if emulate is None:  # --emulate GRID is the CPU's stand-in for a GPU path
        check_gemm_backend(kind, gemm, why=why)
    choice = gemm_choice(gemm)  # --gemm / the environment, resolved once
    for out_path in (save_path, lc_save):
        if out_path is not None:
            check_output_path(out_path)
    run(
        model_path,
        text_path,
        ctx,
        chunks,
        save_path,
        lc_save,
        base_path,
        kind,
        why,
        choice,
        emulate,
        as_json,
        UBATCH["cuda"],
    )


def llamacpp_names(lc_path: str | None, kl_divergence: bool, base_path: str | None):
    """(the base to read, the llama.cpp file to write) of llama-perplexity's spelling:
    --kl-divergence-base F alone writes F; with --kl-divergence it reads F (as --kld-base F)."""
    if not kl_divergence:
        return base_path, lc_path
    if lc_path is None and base_path is None:
        raise BadInput(
            "--kl-divergence compares with a base run: give --kl-divergence-base "
            "FILE (or --kld-base FILE)"
        )
    if lc_path is not None and base_path is not None and lc_path != base_path:
        raise BadInput("two bases: --kl-divergence-base and --kld-base name different files")
    return base_path or lc_path, None
