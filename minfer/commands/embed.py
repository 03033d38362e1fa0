"""`minfer embed --prompts FILE`: one embedding per prompt of a file (issue 52).

The prompt file is read and checked first (as `minfer prefill --prompts` reads it:
minfer.batch.prompts), then Engine.embed runs every prompt as a pooled job (no LM head):
JSONL out ({"id", "embedding"} a line, input order) on stdout or -o FILE, or with -o X.npy
one float32 [n, dims] array. --timing: tok/s of the embedding pass on stderr. The run is
minfer.tools.embed's; here: the flags.
"""

from __future__ import annotations

import click

from minfer.commands.gemm_flags import gemm_options
from minfer.errors import BadInput
from minfer.host.threads import threads_option


@click.command("embed")
@click.option(
    "-m",
    "--model",
    "model_path",
    type=click.Path(dir_okay=False),
    help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once).",
)
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(),
    required=True,
    help='Prompts, one a line (- reads stdin): a JSON string, {"prompt": ...}, '
    '{"messages": [...]} or token ids (--prompts-format lines: plain text).',
)
@click.option(
    "--prompts-format", type=click.Choice(["jsonl", "lines"]), default="jsonl", show_default=True
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(),
    default=None,
    help="JSONL to FILE (atomically) instead of stdout; a name ending in .npy: one "
    "float32 [n, dims] array.",
)
@click.option(
    "--pooling",
    type=click.Choice(["last", "mean", "cls"]),
    default=None,
    help="Default: the GGUF's pooling_type, else last.",
)
@click.option(
    "--dimensions",
    type=int,
    default=None,
    help="Keep the first N values (Matryoshka), before the normalisation.",
)
@click.option(
    "--normalize/--no-normalize",
    default=True,
    show_default=True,
    help="L2-normalise each embedding.",
)
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(["cpu", "cuda"], case_sensitive=False),
    default=None,
    help="cuda or cpu (the numpy reference); default: cuda if a GPU is usable.",
)
@click.option(
    "-ub",
    "--ubatch",
    "ubatch",
    type=int,
    default=None,
    help="Tokens per forward (default 2048 on cuda, 256 on cpu).",
)
@click.option("--timing", is_flag=True, help="Say the embedding pass's tok/s on stderr.")
@threads_option
@gemm_options
def embed(
    model_path,
    prompts_path,
    prompts_format,
    output,
    pooling,
    dimensions,
    normalize,
    backend_kind,
    ubatch,
    timing,
    gemm,
) -> None:
    """Embed every prompt of a file: the final hidden state pooled, no LM head."""
    from minfer.commands.gemm_flags import gemm_choice
    from minfer.tools.embed import run

    if ubatch is not None and ubatch < 1:
        raise BadInput(f"-ub/--ubatch must be >= 1, got {ubatch}")
    run(
        model_path,
        prompts_path,
        prompts_format,
        output,
        pooling,
        dimensions,
        normalize,
        backend_kind.lower() if backend_kind else None,
        ubatch,
        timing,
        lambda kind: gemm_choice(gemm) if kind != "cpu" else "auto",
    )
