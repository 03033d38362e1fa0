"""`minfer bench [-m FILE ...] --tokens 512,2048 [--ab f16 f16:no-rope all wide-kd8 ...] [-o md|json|csv|jsonl] [--plot F]`

As llama-bench: -m may repeat (each model is run, its rows in one output), the backend is cuda
when a GPU is usable else cpu (as prefill picks it), -o json|csv|jsonl rows carry llama-bench's
field names (minfer.tools.bench.out)."""

from __future__ import annotations

import re

import click

from minfer.commands.gemm_flags import check_gemm_backend, gemm_choice, gemm_options
from minfer.host.threads import threads_option
from minfer.tools.bench.out import FORMATS


@click.command("bench", context_settings={"ignore_unknown_options": False})
@click.option(
    "-m",
    "--model",
    "model_paths",
    type=click.Path(dir_okay=False),
    multiple=True,
    help="GGUF model file; repeat it to run several, as llama-bench (default: "
    "SmolLM2-135M-Instruct Q4_1, as for prefill).",
)
@click.option(
    "-p",
    "--tokens",
    "--n-prompt",
    "tokens",
    default="512",
    show_default=True,
    help="Comma-separated prompt lengths (pp512, pp2048, ...), as llama-bench's -p.",
)
@click.option(
    "--ab",
    "ab",
    multiple=True,
    help="A/B config: a GEMM path with tuning variants (f16, f16:no-rope, blk, "
    'blk:no-glu, wide-kd8; docs/paths.md), "all" (every path of the table) or '
    '"MINFER_GEMM=NAME"; more configs may follow as extra '
    "arguments. Configs run interleaved in one process, their order rotated each "
    "repeat (use --repeats as a multiple of the config count).",
)
@click.option(
    "-r",
    "--repeats",
    "--repetitions",
    "repeats",
    default=3,
    show_default=True,
    type=int,
    help="Samples per config and length, as llama-bench's -r.",
)
@click.option(
    "--backend",
    "kind",
    default=None,
    type=click.Choice(["cuda", "cpu"], case_sensitive=False),
    help="cuda or cpu; default: cuda if a GPU is usable, else cpu (as prefill).",
)
@click.option(
    "--min-ms",
    default=500.0,
    show_default=True,
    type=float,
    help="Each sample: one untimed pre-roll prefill, then back-to-back timed prefills "
    "filling this many ms: sustained throughput (a GPU under this load runs at "
    "its power cap). 0: one prefill per sample after --idle-s of an idle GPU, "
    "what `minfer prefill` prints for the prompt.",
)
@click.option(
    "--idle-s",
    "idle_s",
    type=float,
    default=None,
    help="With --min-ms 0: seconds the GPU idles before each sample (default 2 on "
    "cuda, where a prefill right after another runs at the power cap's clocks; "
    "0 on cpu).",
)
@click.option("--no-breakdown", is_flag=True, help="Skip the per-op CUDA-event breakdown.")
@click.option(
    "-o",
    "--output",
    "fmt",
    default="md",
    show_default=True,
    type=click.Choice(FORMATS, case_sensitive=False),
    help="Results format, as llama-bench: md table, json, jsonl or csv on stdout, "
    "with llama-bench's field names (with json, jsonl and csv every other line "
    "goes to stderr).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also draw tok/s against prompt length per config into this image "
    "(.png, .svg, ...; needs matplotlib: the extra `plot`).",
)
@click.option(
    "--batch",
    "batch",
    type=int,
    default=None,
    help="Time N prompts of --tokens L as one packed run (aggregate prefill tok/s), "
    "interleaved with one L-token prompt alone.",
)
@click.option(
    "--shared-prefix",
    type=int,
    default=0,
    show_default=True,
    help="With --batch: the prompts share a first P tokens; timed with and without prefix sharing.",
)
@click.option(
    "--log-uniform",
    "log_uniform",
    default=None,
    metavar="A:B",
    help="With --batch: prompt lengths log-uniform in A..B (seeded) instead of "
    "--tokens; the single-prompt figure is at B.",
)
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(),
    default=None,
    help="Time the prompts of a file (as prefill --prompts reads it) as the batch.",
)
@click.option(
    "-n",
    "--n-predict",
    "--n-gen",
    "n_predict",
    default="0",
    show_default=True,
    help="With --batch / --prompts: greedy ids per prompt (batched decode, timed "
    "apart). Without them ignored, as llama-bench's tg rows (prefill only).",
)
@click.option(
    "-ub",
    "--ubatch",
    "ubatch",
    type=int,
    default=None,
    help="With --batch / --prompts: packed tokens per forward (default 2048).",
)
@threads_option
@gemm_options
@click.argument("more_ab", nargs=-1)
def bench(
    model_paths,
    tokens,
    ab,
    repeats,
    kind,
    min_ms,
    idle_s,
    no_breakdown,
    fmt,
    plot_path,
    batch,
    shared_prefix,
    log_uniform,
    prompts_path,
    n_predict,
    ubatch,
    more_ab,
    gemm,
) -> None:
    """Prefill tok/s per config and length (median, spread over repeats, noise band).
    --gemm applies to every config over the environment; an --ab config wins over both."""
    from minfer.commands.prefill import check_backend, pick_backend_kind
    from minfer.errors import BadInput
    from minfer.tools.bench.ab import expand_configs, parse_tokens, run
    from minfer.tools.bench.out import check_plot_path, plot

    # every check before the default model is fetched and before any benchmarking
    if more_ab and not ab:
        raise BadInput(f"unexpected arguments {' '.join(more_ab)!r} (A/B configs follow --ab)")
    configs = list(ab) + list(more_ab)
    if min_ms < 0:
        raise BadInput(f"--min-ms {min_ms:g}: must be >= 0")
    if repeats < 1:
        raise BadInput(f"--repeats {repeats}: need at least 1")
    if idle_s is not None and (
        idle_s < 0 or min_ms > 0 or batch is not None or prompts_path is not None
    ):
        raise BadInput(
            f"--idle-s {idle_s:g}: a count of seconds >= 0, with --min-ms 0 "
            "(single prefills) and without --batch / --prompts"
        )
    n_tokens = parse_tokens(tokens)
    batched = batch is not None or prompts_path is not None
    for flag, given in (
        ("--shared-prefix", shared_prefix != 0),
        ("--log-uniform", log_uniform is not None),
        ("-ub/--ubatch", ubatch is not None),
    ):
        if given and not batched:
            raise BadInput(f"{flag} goes with --batch N (or --prompts FILE)")
    if batched and plot_path is not None:
        raise BadInput("--plot draws single-prompt rows; with --batch use -o json or csv")
    if batched and len(model_paths) > 1:
        raise BadInput("--batch / --prompts time one model: give one -m")
    kind, why = pick_backend_kind(kind)  # as prefill: cuda when a GPU is usable, else cpu
    fmt = fmt.lower()
    check_backend(kind, None)
    check_gemm_backend(kind, gemm, configs, why=why)  # never the CPU's rows under a GPU path's name
    if plot_path is not None:
        check_plot_path(plot_path)
    if not model_paths:
        from minfer.gguf.fetch import default_model_path

        model_paths = (default_model_path(),)
    model_path = model_paths[0]
    echo = click.echo if fmt == "md" else (lambda s="": click.echo(s, err=True))
    configs = expand_configs(configs or [""])
    choices = [gemm_choice(gemm, c) for c in configs]  # validated for the cpu backend too
    if not re.fullmatch(r"\d+(,\d+)*", n_predict):
        raise BadInput(f"-n {n_predict!r}: expected a count of tokens")
    if batch is None and prompts_path is None:
        if n_predict != "0":
            from minfer.host.log import log

            log.warning(
                f"-n {n_predict} ignored: minfer bench times prefill only (llama-bench's "
                "tg rows); -n counts with --batch or --prompts"
            )
    else:
        if "," in n_predict:
            raise BadInput(f"-n {n_predict}: one count with --batch / --prompts")
        n_predict = int(n_predict)
        return _bench_batch(
            model_path,
            batch,
            n_tokens,
            shared_prefix,
            prompts_path,
            n_predict,
            configs,
            choices,
            repeats,
            kind,
            echo,
            ubatch,
            log_uniform,
            fmt,
        )
    collect = [] if len(model_paths) > 1 and fmt != "md" else None  # one array for all
    for model_path in model_paths:  # llama-bench runs each -m
        rows = run(
            model_path,
            n_tokens,
            configs,
            repeats,
            kind,
            profile=not no_breakdown,
            echo=echo,
            choices=choices,
            min_ms=min_ms,
            idle_s=idle_s,
            out=click.echo,
            fmt=fmt,
            progress=True,
            collect=collect,
        )
        if plot_path is not None:
            from pathlib import Path

            plot(
                rows,
                _plot_name(plot_path, model_path, len(model_paths)),
                title=f"{Path(model_path).name}, {kind}, min-ms {min_ms:g}",
            )
            echo(f"plot: {_plot_name(plot_path, model_path, len(model_paths))}")
    if collect is not None:
        from minfer.tools.bench.out import format_records

        click.echo(format_records(collect, fmt))


