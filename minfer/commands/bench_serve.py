"""`minfer bench-serve`: a closed-loop load generator against a running `minfer serve` (or any
OpenAI-compatible /v1/completions), as vLLM's benchmark_serving measures: N clients each send
a request, wait for its answer, send the next, for --duration seconds (or --requests in all).

Prompts are random token ids (so the server's tokenizer costs nothing and no two share a
prefix by chance); `--endings E` sends lm-eval's shape instead: one request per question, a
--prompt-tokens context followed by E different --ending-tokens endings (E prompts), scored
with echo and log-probs. Reported: requests and errors, aggregate prompt and generated tok/s
over the measured window, latency p50 / p90 / p99, and the server's own host time per request
(parse, tokenize, submit, serialize: /metrics' minfer_host_seconds) when it is minfer.
The load generator is minfer.tools.bench.serve; here: the flags, their checks, the report.
"""

from __future__ import annotations

import json
import os

import click

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
    from minfer.tools.bench.serve import Shape, run

    workers = min(workers or min(os.cpu_count() or 1, 8), concurrency)
    shape = Shape(prompt_tokens, max_tokens, echo, endings, ending_tokens)
    out = run(
        url.rstrip("/"), api_key, concurrency, shape, duration, n_requests, warmup, seed, workers
    )
    if as_json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:22s} {v}")
