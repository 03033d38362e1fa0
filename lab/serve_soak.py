"""A soak of `minfer serve` at a steady load: per interval the requests, errors, latency p50 /
p99, the server's RSS (/proc/PID/status VmRSS) and the prefix cache's entries and slots
(/metrics); at the end whether RSS stayed within 5 % and p99 flat after the first interval.

    python3 lab/serve_soak.py --minutes 20            # the test llama on the CPU reference
    python3 lab/serve_soak.py --url http://127.0.0.1:8080 --pid 1234 --minutes 20

Load: `--clients` closed-loop clients, each request a random prompt of 8-64 token ids with one
of 32 shared heads (the prefix cache fills, evicts and hits) and 1-16 generated tokens, a
request in 4 streamed. tests/test_serve_load.py runs a 20 s sample.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(text: str, name: str) -> float:
    return sum(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith(name + " ") or x.startswith(name + "{")
    )


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def soak(
    seconds: float,
    interval: float = 60,
    clients: int = 4,
    url: str | None = None,
    pid: int | None = None,
    seed: int = 0,
    log=print,
) -> tuple[list[dict], dict]:
    import httpx

    server = None
    if url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from serve_helpers import Server, small_chat_model

        model = small_chat_model(Path(tempfile.mkdtemp(prefix="minfer-soak-")), n_ctx=512)
        server = Server(model, "--kv-slots", "4096", "--max-batch-tokens", "128")
        url, pid = server.url, server.proc.pid
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = threading.Event()
    rng0 = random.Random(seed)
    heads = [[rng0.randrange(3, 259) for _ in range(rng0.randrange(16, 48))] for _ in range(32)]

    def client(k: int):
        rng = random.Random(seed * 1000 + k)
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                ids = rng.choice(heads) + [
                    rng.randrange(3, 259) for _ in range(rng.randrange(8, 64))
                ]
                body = {"prompt": ids, "max_tokens": rng.randrange(1, 17), "ignore_eos": True}
                t0 = time.perf_counter()
                try:
                    if rng.random() < 0.25:
                        with c.stream(
                            "POST", url + "/v1/completions", json={**body, "stream": True}
                        ) as r:
                            ok = r.status_code == 200 and r.read().endswith(b"[DONE]\n\n")
                    else:
                        r = c.post(url + "/v1/completions", json=body)
                        ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    if ok:
                        lat.append(time.perf_counter() - t0)
                    else:
                        errors[0] += 1

    ts = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in ts:
        t.start()
    rows: list[dict] = []
    kv = None
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            time.sleep(min(interval, max(t_end - time.monotonic(), 0.1)))
            with lock:
                xs, n_err = lat[:], errors[0]
                lat.clear()
                errors[0] = 0
            m = httpx.get(url + "/metrics", timeout=30).text
            kv = metric(m, "minfer_kv_slots")
            row = {
                "t": round(seconds - max(t_end - time.monotonic(), 0)),
                "requests": len(xs),
                "errors": n_err,
                "p50_ms": round(pct(xs, 0.5) * 1e3, 1),
                "p99_ms": round(pct(xs, 0.99) * 1e3, 1),
                "rss_mb": round(rss_mb(pid), 1) if pid else None,
                "prefix_entries": int(metric(m, "minfer_prefix_cache_entries")),
                "prefix_slots": int(metric(m, "minfer_prefix_cache_slots")),
            }
            rows.append(row)
            log(json.dumps(row))
    finally:
        stop.set()
        for t in ts:
            t.join(60)
        rc = server.stop() if server is not None else 0
    base = rows[1:] or rows  # the first interval warms up
    rss = [r["rss_mb"] for r in base if r["rss_mb"]]
    p99 = [r["p99_ms"] for r in base]
    verdict = {
        "rss_growth": (max(rss) - min(rss)) / min(rss) if rss else 0.0,
        "p99_ratio": max(p99) / min(p99) if p99 and min(p99) > 0 else float("nan"),
        "prefix_bounded": all(r["prefix_slots"] <= (kv or 0) for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "server_exit": rc,
    }
    return rows, verdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--interval", type=float, default=60, help="seconds per row (default 60)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int, help="the server's process id (RSS), with --url")
    a = ap.parse_args(argv)
    rows, v = soak(a.minutes * 60, a.interval, a.clients, a.url, a.pid)
    print(
        "| t (s) | requests | errors | p50 ms | p99 ms | RSS MB | prefix entries | "
        "prefix slots |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for r in rows:
        print(
            f"| {r['t']} | {r['requests']} | {r['errors']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['rss_mb']} | {r['prefix_entries']} | {r['prefix_slots']} |"
        )
    print(json.dumps(v))
    ok = (
        v["rss_growth"] <= 0.05
        and v["prefix_bounded"]
        and v["errors"] == 0
        and v["server_exit"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