def _plot_name(path: str, model_path: str, n_models: int) -> str:
    """--plot F.png with several models: F-MODEL.png each."""
    if n_models == 1:
        return path
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{Path(model_path).stem}{p.suffix}"))


def _bench_batch(
    model_path,
    batch,
    n_tokens,
    prefix,
    prompts_path,
    n_predict,
    configs,
    choices,
    repeats,
    kind,
    echo,
    ubatch,
    log_uniform,
    fmt,
) -> None:
    from minfer.errors import BadInput
    from minfer.tools.bench import batch as bench_batch

    if len(n_tokens) != 1:
        raise BadInput("--batch takes one prompt length (--tokens L)")
    if n_predict < 0:
        raise BadInput(f"-n {n_predict}: must be >= 0 with --batch")
    if batch is not None and batch < 1:
        raise BadInput(f"--batch {batch}: need at least 1 prompt")
    if log_uniform is not None:
        try:
            a, b = (int(x) for x in log_uniform.split(":"))
        except ValueError:
            raise BadInput(f"--log-uniform {log_uniform!r}: expected A:B") from None
        if not 1 <= a <= b or batch is None:
            raise BadInput("--log-uniform A:B needs 1 <= A <= B and --batch N")
        prompts = bench_batch.log_uniform_prompts(model_path, batch, a, b)
        n_tokens = [b]
    else:
        prompts = None
    if prompts_path is not None:
        prompts = bench_batch.file_prompts(model_path, prompts_path, n_predict)
    bench_batch.run(
        model_path,
        batch or 0,
        n_tokens[0],
        prefix,
        n_predict,
        configs,
        [c if kind == "cuda" else None for c in choices],
        repeats,
        kind,
        echo,
        ubatch,
        prompts,
        out=click.echo,
        fmt=fmt,
    )
