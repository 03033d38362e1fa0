"""`minfer quantize IN OUT q4_K_M` (or --type q4_K_M): requantize a GGUF model like llama.cpp's llama-quantize.

Tensor types follow llama.cpp's mix (minfer/tools/quantize_mix.py) and the bytes its reference
quantizers write (minfer/quants/quantize.py): requantizing the default model reproduces
llama.cpp's Q4_K_M / Q6_K / Q8_0 / F16 files tensor for tensor (tests/golden). As
llama-quantize, converting already quantized tensors (the default model is Q4_1) needs
--allow-requantize.
"""

from __future__ import annotations

import click

from minfer.host.log import quiet_option

TYPES = ("q4_K_M", "q4_K_S", "q6_K", "q8_0", "f16")
# llama-quantize also takes a type by its llama_ftype number
FTYPE_IDS = {"15": "q4_K_M", "14": "q4_K_S", "18": "q6_K", "7": "q8_0", "1": "f16"}


def positional_type(rest: tuple[str, ...], ftype: str | None) -> tuple[str, int | None]:
    """(type, threads) of llama-quantize's `IN OUT TYPE [NTHREADS]` tail and --type."""
    if len(rest) > 2:
        raise click.UsageError(
            f"unexpected extra arguments {' '.join(rest[2:])!r} (quantize IN OUT TYPE [NTHREADS])"
        )
    threads = None
    if len(rest) == 2:
        if not rest[1].isdigit() or int(rest[1]) < 1:
            raise click.BadParameter(
                f"{rest[1]!r} is not a positive thread count", param_hint="NTHREADS"
            )
        threads = int(rest[1])
    given = FTYPE_IDS.get(rest[0], rest[0]) if rest else None
    if given is not None:
        canon = next((t for t in TYPES if t.lower() == given.lower()), None)
        if canon is None:
            raise click.BadParameter(
                f"{rest[0]!r} is not one of {', '.join(TYPES)}", param_hint="TYPE"
            )
        if ftype is not None and ftype.lower() != canon.lower():
            raise click.UsageError(f"two types: {rest[0]} and --type {ftype}")
        ftype = canon
    if ftype is None:
        raise click.UsageError(
            f"missing the output type: quantize IN OUT TYPE or --type TYPE ({', '.join(TYPES)})"
        )
    return ftype, threads


@click.command("quantize")
@click.argument("in_path", metavar="IN", type=click.Path())
@click.argument("out_path", metavar="OUT", type=click.Path())
@click.argument("rest", metavar="[TYPE [NTHREADS]]", nargs=-1)
@click.option(
    "--type",
    "ftype",
    default=None,
    type=click.Choice(TYPES, case_sensitive=False),
    help="Output file type (llama.cpp's tensor mix for it); or TYPE after OUT, as "
    "llama-quantize takes it (a name or its number: 15 = q4_K_M).",
)
@click.option(
    "-t",
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes (default: every core); or NTHREADS after TYPE.",
)
@click.option(
    "--allow-requantize",
    is_flag=True,
    help="Convert tensors that are already quantized (a Q4_1 file to q4_K_M), as "
    "llama-quantize's flag; without it such a file is refused.",
)
@quiet_option("No summary on stdout; only errors on stderr (no notes, no progress bar).")
def quantize(
    in_path: str,
    out_path: str,
    rest: tuple[str, ...],
    ftype: str | None,
    threads: int | None,
    allow_requantize: bool,
    quiet: bool,
) -> None:
    """Quantize model IN to OUT (written atomically: nothing is left behind on error or Ctrl-C),
    as `llama-quantize IN OUT TYPE [NTHREADS]`."""
    from minfer.tools.quantize import quantize_model
    from minfer.tools.quantize_mix import ftype_key

    ftype, n = positional_type(rest, ftype)
    threads = threads if threads is not None else n
    st = quantize_model(
        in_path,
        out_path,
        ftype_key(ftype),
        threads=threads,
        progress=not quiet,
        allow_requantize=allow_requantize,
    )
    if not quiet:
        counts: dict[str, int] = {}
        for ty in st.types.values():
            counts[ty] = counts.get(ty, 0) + 1
        mix = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        from minfer.host.fileio import escape_controls
        from minfer.host.words import plural

        click.echo(
            f"{escape_controls(out_path)}: {plural(st.n_tensors, 'tensor')} ({mix}), "
            f"{st.in_bytes / 2**20:.1f} MiB -> {st.out_bytes / 2**20:.1f} MiB"
        )
        click.echo(
            f"quantized {plural(st.n_quantized, 'tensor')}, {st.n_weights / 1e6:.1f} M weights in "
            f"{st.seconds:.1f} s ({st.weights_per_s / 1e6:.1f} M weights/s)"
        )
