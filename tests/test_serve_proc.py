"""`minfer serve --engine process` (the default; minfer/serve/engine_proc.py) against `--engine
thread`: the same log-probs bit for bit (CPU f64 reference) and the same /metrics counts for the
same requests; an engine process that fails to load is one error line; one killed while serving
fails the requests in flight with 500 engine_error and the server exits non-zero, at once."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import Server, small_chat_model  # noqa: E402

ARGS = ("--dtype", "f64", "--max-batch-tokens", "64")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_chat_model(tmp_path_factory.mktemp("proc"))


@pytest.fixture(scope="module")
def servers(model):
    out = {m: Server(model, *ARGS, "--engine", m) for m in ("thread", "process")}
    yield out
    assert [s.stop() for s in out.values()] == [0, 0]


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _engine_pid(server) -> int:
    """The spawned engine process (the other child is multiprocessing's resource tracker)."""
    for c in _children(server.proc.pid):
        with open(f"/proc/{c}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                return c
    raise AssertionError("no engine process")


def test_both_modes_give_the_same_numbers_and_counts(servers):
    """Sequential requests (one forward's packing each, the same in both modes): the echoed
    log-probs equal bit for bit, and every count /metrics keeps equals."""
    bodies = [
        {"prompt": ["The capital of France is", "one two three"], "echo": True, "logprobs": 2,
         "max_tokens": 0},
        {"prompt": "a b c d e f", "max_tokens": 5, "ignore_eos": True, "logprobs": 1},
        {"prompt": "The capital of France is Paris", "echo": True, "logprobs": 1,
         "max_tokens": 3, "ignore_eos": True, "stop": ["zz"]},
        {"prompt": [[5, 6, 7] * 30], "echo": True, "logprobs": 0, "max_tokens": 0},
    ]  # fmt: skip
    got = {}
    for mode, s in servers.items():
        got[mode] = [httpx.post(s.url + "/v1/completions", json=b, timeout=60) for b in bodies]
        got[mode].append(
            httpx.post(s.url + "/v1/embeddings", json={"input": ["x y", "z"]}, timeout=60)
        )
        assert all(r.status_code == 200 for r in got[mode]), [r.text for r in got[mode]]
    for a, b in zip(got["thread"], got["process"]):
        ja, jb = a.json(), b.json()
        for j in (ja, jb):
            j.pop("id", None), j.pop("created", None)
        assert ja == jb  # floats from JSON: bitwise equal as Python floats
    time.sleep(0.2)  # (the process's last step's message may trail its answer)
    mt, mp = (_metrics(s.url) for s in servers.values())
    counts = [
        k
        for k in mt
        if k.startswith(
            (
                "minfer_requests_total",
                "minfer_prompt_tokens_total",
                "minfer_generation_tokens_total",
                "minfer_tokens_per_forward",
                "minfer_prefix_cache",
                "minfer_kv_slots",
                "minfer_queue_depth",
                "minfer_running",
            )
        )
        or k.endswith("_count")
    ]
    assert len(counts) > 30 and mt["minfer_generation_tokens_total"] == 8
    assert {k: mt[k] for k in counts} == {k: mp.get(k) for k in counts}
    phases = lambda m: {k for k in m if k.startswith("minfer_engine_seconds_total")}  # noqa: E731
    assert phases(mt) == phases(mp) and len(phases(mp)) == 4


def test_an_engine_process_that_cannot_load_is_one_error_line(model):
    """--backend cuda where pycuda is missing: the parent reads the GGUF's header fine, the
    engine process fails to build its backend."""
    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed: the cuda backend may load here")
    p = subprocess.run(
        [sys.executable, "-m", "minfer", "serve", "-m", str(model), "--backend", "cuda",
         "--host", "127.0.0.1", "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode != 0 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, (
        p.stderr
    )
    assert "Traceback" not in p.stderr and "GPU" in p.stderr


def test_an_engine_process_killed_while_serving(model):
    """The engine stopped (SIGSTOP) while 6 requests wait in it, then killed: each gets a 500
    engine_error object, /health (while it still answers) is not 200, and the server exits
    non-zero within seconds with one error line."""
    s = Server(model, "--max-batch-tokens", "16")
    try:
        pid = _engine_pid(s)
        os.kill(pid, signal.SIGSTOP)
        out: list = []

        def one(i):
            r = httpx.post(
                s.url + "/v1/completions",
                json={"prompt": [1, 2, 3, 4 + i], "max_tokens": 50, "ignore_eos": True},
                timeout=60,
            )
            out.append(r)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        t0 = time.monotonic()  # every request submitted (counted at submission, in the parent)
        while _metrics(s.url).get("minfer_prompt_tokens_total", 0) < 6 * 4:
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        health = []
        while s.proc.poll() is None and time.monotonic() - t_kill < 10:
            try:
                health.append(httpx.get(s.url + "/health", timeout=5))
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        for t in ts:
            t.join(30)
        assert s.proc.wait(10) == 3 and time.monotonic() - t_kill < 10
    finally:
        s.stop()
    assert len(out) == 6
    for r in out:
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error", r.text
        assert "engine process died" in r.json()["error"]["message"]
    assert all(h.status_code == 500 for h in health), [h.text for h in health]
    s._t.join(5)
    err = [line for line in s.lines if line.startswith("error:")]
    assert len(err) == 1 and "engine process died" in err[0], s.lines
    assert not any("Traceback" in line or "warning" in line.lower() for line in s.lines), s.lines


def test_the_loop_side_pipe_io_keeps_connection_frames():
    """The parent's pipe I/O on the event loop (engine_proc.attach) against multiprocessing's
    own ends: commands past the pipe's 64 KB (a burst of submissions) leave without blocking
    the loop and arrive whole through recv_bytes; the child's send_bytes messages, small and
    large, come out of _frames whole, however the bytes were split."""
    import asyncio
    import multiprocessing as mp
    import pickle

    from minfer.serve import engine_proc as E

    for n in (0, 5, 70_000, 300_000):  # (the 8-byte form needs 2 GB: its header is packed)
        data = os.urandom(n)
        buf = bytearray(E._frame(data) + E._frame(b"x"))
        got = [list(E._frames(buf[:k])) for k in (3, 4 + n // 2)]  # partial: nothing, or less
        assert got[0] == [] and got[1] == ([b""] if n == 0 else [])
        assert list(E._frames(buf)) == [data, b"x"] and not buf
    assert E._frame(b"ab")[:4] == b"\x00\x00\x00\x02"

    r, w = mp.Pipe(duplex=False)
    ev_r, ev_w = mp.Pipe(duplex=False)
    ep = E.EngineProcess.__new__(E.EngineProcess)
    ep._cmd, ep._ev, ep._cmds, ep._out, ep._in, ep.loop = (
        w,
        ev_r,
        [],
        bytearray(),
        bytearray(),
        None,
    )
    got, seen = [], []
    reader = threading.Thread(
        target=lambda: got.extend(pickle.loads(r.recv_bytes()) for _ in range(2))
    )
    reader.start()
    big = ("submit", [os.urandom(200_000)])  # ~3 pipe buffers

    async def main():
        ep.attach(asyncio.get_running_loop())
        ep._message = seen.append  # the child's messages, as parsed on the loop
        ep._post(big)
        ep._post(("cancel", [1]))  # the same loop iteration: one message with both
        assert ep._cmds  # (not written yet: after this iteration)
        await asyncio.sleep(0)
        msgs = (("s", [1]), ("t", os.urandom(150_000)))  # (the child's side: another thread)
        threading.Thread(target=lambda: [ev_w.send_bytes(pickle.dumps(m)) for m in msgs]).start()
        ep._post(("stop",))
        for _ in range(500):
            if not ep._out and len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        ep.loop.remove_reader(ev_r.fileno())

    asyncio.run(main())
    reader.join(10)
    assert got == [[big, ("cancel", [1])], [("stop",)]] and seen[0] == ("s", [1]) and len(seen) == 2
