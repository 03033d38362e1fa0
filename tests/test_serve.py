"""`minfer serve` through real clients (the openai package, httpx, curl) on the CPU reference in
float64 (where a request in a busy batch equals itself alone to ~1e-12: the f64 identity), a
2-layer test llama with a ChatML template. The server is a subprocess on 127.0.0.1, any free
port, stopped by the fixture (and by the kernel if this process dies)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_helpers import Server, engine_logprobs, small_chat_model  # noqa: E402

F64 = 1e-9  # f64 reference: packing changes summation order only (unit roundoff 1.1e-16)
KEY = "sk-test-123"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_chat_model(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def engine(model):
    from minfer.engine.api import Engine

    return Engine(str(model), backend="cpu", dtype="f64")


@pytest.fixture(scope="module")
def server(model):
    s = Server(
        model, "--dtype", "f64", "--api-key", KEY, "--max-body", "65536", "--max-batch-tokens", "64"
    )
    yield s
    assert s.stop() == 0  # a drained server exits 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _post(server, path, body=None, raw=None, key=KEY, headers=None):
    h = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(server.url + path, json=body, content=raw, headers=h, timeout=60)


PROMPTS = ["The capital of France is", "one two three four five six seven eight nine ten", "a"]


def test_echo_logprobs_equal_the_engine(client, engine):
    r = client.completions.create(
        model="small-chat", prompt=PROMPTS, echo=True, logprobs=1, max_tokens=0
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    want = engine_logprobs(engine, [engine.encode(p) for p in PROMPTS])
    for c, w, p in zip(r.choices, want, PROMPTS):
        lp = c.logprobs
        assert c.text == p and c.finish_reason == "length"
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(w) + 1 == len(lp.text_offset)
        np.testing.assert_allclose(lp.token_logprobs[1:], w, rtol=0, atol=F64)
        for tok, got, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert max(top.values()) >= got - F64 and tok in top  # top-1 and the actual one
    assert r.usage.prompt_tokens == sum(len(engine.encode(p)) for p in PROMPTS)
    assert r.usage.completion_tokens == 0


def test_token_id_prompts_and_greedy_tokens(client, engine):
    ids = [list(map(int, engine.encode(p))) for p in PROMPTS]
    r = client.completions.create(
        model="small-chat", prompt=ids, max_tokens=6, logprobs=0, extra_body={"ignore_eos": True}
    )
    want = engine.prefill(ids, n_predict=6)
    for c, w in zip(r.choices, want):
        assert c.text == w.text and c.finish_reason == "length"
        assert len(c.logprobs.token_logprobs) == 6
    one = client.completions.create(
        model="small-chat", prompt=ids[1], max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert one.choices[0].text == want[1].text


def test_busy_batch_equals_alone(server, engine):
    """Eight clients at once, each with its own prompt (a shared head among them: the prefix
    cache): every answer equals that prompt alone through the engine."""
    rng = np.random.default_rng(5)
    head = list(map(int, rng.integers(0, 260, 40)))
    prompts = [head + list(map(int, rng.integers(0, 260, k))) for k in (1, 3, 9, 20)] + [
        list(map(int, rng.integers(0, 260, n))) for n in (2, 30, 90, 130)
    ]
    want = engine_logprobs(engine, prompts)
    got = [None] * len(prompts)

    def one(i):
        got[i] = _post(
            server,
            "/v1/completions",
            {"prompt": prompts[i], "echo": True, "logprobs": 2, "max_tokens": 0},
        ).json()

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_allclose(
            g["choices"][0]["logprobs"]["token_logprobs"][1:], w, rtol=0, atol=F64
        )
    m = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    hits = float(
        next(
            line.split()[1]
            for line in m.splitlines()
            if line.startswith("minfer_prefix_cache_hits_total")
        )
    )
    assert hits >= 1
    # the engine thread's time by phase: the forwards ran, and the phases account for them
    eng = {
        line.split('"')[1]: float(line.split()[1])
        for line in m.splitlines()
        if line.startswith("minfer_engine_seconds_total{")
    }
    assert set(eng) == {"schedule", "forward", "hand", "idle"}
    assert eng["forward"] > 0 and min(eng.values()) >= 0


def test_chat_stream_equals_chat(client):
    msgs = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(
        model="small-chat", messages=msgs, max_tokens=8, logprobs=True, top_logprobs=2
    )
    c = whole.choices[0]
    assert (
        c.message.role == "assistant" and len(c.logprobs.content) == whole.usage.completion_tokens
    )
    assert all(len(e.top_logprobs) == 2 for e in c.logprobs.content)
    parts, reasons = [], []
    for chunk in client.chat.completions.create(
        model="small-chat",
        messages=msgs,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            reasons.append(ch.finish_reason)
        if chunk.usage:
            assert chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(parts) == c.message.content
    assert reasons[-1] == c.finish_reason and reasons[:-1] == [None] * (len(reasons) - 1)


def test_completion_stream_and_stop(client):
    whole = client.completions.create(
        model="small-chat", prompt=PROMPTS[0], max_tokens=10, extra_body={"ignore_eos": True}
    )
    text = whole.choices[0].text
    got = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model="small-chat",
            prompt=PROMPTS[0],
            max_tokens=10,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        if ch.choices
    )
    assert got == text
    if len(text) > 4:  # a stop string from the answer itself cuts it there
        stop = text[2:4]
        cut = client.completions.create(
            model="small-chat",
            prompt=PROMPTS[0],
            max_tokens=10,
            stop=[stop],
            extra_body={"ignore_eos": True},
        )
        assert cut.choices[0].text == text[: text.find(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_tokenizer_endpoints(server, engine):
    r = _post(server, "/tokenize", {"prompt": "hello there", "add_special_tokens": False}).json()
    assert r["tokens"] == list(map(int, engine.tok.encode("hello there", add_bos=False)))
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 512
    d = _post(server, "/detokenize", {"tokens": r["tokens"]}).json()
    assert d["prompt"] == "hello there"
    info = httpx.get(
        server.url + "/tokenizer_info", headers={"Authorization": f"Bearer {KEY}"}
    ).json()
    assert "eos_token" in info and info["chat_template"].startswith("{% for m")
    ms = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert ms["data"][0]["id"] == "small-chat"


@pytest.mark.parametrize(
    "body,status,param",
    [
        (b"{not json", 400, None),
        (b'{"prompt": "a", "prompt": "b"}', 400, None),
        ({"prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
        ({"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": "a", "max_tokens": True}, 400, "max_tokens"),
        ({"prompt": [1, 2.5]}, 400, "prompt"),
        ({"prompt": [1, True]}, 400, "prompt"),
        ({"prompt": [1, 260]}, 400, "prompt"),
        ({"prompt": [-1]}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": "a" * 600}, 400, "prompt"),
        ({"prompt": "a", "max_tokens": 600}, 400, "max_tokens"),
        ({"prompt": ["a"] * 10_000}, 400, "prompt"),
        ({"prompt": "a", "temperature": 0.8}, 400, "temperature"),
        ({"prompt": "a", "n": 2}, 400, "n"),
        ({"prompt": "a", "logprobs": 21}, 400, "logprobs"),
        ({"prompt": "a", "model": "gpt-4"}, 404, "model"),
        ({"max_tokens": 1}, 400, "prompt"),
        (b'{"prompt": "\\ud800"}', 400, "prompt"),
    ],
)
def test_bad_requests(server, body, status, param):
    if isinstance(body, bytes):
        r = _post(server, "/v1/completions", raw=body, headers={"Content-Type": "application/json"})
    else:
        r = _post(server, "/v1/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    assert "Traceback" not in r.text


def test_limits_keys_and_routes(server):
    big = {"prompt": "a" * 70_000}
    assert _post(server, "/v1/completions", big).status_code == 413
    for path in ("/v1/completions", "/tokenize", "/v1/chat/completions"):
        for key in (None, "wrong"):
            r = _post(server, path, {"prompt": "a"}, key=key)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for path in ("/v1/models", "/metrics", "/tokenizer_info"):
        assert httpx.get(server.url + path).status_code == 401
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # open
    r = httpx.get(server.url + "/nope", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405


def test_a_client_that_vanishes_mid_stream(server, client):
    body = json.dumps(
        {"prompt": "x", "max_tokens": 400, "stream": True, "extra": 1, "ignore_eos": True}
    ).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    assert b"200 OK" in s.recv(4096)
    s.close()  # gone mid-stream: its sequence is cancelled
    r = client.completions.create(model="small-chat", prompt="still there?", max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_port_in_use_is_one_error_line(model, server):
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
            "--port",
            str(server.port),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert (
        p.stderr.startswith("error: cannot listen on 127.0.0.1:") and p.stderr.count("\n") == 1
    ), p.stderr


def test_queue_full_is_429_and_drain_finishes_in_flight(model):
    s = Server(model, "--max-queue", "1", "--max-batch-tokens", "16")
    try:
        body = {"prompt": ["a b c d"] * 2, "max_tokens": 1}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        # in flight at SIGTERM: each finishes (200), then the process exits 0
        out = []

        def one():
            out.append(
                httpx.post(
                    s.url + "/v1/completions",
                    json={"prompt": "a b c", "max_tokens": 40, "ignore_eos": True},
                    timeout=60,
                )
            )

        ts = [threading.Thread(target=one) for _ in range(3)]
        for t in ts:
            t.start()
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join()
        assert s.proc.wait(60) == 0
        assert all(r.status_code in (200, 429, 503) for r in out)
        assert any(
            r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40 for r in out
        )
    finally:
        s.stop()


def test_the_listening_socket_gives_answers_tcp_nodelay():
    """Without TCP_NODELAY an answer's second segment waits for the client's delayed ACK
    (~40 ms a request on loopback); asyncio sets it only on sockets made as IPPROTO_TCP."""
    import asyncio

    from minfer.serve.start import bind as _bind

    sock = _bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    seen = []

    async def main():
        def on_conn(reader, writer):
            s = writer.get_extra_info("socket")
            seen.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_conn, sock=sock)
        async with server:
            _, w = await asyncio.open_connection(*sock.getsockname()[:2])
            await asyncio.sleep(0.2)
            w.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
