"""`minfer bench-serve`'s load generator (the command: minfer.commands.bench_serve): `workers`
processes, each running its share of `conc` closed-loop clients (asyncio, httpx) that send a
/v1/completions request, wait for its answer and send the next, until the window ends (or
their share of `n_req` requests is sent); an untimed warm-up first. Bodies: random token ids
past the vocabulary's specials (no shared prefix by chance), or lm-eval's shape (a context and
E endings, echo and log-probs). -> the report's fields: requests, errors, tok/s over the
window, latency percentiles, the server's host ms per request (minfer's /metrics).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from minfer.errors import BadInput


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
    request, its forwards and their tokens, the prefix cache's rows copied, the engine
    thread's time by phase."""
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


def _worker(args, ready=None, go=None, out=None) -> dict | None:
    """One process: `conc` closed-loop clients for `duration` s (wall clock) or until its
    `n_req` requests are sent. Spawned (ready, go, out given): imports, passes the barrier
    `ready`, waits for the event `go` (the window opens) and puts its result on `out`."""
    url, key, conc, model, vocab, sh, duration, n_req, seed = args
    import httpx

    if ready is not None:
        ready.wait()
        go.wait()
    c0, t0 = time.process_time(), time.perf_counter()
    res = asyncio.run(
        _clients(httpx, url, key, conc, model, vocab, sh, time.time() + duration, n_req, seed)
    )
    res["cpu"] = (time.process_time() - c0) / max(time.perf_counter() - t0, 1e-9)
    if out is None:
        return res
    out.put(res)
    return None


def _spawned(args: list, at_open) -> tuple[list[dict], object]:
    """_worker over args in spawned processes, the window opened for all at once once every
    one is up (a spawn and its imports take ~0.5-1 s: counted in the window, that was the
    server idling) -> (their results, at_open()'s value, taken as the window opens)."""
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Barrier(len(args) + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(a, ready, go, out), daemon=True) for a in args]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=300)
    except threading.BrokenBarrierError:
        raise BadInput("bench-serve's worker processes did not start within 300 s") from None
    opened = at_open()
    go.set()
    parts = []
    while len(parts) < len(procs):
        try:
            parts.append(out.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                raise BadInput("a bench-serve worker process died (its error is above)") from None
    for p in procs:
        p.join()
    return parts, opened


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
                try:
                    r = await cl.post("/v1/completions", json=_body(rng, model, vocab, sh))
                except httpx.TransportError as e:  # counted, not the end of the run: a
                    # kept-alive connection the server closed as it was reused (~1 in 3 runs
                    # of 20 s on a loaded 2-core machine)
                    res["errors"] += 1
                    res["first_error"] = res["first_error"] or f"{type(e).__name__}: {e}"
                    continue
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


def run(url, key, conc, sh: Shape, duration, n_req, warmup, seed, workers) -> dict:
    import httpx

    with _client(httpx, url, key) as cl:
        try:
            info = cl.get("/tokenizer_info").json()
            model = cl.get("/v1/models").json()["data"][0]["id"]
        except Exception as e:
            raise BadInput(f"no minfer server answers at {url} ({type(e).__name__}: {e})") from None
        vocab = int(info.get("vocab_size") or 32000)
        if warmup:  # the server's CUDA graphs and caches, outside the window
            _worker((url, key, min(warmup, conc), model, vocab, sh, 0.0, warmup, seed + 999))
        shares = [conc // workers + (i < conc % workers) for i in range(workers)]
        reqs = (
            [n_req // workers + (i < n_req % workers) for i in range(workers)]
            if n_req
            else [0] * workers
        )
        args = [
            (url, key, c, model, vocab, sh, duration, r, seed + i)
            for i, (c, r) in enumerate(zip(shares, reqs))
            if c
        ]
        if len(args) == 1:
            h0, t0 = _host_time(cl), time.time()
            parts = [_worker(args[0])]
        else:  # (h0 and t0 are taken in _spawned's window, as the barrier opens)
            parts, (h0, t0) = _spawned(args, lambda: (_host_time(cl), time.time()))
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
    # the busiest client process's CPU share: near 1.0 the clients, not the server, set the pace
    out["client_cpu_max"] = round(max(p["cpu"] for p in parts), 2)
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
            nf = int(d["minfer_tokens_per_forward_count"])
            out["forwards"] = nf
            out["tokens_per_forward"] = round(d["minfer_tokens_per_forward_sum"] / nf, 1)
            out["engine_ms_per_forward"] = {  # the engine thread's ms a forward, by phase
                ph: round(1e3 * d[f'minfer_engine_seconds_total{{phase="{ph}"}}'] / nf, 2)
                for ph in ("schedule", "forward", "hand", "idle")
            }
        out["prefix_rows_copied"] = int(d["minfer_prefix_cache_hit_tokens_total"])
    return out
