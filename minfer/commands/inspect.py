"""`minfer inspect FILE [--json]`: metadata and a table of tensors, types and sizes."""

from __future__ import annotations

import dataclasses
import json

import click

LONG = 8  # arrays longer than this (vocabulary, merges) are summarized unless --all-metadata


def as_dict(m, all_metadata: bool) -> dict:
    """The --json object: file, config, metadata (long arrays as their length unless
    all_metadata), tensors (name, type, shape, bytes), totals."""
    meta, arrays = {}, {}
    for k, v in m.metadata.items():
        if isinstance(v, (list, tuple)) and len(v) > LONG and not all_metadata:
            arrays[k] = len(v)
        else:
            meta[k] = v
    tensors = [
        {
            "name": t.name,
            "type": t.type_name,
            "shape": [int(s) for s in t.shape],
            "bytes": int(t.data.nbytes),
        }
        for t in m.tensors.values()
    ]
    return {
        "file": str(m.path),
        "config": dataclasses.asdict(m.config),
        "metadata": meta,
        "metadata_array_lengths": arrays,
        "tensors": tensors,
        "n_tensors": len(tensors),
        "bytes": sum(t["bytes"] for t in tensors),
        "refusal": m.refusal,
    }


@click.command("inspect")
@click.argument("file", type=click.Path())  # checked by the loader: exit 2
@click.option("--all-metadata", is_flag=True, help="Print long arrays (vocabulary, merges) too.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object on stdout (long arrays as their lengths unless --all-metadata).",
)
def inspect(file: str, all_metadata: bool, as_json: bool) -> None:
    """Print a GGUF model's metadata and its tensors (name, type, shape, bytes)."""
    from minfer.gguf.loader import load_model
    from minfer.host.fileio import escape_controls as esc
    from minfer.host.words import plural

    m = load_model(file, strict=False)
    if as_json:
        # bytes values (a non-UTF-8 string in the file) as text rather than a crash
        click.echo(
            json.dumps(
                as_dict(m, all_metadata),
                ensure_ascii=False,
                default=lambda o: o.decode("utf-8", "replace") if isinstance(o, bytes) else str(o),
            )
        )
        return
    click.echo(esc(m.describe()))
    if m.refusal:
        click.echo(esc(f"refused  for running: {m.refusal}"))
    click.echo("\nmetadata:")
    for k, v in m.metadata.items():
        if isinstance(v, list) and len(v) > LONG and not all_metadata:
            v = f"[{len(v)} items: {', '.join(map(repr, v[:3]))}, ...]"
        else:
            v = repr(v) if isinstance(v, str) else v
            v = str(v) if len(str(v)) <= 100 or all_metadata else str(v)[:97] + "..."
        click.echo(f"  {esc(k)} = {esc(str(v))}")  # a raw \n or ESC in a key would forge lines
    click.echo(f"\n{'tensor':<32} {'type':<7} {'shape':<16} {'bytes':>12}")
    total = 0
    counts: dict[str, int] = {}
    for t in m.tensors.values():
        n = int(t.data.nbytes)
        total += n
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
        click.echo(f"{esc(t.name):<32} {t.type_name:<7} {'x'.join(map(str, t.shape)):<16} {n:>12,}")
    click.echo(
        f"\n{plural(len(m.tensors), 'tensor')}, {total:,} bytes; types: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
    )
