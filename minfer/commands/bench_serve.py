"""`minfer bench-serve`: a closed-loop load generator against a running `minfer serve` (or any
OpenAI-compatible /v1/completions), as vLLM's benchmark_serving measures: N clients each send
a request, wait for its answer, send the next, for --duration seconds (or --requests in all).

Prompts are random token ids (so the server's tokenizer costs nothing and no two share a
prefix by chance); `--endings E` sends lm-eval's shape instead: one request per question, a
--prompt-tokens context followed by E different --ending-tokens endings (E prompts), scored
with echo and log-probs. Reported: requests and errors, aggregate prompt and generated tok/s
over the measured window, latency p50 / p90 / p99, and the server's own host time per request
(parse, tokenize, submit, serialize: /metrics' minfer_host_seconds) when it is minfer.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

import click
import numpy as np

from minfer.errors import BadInput, ResourceError


@click.command("bench-serve")
@click.option(
    "--url", default="http://127.0.0.1:8080", show_default=True, help="The server's base URL."
)
@click.option("--api-key", default=None, envvar="MINFER_API_KEY", help="Bearer key.")
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=16,
    show_default=True,
    help="Clients, each with one request in flight.",
)
@click.option(
    "--prompt-tokens",
    type=int,
    default=128,
    show_default=True,
    help="Tokens per prompt (the shared context with --endings).",
)
@click.option(
    "--max-tokens",
    type=int,
    default=0,
    show_default=True,
    help="Tokens generated per prompt (0: scoring only).",
)
@click.option(
    "--echo/--no-echo",
    default=True,
    help="Ask for the prompt's log-probs (echo, logprobs 1), as lm-eval scores.",
)
@click.option(
    "--endings",
    type=int,
    default=0,
    help="lm-eval's shape: E endings per question, one request of E prompts.",
)
@click.option("--ending-tokens", type=int, default=16, show_default=True)
@click.option(
    "--duration",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds to measure (after --warmup requests).",
)
@click.option(
    "--requests",
    "n_requests",
    type=int,
    default=0,
    help="Stop after this many requests instead (0: --duration).",
)
@click.option(
    "--warmup",
    type=int,
    default=32,
    show_default=True,
    help="Requests sent at once before the window opens (the server's CUDA graphs).",
)
@click.option("--seed", type=int, default=0)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Client processes sharing the clients (default: min(cores, 8, -c)): one "
    "Python process tops out near 150 requests/s of 128-token scoring.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def bench_serve(
    url,
    api_key,
    concurrency,
    prompt_tokens,
    max_tokens,
    echo,
    endings,
    ending_tokens,
    duration,
    n_requests,
    warmup,
    seed,
    workers,
    as_json,
) -> None:
    """Closed-loop load against a server: aggregate tok/s and latency percentiles."""
    try:
        import httpx  # noqa: F401  (the check only; the workers import it)
    except ImportError:
        raise ResourceError('bench-serve needs httpx: pip install -e ".[dev]"') from None
    for flag, v in (("--concurrency", concurrency), ("--prompt-tokens", prompt_tokens)):
        if v < 1:
            raise BadInput(f"{flag} must be >= 1, got {v}")
    if max_tokens < 0 or endings < 0 or ending_tokens < 1 or duration <= 0 or warmup < 0:
        raise BadInput(
            "--max-tokens, --endings, --warmup >= 0; --ending-tokens >= 1; --duration > 0"
        )
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1, got {workers}")
    workers = min(workers or min(os.cpu_count() or 1, 8), concurrency)
    shape = Shape(prompt_tokens, max_tokens, echo, endings, ending_tokens)
    out = _run(
        url.rstrip("/"), api_key, concurrency, shape, duration, n_requests, warmup, seed, workers
    )
    if as_json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:22s} {v}")


@dataclass(frozen=True)
class Shape:
    L: int  # prompt (context) tokens
    K: int  # tokens generated
    echo: bool  # prompt log-probs asked for
    endings: int  # lm-eval's shape: endings per request (0: one prompt)
    E_len: int  # tokens per ending


def _body(rng, model: str, vocab: int, sh: Shape) -> dict:
    lo = min(1000, vocab // 2)  # ids past the specials at the vocabulary's start
    if sh.endings:
        ctx = rng.integers(lo, vocab, sh.L).tolist()
        prompt = [ctx + rng.integers(lo, vocab, sh.E_len).tolist() for _ in range(sh.endings)]
    else:
        prompt = [rng.integers(lo, vocab, sh.L).tolist()]
    b = {"model": model, "prompt": prompt, "max_tokens": sh.K, "temperature": 0}
    if sh.echo:
        b.update(echo=True, logprobs=1)
    if sh.K:
        b["ignore_eos"] = True
    return b


def _client(httpx, url: str, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=600.0)


_SERVER_KEYS = (
    "minfer_host_seconds_sum",
    "minfer_host_seconds_count",
    "minfer_tokens_per_forward_sum",
    "minfer_tokens_per_forward_count",
    "minfer_prefix_cache_hit_tokens_total",
    'minfer_engine_seconds_total{phase="schedule"}',
    'minfer_engine_seconds_total{phase="forward"}',
    'minfer_engine_seconds_total{phase="hand"}',
    'minfer_engine_seconds_total{phase="idle"}',
)


def _host_time(cl) -> dict | None:
    """The server's counters of _SERVER_KEYS (None: not a minfer server): its host time per
    request, its forwards and their tokens, the prefix cache's rows copied."""
    try:
        m = cl.get("/metrics").text
    except Exception:
        return None
    vals = {}
    for line in m.splitlines():
        k = line.split(" ", 1)[0]
        if k in _SERVER_KEYS:
            vals[k] = float(line.split()[1])
    return vals if len(vals) >= 2 else None


