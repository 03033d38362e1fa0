"""`minfer bench` results as llama-bench writes them (-o md|json|csv) and as a plot (--plot).

md: the markdown table (`table`: median tok/s, spread, noise band, A/B verdict);
json: one array of objects, one per (config, prompt length); csv: the same fields with a
header row (samples space-separated in one field). The plot draws median tok/s against the
prompt length, one line per config, the spread as error bars; matplotlib is the optional
extra `plot`, checked before any benchmarking.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from minfer.errors import BadInput, MinferError

FORMATS = ("md", "json", "csv")
FIELDS = ("model", "config", "backend", "n_prompt", "tok_s", "tok_s_spread", "band",
          "prefills_per_sample", "min_ms", "idle_s", "samples_tok_s")


class MissingExtra(MinferError):
    """An optional package an option needs is not installed (like pycuda for --backend
    cuda): exit code 3."""

    exit_code = 3


def records(rows, model: str, min_ms: float, idle_s: float = 0.0) -> list[dict]:
    return [{"model": model, "config": r.config, "backend": r.backend, "n_prompt": r.tokens,
             "tok_s": r.median, "tok_s_spread": r.spread, "band": r.band,
             "prefills_per_sample": r.prefills, "min_ms": min_ms, "idle_s": idle_s,
             "samples_tok_s": list(r.tok_s)} for r in rows]


def table(rows) -> str:
    """llama-bench style markdown; A/B ratio vs the first config, 'noise' inside the band."""
    out = ["| config | backend | tokens | tok/s | ± (spread) | band | vs first |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    by_n: dict[int, list] = {}
    for r in rows:
        by_n.setdefault(r.tokens, []).append(r)
    for n, rs in by_n.items():
        base = rs[0]
        band = max(r.band for r in rs)
        for r in rs:
            if r is base:
                vs = "—"
            else:
                ratio = r.median / base.median
                verdict = "noise" if abs(ratio - 1) <= band else ("faster" if ratio > 1
                                                                  else "slower")
                vs = f"{ratio:.3f}x ({verdict})"
            out.append(f"| {r.config} | {r.backend} | {n} | {r.median:,.1f} | "
                       f"{r.spread / 2:,.1f} | {100 * r.band:.1f}% | {vs} |")
    return "\n".join(out)


def format_rows(rows, fmt: str = "md", model: str = "", min_ms: float = 0.0,
                idle_s: float = 0.0) -> str:
    if fmt == "md":
        return table(rows)
    recs = records(rows, model, min_ms, idle_s)
    if fmt == "json":
        return json.dumps(recs, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        for rec in recs:
            w.writerow({**rec, "samples_tok_s": " ".join(f"{v:.3f}" for v in
                                                         rec["samples_tok_s"])})
        return buf.getvalue().rstrip("\n")
    raise BadInput(f"-o {fmt!r}: expected one of {', '.join(FORMATS)}")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra("--plot needs matplotlib, which is not installed: "
                           "pip install -e \".[plot]\" (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: str) -> str:
    """Before benchmarking: matplotlib is there, the format is one it writes, the folder
    exists. Returns the format (the file's extension)."""
    plt = _pyplot()
    fmt = Path(path).suffix.lstrip(".").lower()
    supported = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if fmt not in supported:
        raise BadInput(f"--plot {path}: unknown image format {fmt or '(no extension)'!r} "
                       f"(use one of {', '.join(sorted(supported))})")
    from minfer.host.fileio import check_output_path

    check_output_path(path)   # a missing folder or a directory refused; a link followed
    return fmt


def plot(rows, path: str, title: str = "") -> None:
    """tok/s against prompt length per config, written atomically (a temporary name renamed
    into place: an existing file is never left half-written)."""
    fmt = check_plot_path(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_cfg: dict[str, list] = {}
    for r in rows:
        by_cfg.setdefault(r.config, []).append(r)
    for cfg, rs in by_cfg.items():
        rs = sorted(rs, key=lambda r: r.tokens)
        ax.errorbar([r.tokens for r in rs], [r.median for r in rs],
                    yerr=[r.spread / 2 for r in rs], marker="o", capsize=3,
                    label=f"{cfg} ({rs[0].backend})")
    ax.set_xscale("log", base=2)
    ticks = sorted({r.tokens for r in rows})
    ax.set_xticks(ticks, [str(t) for t in ticks])  # the measured lengths, not powers of two
    ax.set_ylim(bottom=0)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill tok/s (median, ± half the spread)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from minfer.host.fileio import atomic_output

    try:
        with atomic_output(path) as tmp:   # a device or FIFO written through, a file replaced
            fig.savefig(str(tmp), format=fmt)
    finally:
        plt.close(fig)
