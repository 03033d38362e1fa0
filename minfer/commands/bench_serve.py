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
import time

import click
import numpy as np

from minfer.errors import BadInput, ResourceError


@click.command("bench-serve")
@click.option("--url", default="http://127.0.0.1:8080", show_default=True,
              help="The server's base URL.")
@click.option("--api-key", default=None, envvar="MINFER_API_KEY", help="Bearer key.")
@click.option("--concurrency", "-c", type=int, default=16, show_default=True,
              help="Clients, each with one request in flight.")
@click.option("--prompt-tokens", type=int, default=128, show_default=True,
              help="Tokens per prompt (the shared context with --endings).")
@click.option("--max-tokens", type=int, default=0, show_default=True,
              help="Tokens generated per prompt (0: scoring only).")
@click.option("--echo/--no-echo", default=True,
              help="Ask for the prompt's log-probs (echo, logprobs 1), as lm-eval scores.")
@click.option("--endings", type=int, default=0,
              help="lm-eval's shape: E endings per question, one request of E prompts.")
@click.option("--ending-tokens", type=int, default=16, show_default=True)
@click.option("--duration", type=float, default=20.0, show_default=True,
              help="Seconds to measure (after --warmup requests).")
@click.option("--requests", "n_requests", type=int, default=0,
              help="Stop after this many requests instead (0: --duration).")
@click.option("--warmup", type=int, default=32, show_default=True,
              help="Requests sent at once before the window opens (the server's CUDA graphs).")
@click.option("--seed", type=int, default=0)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def bench_serve(url, api_key, concurrency, prompt_tokens, max_tokens, echo, endings,
                ending_tokens, duration, n_requests, warmup, seed, as_json) -> None:
    """Closed-loop load against a server: aggregate tok/s and latency percentiles."""
    try:
        import httpx
    except ImportError:
        raise ResourceError('bench-serve needs httpx: pip install -e ".[dev]"') from None
    for flag, v in (("--concurrency", concurrency), ("--prompt-tokens", prompt_tokens)):
        if v < 1:
            raise BadInput(f"{flag} must be >= 1, got {v}")
    if max_tokens < 0 or endings < 0 or ending_tokens < 1 or duration <= 0 or warmup < 0:
        raise BadInput("--max-tokens, --endings, --warmup >= 0; --ending-tokens >= 1; "
                       "--duration > 0")
    out = asyncio.run(_run(httpx, url.rstrip("/"), api_key, concurrency, prompt_tokens,
                           max_tokens, echo, endings, ending_tokens, duration, n_requests,
                           warmup, seed))
    if as_json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:22s} {v}")


async def _run(httpx, url, key, conc, L, K, echo, endings, E_len, duration, n_req, warmup,
               seed) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(600.0)) as cl:
        try:
            info = (await cl.get("/tokenizer_info")).json()
            model = (await cl.get("/v1/models")).json()["data"][0]["id"]
        except Exception as e:
            raise BadInput(f"no minfer server answers at {url} ({type(e).__name__}: {e})") \
                from None
        vocab = int(info.get("vocab_size") or 32000)
        rng = np.random.default_rng(seed)
        lo = min(1000, vocab // 2)   # ids past the specials at the vocabulary's start

        def body() -> dict:
            if endings:
                ctx = rng.integers(lo, vocab, L).tolist()
                prompt = [ctx + rng.integers(lo, vocab, E_len).tolist() for _ in range(endings)]
            else:
                prompt = [rng.integers(lo, vocab, L).tolist()]
            b = {"model": model, "prompt": prompt, "max_tokens": K, "temperature": 0}
            if echo:
                b.update(echo=True, logprobs=1)
            if K:
                b["ignore_eos"] = True
            return b

        async def host_time():
            try:
                m = (await cl.get("/metrics")).text
            except Exception:
                return None
            vals = {}
            for line in m.splitlines():
                for k in ("minfer_host_seconds_sum", "minfer_host_seconds_count"):
                    if line.startswith(k + " "):
                        vals[k] = float(line.split()[1])
            return vals if len(vals) == 2 else None

        lat, ptoks, gtoks, errors = [], [0], [0], [0]
        first_error: list[str] = []
        window = {"open": False, "t0": 0.0, "end": 0.0, "sent": 0}

        async def client(i: int) -> None:
            while True:
                now = time.perf_counter()
                if n_req and window["sent"] >= n_req or not n_req and now >= window["end"]:
                    return
                window["sent"] += 1
                b = body()
                t0 = time.perf_counter()
                r = await cl.post("/v1/completions", json=b)
                t1 = time.perf_counter()
                if r.status_code != 200:
                    errors[0] += 1
                    if not first_error:
                        first_error.append(f"{r.status_code} {r.text[:300]}")
                    continue
                u = r.json()["usage"]
                lat.append(t1 - t0)
                ptoks[0] += u["prompt_tokens"]
                gtoks[0] += u["completion_tokens"]

        # warm-up, then the window
        await asyncio.gather(*(cl.post("/v1/completions", json=body()) for _ in range(warmup)))
        h0 = await host_time()
        window["t0"] = time.perf_counter()
        window["end"] = window["t0"] + duration
        await asyncio.gather(*(client(i) for i in range(conc)))
        wall = time.perf_counter() - window["t0"]
        h1 = await host_time()
    lat_ms = np.array(lat) * 1e3
    out = {"url": url, "model": model, "concurrency": conc, "prompt_tokens": L,
           "endings": endings, "max_tokens": K, "echo": echo, "requests": len(lat),
           "errors": errors[0], "wall_s": round(wall, 3),
           "prompt_tok_s": round(ptoks[0] / wall, 1), "gen_tok_s": round(gtoks[0] / wall, 1),
           "latency_p50_ms": round(float(np.percentile(lat_ms, 50)), 2) if lat else None,
           "latency_p90_ms": round(float(np.percentile(lat_ms, 90)), 2) if lat else None,
           "latency_p99_ms": round(float(np.percentile(lat_ms, 99)), 2) if lat else None}
    if first_error:
        out["first_error"] = first_error[0]
    if h0 and h1 and h1["minfer_host_seconds_count"] > h0["minfer_host_seconds_count"]:
        n = h1["minfer_host_seconds_count"] - h0["minfer_host_seconds_count"]
        out["host_ms_per_request"] = round(
            1e3 * (h1["minfer_host_seconds_sum"] - h0["minfer_host_seconds_sum"]) / n, 3)
    return out
