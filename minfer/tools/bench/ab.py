"""Interleaved A/B prefill benchmark (llama-bench style) and per-op breakdown.

`bench(model, tokens, configs, repeats, backend)`: one backend per config (GemmChoice.parse_ab:
a path name with tuning variants, "f16:no-rope", or "MINFER_GEMM=NAME"), then for each repeat, for each token count, each config takes one
sample (A B, B A, ... in the same process, same window: the order rotates by one config each
repeat). A sample is prefills from an empty cache: with `min_ms` (default 500), one untimed
pre-roll prefill, then as many back-to-back timed prefills as fill min_ms (the count from the
warm-up prefill's time; a prefill longer than min_ms is timed alone, without a pre-roll), so the
figure is the config's own sustained throughput rather than the GPU's state after the previous
config. On the H200 that state is the power cap: sustained prefill draws ~690-700 W and the
clocks settle near 1.5 GHz, where a single prefill after an idle gap starts at 1.98 GHz
(docs/perf.md). min_ms = 0: one prefill per sample after `idle_s` of an idle GPU, the burst
`minfer prefill` times (right after another config's prefill the board is still at its power
cap: 13 % slower at pp2048 on an H100, lab/regimes.py).
tok/s is the median over repeats, the spread (max - min) over the same config's repeats is its
noise band, and an A/B difference smaller than the largest band is reported as noise.
`breakdown(backend, n)`: one prefill with CUDA events around every op: per GEMM µs, TFLOP/s and
ratio to the mma.sync ceilings measured on the H200 (docs/design.md), attention, rest.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from minfer.errors import BadInput

F16_CEIL = 634e12  # f16 mma.sync m16n8k16, H200 (docs/design.md)
INT8_CEIL = 1267e12  # int8 mma.sync m16n8k32, H200 (docs/design.md)


@dataclass
class Row:
    config: str
    backend: str
    tokens: int
    tok_s: list[float] = field(default_factory=list)
    prefills: int = 1  # timed back-to-back prefills per sample

    @property
    def median(self) -> float:
        return statistics.median(self.tok_s)

    @property
    def spread(self) -> float:
        return max(self.tok_s) - min(self.tok_s) if self.tok_s else 0.0

    @property
    def band(self) -> float:
        """Relative noise band: spread over median."""
        return self.spread / self.median if self.tok_s and self.median > 0 else 0.0


def parse_tokens(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--tokens {s!r}: expected comma-separated integers") from None
    if not out or min(out) <= 0:
        raise BadInput(f"--tokens {s!r}: need at least one positive count")
    return out


def expand_configs(configs: list[str]) -> list[str]:
    """--ab all: every path of the GEMM path table (minfer.cuda.paths.TABLE), in its order."""
    from minfer.cuda.paths import TABLE

    out: list[str] = []
    for c in configs:
        out.extend(TABLE if c.strip() == "all" else [c])
    return out


def prompt_ids(model, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    return rng.integers(0, model.config.vocab_size, size=n, dtype=np.int32)


def time_prefill(backend, ids: np.ndarray, reps: int = 1) -> float:
    """Seconds for `reps` back-to-back prefills of ids, each from an empty cache (device work
    included)."""
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        backend.reset()
        backend.forward(ids, 0)
    backend.synchronize()
    return time.perf_counter() - t0


def bench(
    model,
    tokens: list[int],
    configs: list[str],
    repeats: int,
    backends: list,
    warmup: bool = True,
    min_ms: float = 500.0,
    progress: bool = False,
    idle_s: float = 0.0,
) -> list[Row]:
    """Interleaved: for r in repeats, for n in tokens, for each config: one sample, the configs'
    order rotated by one each repeat. A sample: a pre-roll prefill, then k timed back-to-back
    prefills filling min_ms (k from a second warm-up prefill, the first one records the CUDA
    graph; k = 1 and no pre-roll when one prefill takes min_ms or more, or without warm-up).
    min_ms = 0: one prefill per sample, after idle_s seconds of sleep (the GPU idle, its power
    average falling back from the cap). (Position mattered: on the H200 at pp2048 a
    config timed on one prefill right after the f16 path's measured 10-14% slower than in a later
    position. The rotation gives each config every position over len(configs) repeats, and
    the spread shows what is left. The cause is the power cap, which the previous config's
    prefill had reached.)"""
    if repeats < 1:
        raise BadInput(f"--repeats {repeats}: need at least 1")
    rows = {
        (c, n): Row(c or "default", b.name, n) for c, b in zip(configs, backends) for n in tokens
    }
    prompts = {n: prompt_ids(model, n) for n in tokens}
    pairs = list(zip(configs, backends))
    reps = {(c, n): 1 for c in configs for n in tokens}  # timed prefills per sample
    bar = _progress(progress, (repeats + warmup) * len(tokens) * len(pairs))
    if warmup:  # the first prefill of a shape records its CUDA graph: k from the second
        for n in tokens:
            for c, b in pairs:
                bar(f"warm-up, {n} tokens, {c or 'default'}")
                t = time_prefill(b, prompts[n])
                if min_ms > 0 and t < min_ms / 1e3:
                    t = time_prefill(b, prompts[n])
                    reps[(c, n)] = max(1, math.ceil(min_ms / 1e3 / max(t, 1e-9)))
    for r in range(repeats):
        order = pairs[r % len(pairs) :] + pairs[: r % len(pairs)]
        for n in tokens:
            for c, b in order:
                bar(f"repeat {r + 1}/{repeats}, {n} tokens, {c or 'default'}")
                k = reps[(c, n)]
                if k > 1:
                    time_prefill(b, prompts[n])  # pre-roll: the config's own steady state
                elif min_ms <= 0 and idle_s > 0:
                    time.sleep(idle_s)  # a burst from an idle GPU, as `minfer prefill`
                rows[(c, n)].tok_s.append(n * k / time_prefill(b, prompts[n], k))
                rows[(c, n)].prefills = k
    bar(None)
    for b in backends:
        b.reset()
    return [rows[(c, n)] for n in tokens for c in configs]


def _progress(on: bool, total: int):
    """step(label) before each sample, step(None) at the end: a tqdm bar on stderr, only on a
    terminal (a CPU sample can take seconds and a bench minutes)."""
    from minfer.host.progress import bar as progress_bar

    bar = progress_bar(on, total=total, desc="bench", unit="sample")
    if bar is None:
        return lambda label: None
    started = [False]

    def step(label):
        if started[0]:
            bar.update(1)
        started[0] = True
        if label is None:
            bar.close()
        else:
            bar.set_postfix_str(label, refresh=False)

    return step


def breakdown(backend, model, n: int) -> str:
    """One profiled prefill of n tokens (CUDA backends): per-op µs, TFLOP/s, ratio to ceiling."""
    if not hasattr(backend, "rt"):
        return f"(per-op breakdown: CUDA backends only; {backend.name} has no device events)"
    from minfer.cuda.backend import OpProfile

    ids = prompt_ids(model, n)
    backend.reset()
    backend.rt.function("smoke", "spin_cycles")
    backend.synchronize()
    t0 = time.perf_counter()
    # each chunk queued behind a spin: the events time the GPU's work, not the host's eager
    # launch rate (the timed runs replay CUDA graphs; this one launches op by op)
    backend.profile = prof = OpProfile(backend.rt, spin_ms=BREAKDOWN_SPIN_MS)
    try:
        backend.forward(ids, 0)
        tot = prof.collect()
    finally:
        backend.profile = None
        backend.reset()
    wall_ms = (time.perf_counter() - t0) * 1e3 - prof.spun_ms
    if "attention" in tot:
        tot["attention"][1] = attention_flops(model.config, n, backend.ubatch)
    return breakdown_table(backend.name, n, tot, wall_ms)


def attention_flops(c, n: int, ubatch: int) -> float:
    """The attention FLOPs of a prefill of n tokens from position 0 in chunks of ubatch: 4 Hq D
    per (query row, visible key) (Q K^T and P V), the causal triangle counted once, a local
    layer's keys capped at its window; the last chunk's final layer computes its last row
    alone (Forward.chunk)."""

    def keys(lo: int, hi: int, w: int) -> int:  # sum over t in [lo, hi) of min(t + 1, w)
        def upto(m: int) -> int:  # ... over t in [0, m)
            k = min(m, w)
            return k * (k + 1) // 2 + (m - k) * w

        return upto(hi) - upto(lo)

    last0 = (n - 1) // ubatch * ubatch  # the last chunk's first row
    total = 0
    for il in range(c.n_layers):
        w = c.sliding_window if c.is_local(il) else n
        if il == c.n_layers - 1:
            total += keys(0, last0, w) + keys(n - 1, n, w)
        else:
            total += keys(0, n, w)
    return 4.0 * c.n_heads * c.head_dim * total


# single prefills (min_ms 0) on a GPU: seconds idle before each; after 2 s an H100 is back at
# 1.98 GHz and ~115 W (after another config's prefill: 1.64-1.76 GHz at ~685 W, the power cap)
IDLE_S = 2.0

BREAKDOWN_SPIN_MS = 400.0  # longer than the host takes to launch a chunk's ops one by one


# non-GEMM ops with a row of their own in the breakdown (MMQ: the activation prepasses; olmo2's
# operand launches and the q/k norms in the rope's; MoE: the routing, the grouping by expert,
# the weighted scatter-add: minfer.cuda.load.moe)
NAMED_OPS = (
    "attention",
    "prepass",
    "rmsnorm+prepass",
    "cvt+prepass",
    "rmsnorm_add+prepass",
    "qk_norm+rope",
    "swiglu",
    "moe:route",
    "moe:sort",
    "moe:combine",
)


def breakdown_table(name: str, n: int, tot: dict[str, list], wall_ms: float) -> str:
    """The per-op table of one profiled prefill: tot = OpProfile.collect() (label -> [ms,
    flops, calls]); GEMMs by time with TFLOP/s against the path's ceiling, then NAMED_OPS
    (attention always), then the rest of the events (norms, rope, embedding)."""
    from minfer.cuda.paths import TABLE

    path = TABLE.get(name.removeprefix("cuda-").split(":")[0])  # the backend's --gemm path
    ceil = INT8_CEIL if path is not None and path.int8 else F16_CEIL
    lines = [
        f"per-op breakdown, {name}, {n} tokens (CUDA events, summed over layers, GPU time "
        f"of an eager forward; ceiling {ceil / 1e12:.0f} TFLOP/s):",
        "| op | calls | µs | % | TFLOP/s | of ceiling |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ev_ms = sum(v[0] for v in tot.values())
    gemm_ms = 0.0
    for label in sorted(tot, key=lambda k: -tot[k][0]):
        ms, flops, cnt = tot[label]
        if label.startswith("gemm:"):
            gemm_ms += ms
            tf = flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
            lines.append(
                f"| {label} | {cnt} | {ms * 1e3:,.0f} | {100 * ms / ev_ms:.1f} | "
                f"{tf:,.1f} | {tf * 1e12 / ceil:.2f} |"
            )
    named = 0.0
    for label in NAMED_OPS:
        ms, flops, cnt = tot.get(label, [0.0, 0, 0])
        if cnt or label == "attention":
            named += ms
            tf = f"{flops / (ms * 1e-3) / 1e12:,.1f}" if flops and ms > 0 else ""
            lines.append(
                f"| {label} | {cnt} | {ms * 1e3:,.0f} | {100 * ms / ev_ms:.1f} | {tf} | |"
            )  # (attention: attention_flops; f16, no int8 ceiling)
    rest = ev_ms - gemm_ms - named
    lines.append(
        f"| rest (norm, rope, embed) | | {rest * 1e3:,.0f} | {100 * rest / ev_ms:.1f} | | |"
    )
    lines.append(
        f"| all ops (events) / wall less the spins | | {ev_ms * 1e3:,.0f} / "
        f"{wall_ms * 1e3:,.0f} | | | |"
    )
    return "\n".join(lines)


def run(
    model_path: str,
    tokens: list[int],
    configs: list[str],
    repeats: int,
    kind: str,
    profile: bool = True,
    echo=print,
    choices=None,
    min_ms: float = 500.0,
    out=None,
    fmt: str = "md",
    progress: bool = False,
    idle_s: float | None = None,
    collect: list | None = None,
) -> list[Row]:
    """Load, bench, print. configs: the --ab labels; choices: their resolved GemmChoices
    (minfer.commands.gemm_flags.gemm_choice; None: auto for each). The results table goes to
    `out` (default: echo) in `fmt` (md, json, csv, jsonl: minfer.tools.bench.out), everything
    else to echo; with `collect` (several models in one output) json/csv/jsonl records are
    appended there instead of printed."""
    from minfer.engine.backends import make_backend
    from minfer.gguf.loader import load_model
    from minfer.tools.bench.out import format_rows, model_info, records

    model = load_model(model_path)
    configs = expand_configs(configs or [""])
    mx = max(tokens)
    backends = []
    for c, choice in zip(configs, choices or [None] * len(configs)):
        t0 = time.perf_counter()
        b = make_backend(kind, model, choice, mx, mx, None, progress)
        t1 = time.perf_counter()
        if hasattr(b, "warmup"):  # every kernel of every length built at once, in parallel
            b.warmup(tokens)
        load, warm = getattr(b, "load_s", t1 - t0), time.perf_counter() - t1
        echo(f"{c or 'default'}: backend {b.name}, load {load:.2f} s, warm-up {warm:.2f} s")
        if hasattr(b, "route_summary"):
            echo(f"  {b.route_summary()}")
        if getattr(b, "memory", None) is not None:
            echo(f"  memory {b.memory.line()}")
        backends.append(b)
    if idle_s is None:  # the GPU's power state is what a burst depends on; a CPU's is not
        idle_s = IDLE_S if kind == "cuda" and min_ms <= 0 else 0.0
    rows = bench(
        model, tokens, configs, repeats, backends, min_ms=min_ms, progress=progress, idle_s=idle_s
    )
    per = ", ".join(f"{r.tokens}: {r.prefills}" for r in rows[:: len(configs)])
    sample = (
        f"a pre-roll prefill, then back-to-back timed prefills filling {min_ms:g} ms "
        f"(prefills per sample, {configs[0] or 'default'}: {per})"
        if min_ms > 0
        else f"one prefill after {idle_s:g} s idle (the burst `minfer prefill` times)"
    )
    echo(
        f"\n{model.describe()}; {repeats} repeat(s), interleaved, the order rotated each repeat; "
        f"a sample = {sample}\n"
    )
    info = model_info(model, str(model_path), kind, mx)  # llama-bench's per-model fields
    if collect is not None and fmt != "md":
        collect.extend(records(rows, str(model_path), min_ms, idle_s, info))
    else:
        (out or echo)(
            format_rows(rows, fmt, model=str(model_path), min_ms=min_ms, idle_s=idle_s, info=info)
        )
    if profile:
        for b in backends:
            echo("")
            echo(breakdown(b, model, tokens[0]))
    return rows