def _worker(args) -> dict:
    """One process: `conc` closed-loop clients until t_end (wall clock) or n_req requests."""
    url, key, conc, model, vocab, sh, t_end, n_req, seed = args
    import httpx

    return asyncio.run(_clients(httpx, url, key, conc, model, vocab, sh, t_end, n_req, seed))


async def _clients(httpx, url, key, conc, model, vocab, sh, t_end, n_req, seed) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4)
    rng = np.random.default_rng(seed)
    res = {"lat": [], "ptoks": 0, "gtoks": 0, "errors": 0, "first_error": None, "sent": 0}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=httpx.Timeout(600.0)
    ) as cl:

        async def client() -> None:
            while (res["sent"] < n_req) if n_req else (time.time() < t_end):
                res["sent"] += 1
                t0 = time.perf_counter()
                r = await cl.post("/v1/completions", json=_body(rng, model, vocab, sh))
                t1 = time.perf_counter()
                if r.status_code != 200:
                    res["errors"] += 1
                    res["first_error"] = res["first_error"] or f"{r.status_code} {r.text[:300]}"
                    continue
                u = json.loads(r.content)["usage"]
                res["lat"].append(t1 - t0)
                res["ptoks"] += u["prompt_tokens"]
                res["gtoks"] += u["completion_tokens"]

        await asyncio.gather(*(client() for _ in range(conc)))
    return res


def _run(url, key, conc, sh: Shape, duration, n_req, warmup, seed, workers) -> dict:
    import httpx

    with _client(httpx, url, key) as cl:
        try:
            info = cl.get("/tokenizer_info").json()
            model = cl.get("/v1/models").json()["data"][0]["id"]
        except Exception as e:
            raise BadInput(f"no minfer server answers at {url} ({type(e).__name__}: {e})") from None
        vocab = int(info.get("vocab_size") or 32000)
        if warmup:  # the server's CUDA graphs and caches, outside the window
            _worker((url, key, min(warmup, conc), model, vocab, sh, 0, warmup, seed + 999))
        h0 = _host_time(cl)
        shares = [conc // workers + (i < conc % workers) for i in range(workers)]
        reqs = (
            [n_req // workers + (i < n_req % workers) for i in range(workers)]
            if n_req
            else [0] * workers
        )
        t0 = time.time()
        args = [
            (url, key, c, model, vocab, sh, t0 + duration, r, seed + i)
            for i, (c, r) in enumerate(zip(shares, reqs))
            if c
        ]
        if len(args) == 1:
            parts = [_worker(args[0])]
        else:
            with mp.get_context("spawn").Pool(len(args)) as pool:
                parts = pool.map(_worker, args)
        wall = time.time() - t0
        h1 = _host_time(cl)
    lat = np.array([x for p in parts for x in p["lat"]]) * 1e3
    ptoks, gtoks = sum(p["ptoks"] for p in parts), sum(p["gtoks"] for p in parts)
    errors = sum(p["errors"] for p in parts)
    out = {
        "url": url,
        "model": model,
        "concurrency": conc,
        "workers": len(args),
        "prompt_tokens": sh.L,
        "endings": sh.endings,
        "max_tokens": sh.K,
        "echo": sh.echo,
        "requests": int(lat.size),
        "errors": errors,
        "wall_s": round(wall, 3),
        "prompt_tok_s": round(ptoks / wall, 1),
        "gen_tok_s": round(gtoks / wall, 1),
    }
    for q in (50, 90, 99):
        out[f"latency_p{q}_ms"] = round(float(np.percentile(lat, q)), 2) if lat.size else None
    first = next((p["first_error"] for p in parts if p["first_error"]), None)
    if first:
        out["first_error"] = first
    if h0 and h1 and h1["minfer_host_seconds_count"] > h0["minfer_host_seconds_count"]:
        n = h1["minfer_host_seconds_count"] - h0["minfer_host_seconds_count"]
        out["host_ms_per_request"] = round(
            1e3 * (h1["minfer_host_seconds_sum"] - h0["minfer_host_seconds_sum"]) / n, 3
        )
        d = {k: h1.get(k, 0.0) - h0.get(k, 0.0) for k in _SERVER_KEYS}
        if d["minfer_tokens_per_forward_count"] > 0:  # (counted from the window's start)
            out["forwards"] = int(d["minfer_tokens_per_forward_count"])
            out["tokens_per_forward"] = round(
                d["minfer_tokens_per_forward_sum"] / d["minfer_tokens_per_forward_count"], 1
            )
        out["prefix_rows_copied"] = int(d["minfer_prefix_cache_hit_tokens_total"])
        if out.get("forwards"):  # the engine thread's ms a forward, by phase
            out["engine_ms_per_forward"] = {
                ph: round(
                    1e3 * d[f'minfer_engine_seconds_total{{phase="{ph}"}}'] / out["forwards"], 2
                )
                for ph in ("schedule", "forward", "hand", "idle")
            }
    return out
