"""`minfer bench` results as llama-bench writes them (-o md|json|csv) and as a plot (--plot).

md: the markdown table (`table`: median tok/s, spread, noise band, A/B verdict);
json: one array of objects, one per (model, config, prompt length); jsonl: one object a line;
csv: the same fields with a header row (samples space-separated in one field). Each record
carries llama-bench's field names first (LLAMA_FIELDS: model_filename, n_prompt, avg_ts, ...;
docs/llamacpp.md compares them), then minfer's own (config, median tok/s, spread, regime). The plot draws median tok/s against the
prompt length, one line per config, the spread as error bars; matplotlib is the optional
extra `plot`, checked before any benchmarking.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from pathlib import Path

from minfer.errors import BadInput, MinferError

FORMATS = ("md", "json", "csv", "jsonl")
# llama-bench's names (tools/llama-bench/llama-bench.cpp, test::get_fields and the JSON
# printer's samples), so a script that parses llama-bench reads minfer's rows
LLAMA_FIELDS = (
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "backends",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "n_prompt",
    "n_gen",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
)
OWN_FIELDS = (
    "model",
    "config",
    "backend",
    "tok_s",
    "tok_s_spread",
    "band",
    "prefills_per_sample",
    "min_ms",
    "idle_s",
    "samples_tok_s",
)
FIELDS = LLAMA_FIELDS + OWN_FIELDS


class MissingExtra(MinferError):
    """An optional package an option needs is not installed (like pycuda for --backend
    cuda): exit code 3."""

    exit_code = 3


def _params_label(n: int) -> str:
    """llama.cpp's size in a model_type: 135M, 8.0B."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{round(n / 1e6)}M"


def model_info(model, path: str, kind: str, ubatch: int) -> dict:
    """llama-bench's per-model fields of a loaded GGUFModel: file name, type (arch, size, file
    type), tensor bytes and parameters, backend, batch sizes, threads."""
    import numpy as np

    from minfer.host.threads import physical_cores

    n_params = sum(int(np.prod(t.shape)) for t in model.tensors.values())
    size = sum(int(t.data.nbytes) for t in model.tensors.values())
    ft = model.metadata.get("general.file_type")
    try:
        import gguf

        ftype = gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError, TypeError):
        ftype = "?"
    threads = os.environ.get("OMP_NUM_THREADS", "")  # -t sets it (minfer.host.threads)
    return {
        "model_filename": str(path),
        "model_type": f"{model.config.arch} {_params_label(n_params)} {ftype}",
        "model_size": size,
        "model_n_params": n_params,
        "backends": "CUDA" if kind == "cuda" else "CPU",
        "n_batch": ubatch,
        "n_ubatch": ubatch,
        "n_threads": int(threads) if threads.isdigit() else physical_cores(),
    }


def _mean_sd(x: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) as llama-bench's avg / stdev (0 for one sample)."""
    m = sum(x) / len(x) if x else 0.0
    sd = statistics.stdev(x) if len(x) > 1 else 0.0
    return m, sd


def records(
    rows, model: str, min_ms: float, idle_s: float = 0.0, info: dict | None = None
) -> list[dict]:
    """One record per row: llama-bench's fields (info: model_info's), then minfer's."""
    import datetime

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for r in rows:
        ts = [float(v) for v in r.tok_s]
        ns = [r.tokens / v * 1e9 if v > 0 else 0.0 for v in ts]  # one prefill's time
        avg_ns, sd_ns = _mean_sd(ns)
        avg_ts, sd_ts = _mean_sd(ts)
        base = {
            "model_filename": model,
            "model_type": None,
            "model_size": None,
            "model_n_params": None,
            "backends": r.backend.split("-")[0].upper(),
            "n_batch": None,
            "n_ubatch": None,
            "n_threads": None,
            **(info or {}),
        }
        out.append(
            {
                **base,
                "n_prompt": r.tokens,
                "n_gen": 0,
                "test_time": when,
                "avg_ns": round(avg_ns),
                "stddev_ns": round(sd_ns),
                "avg_ts": avg_ts,
                "stddev_ts": sd_ts,
                "samples_ns": [round(v) for v in ns],
                "samples_ts": ts,
                "model": model,
                "config": r.config,
                "backend": r.backend,
                "tok_s": r.median,
                "tok_s_spread": r.spread,
                "band": r.band,
                "prefills_per_sample": r.prefills,
                "min_ms": min_ms,
                "idle_s": idle_s,
                "samples_tok_s": list(r.tok_s),
            }
        )
    return out


def table(rows) -> str:
    """llama-bench style markdown; A/B ratio vs the first config, 'noise' inside the band."""
    out = [
        "| config | backend | tokens | tok/s | ± (spread) | band | vs first |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
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
                verdict = (
                    "noise" if abs(ratio - 1) <= band else ("faster" if ratio > 1 else "slower")
                )
                vs = f"{ratio:.3f}x ({verdict})"
            out.append(
                f"| {r.config} | {r.backend} | {n} | {r.median:,.1f} | "
                f"{r.spread / 2:,.1f} | {100 * r.band:.1f}% | {vs} |"
            )
    return "\n".join(out)


def format_rows(
    rows,
    fmt: str = "md",
    model: str = "",
    min_ms: float = 0.0,
    idle_s: float = 0.0,
    info: dict | None = None,
) -> str:
    if fmt == "md":
        return table(rows)
    return format_records(records(rows, model, min_ms, idle_s, info), fmt)


def format_records(recs: list[dict], fmt: str) -> str:
    """json (one array), jsonl (an object a line) or csv (header, lists space-separated)."""
    if fmt == "json":
        return json.dumps(recs, indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in recs)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        for rec in recs:
            w.writerow(
                {
                    k: " ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in v)
                    if isinstance(v, list)
                    else v
                    for k, v in rec.items()
                }
            )
        return buf.getvalue().rstrip("\n")
    raise BadInput(f"-o {fmt!r}: expected one of {', '.join(FORMATS)}")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(
            "--plot needs matplotlib, which is not installed: "
            'pip install -e ".[plot]" (or pip install matplotlib)'
        ) from None
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
        raise BadInput(
            f"--plot {path}: unknown image format {fmt or '(no extension)'!r} "
            f"(use one of {', '.join(sorted(supported))})"
        )
    from minfer.host.fileio import check_output_path

    check_output_path(path)  # a missing folder or a directory refused; a link followed
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
        ax.errorbar(
            [r.tokens for r in rs],
            [r.median for r in rs],
            yerr=[r.spread / 2 for r in rs],
            marker="o",
            capsize=3,
            label=f"{cfg} ({rs[0].backend})",
        )
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
        with atomic_output(path) as tmp:  # a device or FIFO written through, a file replaced
            fig.savefig(str(tmp), format=fmt)
    finally:
        plt.close(fig)
