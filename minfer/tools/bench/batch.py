"""`minfer bench --batch N --tokens L`: many prompts as one packed run, beside one prompt alone.

Per config (a GEMM path), one Engine (minfer.engine.api); an untimed run first (kernels built,
the CUDA graphs of the run's chunk sizes recorded), then `repeats` samples, each interleaved:
the batch run (N prompts of L random tokens, or the prompts of a file; with a shared prefix of
P tokens, the run with and without prefix sharing), then one L-token prompt alone (the
single-prompt figure `bench --tokens L --min-ms 0` measures). Aggregate prefill tok/s = prompt
tokens / the prefill phase's wall time; decode tok/s = fed-back tokens / the decode phase's;
medians over the samples with their spread (the noise band).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from minfer.errors import BadInput
from minfer.tools.bench.ab import prompt_ids, time_prefill


def batch_prompts(model, n: int, length: int, prefix: int = 0, seed: int = 0) -> list:
    """n prompts of `length` random ids after a common random prefix of `prefix` ids."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, model.config.vocab_size, prefix, dtype=np.int32)
    return [
        np.concatenate([head, rng.integers(0, model.config.vocab_size, length, dtype=np.int32)])
        for _ in range(n)
    ]


def log_uniform_prompts(model_path, n: int, a: int, b: int) -> list:
    """--log-uniform A:B: n prompts of random ids (seed 0), lengths log-uniform in A..B."""
    from minfer.gguf.loader import load_model

    rng = np.random.default_rng(0)
    lens = np.exp(rng.uniform(np.log(a), np.log(b + 1), n)).astype(int).clip(a, b)
    vocab = load_model(model_path).config.vocab_size
    return [rng.integers(0, vocab, k, dtype=np.int32) for k in lens]


def file_prompts(model_path, path: str, n_predict: int) -> list:
    """--prompts FILE: its prompts' ids (JSONL, checked against the context as prefill does)."""
    from minfer.batch.prompts import make_encoder, open_prompts
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    model = load_model(model_path)
    enc = make_encoder(model.metadata, Tokenizer.from_metadata(model.metadata), None, None, True)
    with open_prompts(path, "jsonl", enc, model.config.vocab_size) as src:
        src.scan(model.config.n_ctx, n_predict)
        return [p.ids for p in src]


def _med(xs: list[float]) -> str:
    m = statistics.median(xs)
    band = (max(xs) - min(xs)) / m if m > 0 else 0.0
    return f"{m:,.0f} (±{100 * band / 2:.1f} %)"


def run(
    model_path: str,
    n: int,
    length: int,
    prefix: int,
    n_predict: int,
    configs: list,
    choices: list,
    repeats: int,
    kind: str,
    echo=print,
    ubatch: int | None = None,
    prompts: list | None = None,
    out=None,
    fmt: str = "md",
) -> list[dict]:
    """Load, warm up, time; the results to `out` (default echo) as a markdown table (one row
    per config and sharing mode), or JSON / CSV records (fmt), the rest to echo; -> the
    rows."""
    from minfer.engine.api import Engine
    from minfer.gguf.loader import load_model

    model = load_model(model_path)
    if prompts is None:
        if n < 1 or length < 1 or prefix < 0:
            raise BadInput("--batch N and --tokens L must be >= 1, --shared-prefix >= 0")
        prompts = batch_prompts(model, n, length, prefix)
    lengths = [len(p) for p in prompts]
    single = prompt_ids(model, length or max(lengths))  # one prompt alone, of --tokens L
    modes = [True, False] if prefix else [True]
    rows = []
    for c, choice in zip(configs, choices):
        eng = Engine(model, kind, choice, ubatch, progress=False)
        t0 = time.perf_counter()
        eng.run(enumerate(prompts), lengths, n_predict, lambda r: None)  # warm-up
        echo(
            f"{c or 'default'}: backend {eng.backend.name}, KV {eng.kv_slots:,} slots, "
            f"warm-up run {time.perf_counter() - t0:.2f} s"
        )
        time_prefill(eng.backend, single)  # the single prompt's graph recorded
        res = {m: {"prefill": [], "decode": [], "computed": 0} for m in modes}
        res["single"] = []
        for _ in range(repeats):
            for m in modes:
                tot = eng.run(enumerate(prompts), lengths, n_predict, lambda r: None, share=m)
                res[m]["prefill"].append(tot.prefill_tok_s)
                res[m]["computed"] = tot.computed_tokens
                if tot.decode_steps:
                    res[m]["decode"].append(tot.decode_tok_s)
            res["single"].append(len(single) / time_prefill(eng.backend, single))
        for m in modes:
            row = {
                "config": c or "default",
                "backend": eng.backend.name,
                "prompts": len(prompts),
                "tokens": sum(lengths),
                "computed": res[m]["computed"],
                "share": m,
                "prefill_tok_s": res[m]["prefill"],
                "decode_tok_s": res[m]["decode"],
                "single_tokens": len(single),
                "single_tok_s": res["single"],
            }
            rows.append(row)
        eng.backend = None
    out = out or echo
    if fmt != "md":
        out(_records(rows, str(model_path), fmt))
        return rows
    echo("")
    echo(
        f"{model.describe()}; {len(prompts)} prompts, {sum(lengths):,} tokens "
        f"(lengths {min(lengths)}..{max(lengths)}), -n {n_predict}; {repeats} samples, "
        "interleaved with one prompt alone; median (± half the spread)"
    )
    lines = [
        "",
        "| config | prefix share | batched prefill tok/s | single prompt tok/s (len) | "
        "ratio | decode tok/s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = statistics.median(r["prefill_tok_s"]) / statistics.median(r["single_tok_s"])
        lines.append(
            f"| {r['config']} | {'on' if r['share'] else 'off'} "
            f"({r['computed']:,} computed) | {_med(r['prefill_tok_s'])} | "
            f"{_med(r['single_tok_s'])} ({r['single_tokens']}) | {ratio:.2f}x | "
            + (_med(r["decode_tok_s"]) if r["decode_tok_s"] else "-")
            + " |"
        )
    out("\n".join(lines))
    return rows


def _records(rows: list[dict], model: str, fmt: str) -> str:
    """JSON (an array), JSONL or CSV (a header, samples space-separated) of the rows, medians added."""
    import csv
    import io
    import json

    recs = [
        {
            "model": model,
            **r,
            "prefill_tok_s_median": statistics.median(r["prefill_tok_s"]),
            "single_tok_s_median": statistics.median(r["single_tok_s"]),
            "decode_tok_s_median": (
                statistics.median(r["decode_tok_s"]) if r["decode_tok_s"] else None
            ),
        }
        for r in rows
    ]
    if fmt == "json":
        return json.dumps(recs)
    if fmt == "jsonl":  # llama-bench's -o jsonl: one object a line
        return "\n".join(json.dumps(r) for r in recs)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(recs[0]), lineterminator="\n")
    w.writeheader()
    for r in recs:
        w.writerow(
            {k: " ".join(f"{x:g}" for x in v) if isinstance(v, list) else v for k, v in r.items()}
        )
    return buf.getvalue().rstrip("\n")
