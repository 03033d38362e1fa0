"""`minfer quantize IN OUT --type q4_K_M`: requantize a GGUF model like llama.cpp's llama-quantize.

Tensor types follow llama.cpp's mix (minfer/quants/mix.py) and the bytes its reference
quantizers write (minfer/quants/quantize.py): requantizing the default model reproduces
llama.cpp's Q4_K_M / Q6_K / Q8_0 / F16 files tensor for tensor (tests/golden).
"""

from __future__ import annotations

import click

TYPES = ("q4_K_M", "q4_K_S", "q6_K", "q8_0", "f16")


@click.command("quantize")
@click.argument("in_path", metavar="IN", type=click.Path())
@click.argument("out_path", metavar="OUT", type=click.Path())
@click.option("--type", "ftype", required=True, type=click.Choice(TYPES, case_sensitive=False),
              help="Output file type (llama.cpp's tensor mix for it).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: every core).")
@click.option("--quiet", is_flag=True, help="No progress bar, no summary.")
def quantize(in_path: str, out_path: str, ftype: str, threads: int | None, quiet: bool) -> None:
    """Quantize model IN to OUT (written atomically: nothing is left behind on error or Ctrl-C)."""
    from minfer.quants.mix import ftype_key
    from minfer.quants.requant import quantize_model

    st = quantize_model(in_path, out_path, ftype_key(ftype), threads=threads, progress=not quiet)
    if not quiet:
        counts: dict[str, int] = {}
        for ty in st.types.values():
            counts[ty] = counts.get(ty, 0) + 1
        mix = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        from minfer.host.fileio import escape_controls

        click.echo(f"{escape_controls(out_path)}: {st.n_tensors} tensors ({mix}), "
                   f"{st.in_bytes / 2**20:.1f} MiB -> {st.out_bytes / 2**20:.1f} MiB")
        click.echo(f"quantized {st.n_quantized} tensors, {st.n_weights / 1e6:.1f} M weights in "
                   f"{st.seconds:.1f} s ({st.weights_per_s / 1e6:.1f} M weights/s)")
