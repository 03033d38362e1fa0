"""Faults around `minfer serve` (docs/serve.md, Reliability): SIGTERM with 200 requests in
flight, a non-finite number in one sequence of a batch (a model whose embedding row for one
token id is NaN: any prompt holding that id fails, alone), a model that fails to load, and
--host 0.0.0.0 without --api-key: one line each."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import CHATML, Server, small_chat_model  # noqa: E402

BAD_ID = 200  # its embedding row is NaN in the poisoned model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_chat_model(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    from synth_data import small_parts, write_small

    meta, tensors = small_parts(3, tied=False)  # untied: the output rows stay finite
    meta["tokenizer.chat_template"] = CHATML
    name, q, shape, data = tensors[0]
    assert name == "token_embd.weight"
    data = data.copy()
    data[BAD_ID] = np.nan
    tensors[0] = (name, q, shape, data)
    return write_small(tmp_path_factory.mktemp("nan") / "poisoned.gguf", meta, tensors)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name))


def test_sigterm_with_200_requests_in_flight(model):
    s = Server(model, "--max-batch-tokens", "32", "--timeout", "60")
    n, gen = 200, 24
    out: list = []

    async def clients():
        lim = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(limits=lim, timeout=90) as c:

            async def one(i):
                try:
                    r = await c.post(
                        s.url + "/v1/completions",
                        json={"prompt": f"request {i} says", "max_tokens": gen, "ignore_eos": True},
                    )
                    out.append((r.status_code, r.json()))
                except httpx.HTTPError as e:
                    out.append((type(e).__name__, None))

            await asyncio.gather(*(one(i) for i in range(n)))

    t = threading.Thread(target=lambda: asyncio.run(clients()))
    try:
        t.start()
        t0 = time.monotonic()  # every request submitted (counted at submission), then SIGTERM
        while _metric(s.url, "minfer_prompt_tokens_total") < n * 3 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        running = _metric(s.url, "minfer_running") + _metric(s.url, "minfer_queue_depth")
        s.proc.send_signal(signal.SIGTERM)
        t_sig = time.monotonic()
        t.join(120)
        assert not t.is_alive(), "a client hangs"
        assert s.proc.wait(60) == 0 and time.monotonic() - t_sig < 60  # within --timeout
    finally:
        s.stop()
    assert running > 0, "nothing was in flight at SIGTERM"
    full = [b for code, b in out if code == 200 and b["usage"]["completion_tokens"] == gen]
    clean = [b for code, b in out if code == 503 and b["error"]["code"] == "draining"]
    assert len(out) == n and len(full) + len(clean) == n, [x for x in out if x[0] != 200][:3]
    assert len(full) == n  # admitted before the signal: every one finishes


def test_a_nan_in_one_sequence_fails_it_alone_in_the_scheduler(poisoned):
    """One packed forward holds four prompts, one holding the poisoned id: it gets the error,
    the others their answers equal to each prompt alone; the next forward on the freed slots
    carries nothing of it."""
    from minfer.batch.scheduler import Job
    from minfer.serve.start import build_state

    st = build_state(
        dict(model_path=str(poisoned), backend_kind="cpu", dtype="f64", progress=False)
    )
    sched = st.sched
    prompts = [[1, 5, 9, 14], [3, 1, BAD_ID, 7, 7], [2, 2, 40, 41, 42, 43], [9, 8]]
    got = {i: [] for i in range(len(prompts))}
    jobs = [
        Job(
            np.array(p, np.int32),
            4,
            (lambda i: lambda k, v: got[i].append((k, v)))(i),
            gen_logprobs=True,
        )
        for i, p in enumerate(prompts)
    ]
    sched.submit(jobs)
    while not sched.idle():
        sched.step()
    bad = got[1]
    assert len(bad) == 1 and bad[0][0] == "error" and "non-finite" in str(bad[0][1])
    want = st.engine.prefill([prompts[i] for i in (0, 2, 3)], n_predict=4)
    for i, w in zip((0, 2, 3), want):
        toks = [v.id for k, v in got[i] if k == "token"]
        assert got[i][-1] == ("done", "length") and toks == list(w.tokens), (i, got[i])
    again = []  # the poisoned sequence's slots are taken again by a clean prompt
    sched.submit([Job(np.array(prompts[3], np.int32), 4, lambda k, v: again.append((k, v)))])
    while not sched.idle():
        sched.step()
    assert [v.id for k, v in again if k == "token"] == list(want[2].tokens)


def test_a_nan_in_one_request_of_a_batch_over_http(poisoned):
    s = Server(poisoned, "--dtype", "f64", "--max-batch-tokens", "256")
    try:
        prompts = [[1, 5, 9, 14], [3, 1, BAD_ID, 7], [2, 2, 40, 41, 42], [9, 8], [BAD_ID]]
        out = [None] * len(prompts)

        def one(i):
            out[i] = httpx.post(
                s.url + "/v1/completions",
                json={"prompt": prompts[i], "max_tokens": 4, "ignore_eos": True},
                timeout=60,
            )

        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i in (1, 4):
            err = out[i].json()["error"]
            assert out[i].status_code == 500 and err["code"] == "engine_error"
            assert "non-finite" in err["message"] and "Traceback" not in out[i].text
        from minfer.engine.api import Engine

        eng = Engine(str(poisoned), backend="cpu", dtype="f64")
        for i in (0, 2, 3):
            w = eng.prefill([prompts[i]], n_predict=4)[0]
            assert out[i].status_code == 200 and out[i].json()["choices"][0]["text"] == w.text
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0


def test_a_model_that_fails_to_load_is_one_error_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "minfer",
            "serve",
            "-m",
            str(bad),
            "--backend",
            "cpu",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, (
        p.stderr
    )


def test_every_interface_without_a_key_is_one_warning_line(model):
    """--host 0.0.0.0 on a port that is taken (nothing opens): the warning, then the error."""
    s = Server(model)
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "minfer",
                "serve",
                "-m",
                str(model),
                "--backend",
                "cpu",
                "--host",
                "0.0.0.0",
                "--port",
                str(s.port),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        s.stop()
    lines = p.stderr.splitlines()
    assert len(lines) == 2 and re.match(
        r"minfer: warning: --host 0\.0\.0\.0 without "
        r"--api-key",
        lines[0],
    ), p.stderr
    assert lines[1].startswith("error: cannot listen on 0.0.0.0:")
