"""`minfer serve` under load on loopback (docs/serve.md, Reliability): 2,000 concurrent
connections with a small queue (each answered whole: 200 or a clean 429), a slow reader (it
holds no engine work), clients that vanish mid-request (their work is cancelled), and a
bounded sample of the soak (lab/serve_soak.py)."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import Server, small_chat_model  # noqa: E402

CONNS = 2000


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_chat_model(tmp_path_factory.mktemp("load"), n_ctx=4096)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith(name + " ") or x.startswith(name + "{")
    )


async def _one(port: int, i: int) -> tuple[int, dict | None]:
    """One connection, one request, read to EOF: (status, body) or (0, None) when cut."""
    body = json.dumps({"prompt": f"client {i}", "max_tokens": 2, "ignore_eos": True}).encode()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    await w.drain()
    data = await r.read()
    w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return 0, None
    n = int(
        next(
            h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
    )
    return int(head[9:12]), json.loads(rest) if len(rest) == n else None


def test_2000_concurrent_connections(model):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < CONNS + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, CONNS + 1000), hard))
    s = Server(model, "--max-queue", "256", "--max-batch-tokens", "256")
    try:

        async def run():
            return await asyncio.wait_for(
                asyncio.gather(*(_one(s.port, i) for i in range(CONNS))), 300
            )

        t0 = time.monotonic()
        out = asyncio.run(run())
        took = time.monotonic() - t0
        codes = [c for c, _ in out]
        assert len(out) == CONNS and all(b is not None for _, b in out), codes.count(0)
        assert set(codes) <= {200, 429} and codes.count(200) >= 256, {
            c: codes.count(c) for c in set(codes)
        }
        for c, b in out:
            if c == 429:
                assert b["error"]["code"] == "queue_full"
            else:
                assert b["usage"]["completion_tokens"] == 2
        assert httpx.get(s.url + "/health").status_code == 200
        print(
            f"{CONNS} connections in {took:.1f} s: {codes.count(200)} answered, "
            f"{codes.count(429)} queue full"
        )
    finally:
        assert s.stop() == 0


def test_a_slow_reader_holds_no_engine_work(model):
    s = Server(model)
    try:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: a small window
        c.connect(("127.0.0.1", s.port))
        body = json.dumps(
            {"prompt": "slow", "max_tokens": 600, "ignore_eos": True, "stream": True, "logprobs": 5}
        ).encode()
        c.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        got = b""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4:  # a byte every 0.1 s while the engine finishes
            got += c.recv(1)
            time.sleep(0.1)
        assert got.startswith(b"HTTP/1.1 200")
        assert _metric(s.url, "minfer_running") == 0  # its sequence is done, slots back
        assert _metric(s.url, "minfer_generation_tokens_total") == 600
        t1 = time.monotonic()  # others are served while it still reads
        r = httpx.post(
            s.url + "/v1/completions", json={"prompt": "fast", "max_tokens": 4}, timeout=30
        )
        assert r.status_code == 200 and time.monotonic() - t1 < 5
        c.close()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_vanishes_mid_request_is_cancelled(model, stream):
    s = Server(model, "--max-batch-tokens", "64")
    try:
        c = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps(
            {"prompt": "gone", "max_tokens": 3000, "ignore_eos": True, "stream": stream}
        ).encode()
        c.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        t0 = time.monotonic()
        while _metric(s.url, "minfer_generation_tokens_total") < 20:
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
        c.close()
        time.sleep(1.5)  # the front notices within 0.5 s, the engine at its next step
        n1 = _metric(s.url, "minfer_generation_tokens_total")
        assert _metric(s.url, "minfer_running") == 0 and n1 < 3000
        time.sleep(0.5)
        assert _metric(s.url, "minfer_generation_tokens_total") == n1  # nothing carries it
        r = httpx.post(
            s.url + "/v1/completions",
            json={"prompt": "next", "max_tokens": 3, "ignore_eos": True},
            timeout=30,
        )
        assert r.json()["usage"]["completion_tokens"] == 3
    finally:
        assert s.stop() == 0


def test_soak_sample(tmp_path):
    """20 s of lab/serve_soak.py: steady load, RSS and p99 per interval, the prefix cache
    bounded by the KV slots."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
    import serve_soak

    rows, verdict = serve_soak.soak(seconds=20, interval=5, clients=4, log=lambda *a: None)
    assert len(rows) >= 3 and all(r["errors"] == 0 for r in rows)
    assert verdict["prefix_bounded"], rows
    assert verdict["rss_growth"] < 0.15, rows  # short: warm-up allocations still show


@pytest.mark.parametrize("how", [("--requests", "12"), ("--duration", "2")])
def test_bench_serve_counts_its_window(model, how):
    """The load generator over 2 worker processes: every request answered and counted, its
    tokens over a window that opens once both workers are up (their spawn is not the
    server's idle time) and closes with the last answer."""
    import subprocess

    s = Server(model)
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "minfer", "bench-serve", "--url", s.url, "-c", "4",
             "--workers", "2", "--prompt-tokens", "16", "--warmup", "2", "--json", *how],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        s.stop()
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["errors"] == 0 and d["workers"] == 2, d
    if how[0] == "--requests":
        assert d["requests"] == 12
    else:
        assert d["requests"] >= 4 and 2.0 <= d["wall_s"] < took
    assert d["prompt_tok_s"] == pytest.approx(16 * d["requests"] / d["wall_s"], rel=1e-2)
    assert d["forwards"] >= 1 and d["engine_ms_per_forward"]["forward"] > 0
    assert 0 < d["client_cpu_max"] < 2.5  # (a process's CPU share: threads may add a little)
