"""Hand-made hostile requests against `minfer serve` (docs/serve.md, Reliability): bodies past
the limit, a chunked upload that never ends, slow heads, headers too large, JSON nested
100,000 deep, 10 MB strings, bad token ids, lone surrogates, invalid UTF-8, duplicate keys,
keys and model names that are wrong. Each answer is one error object (or a closed
connection where no request could be read), and the server answers /health after each."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import Server, small_chat_model  # noqa: E402

KEY = "sk-hostile"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 12 << 20  # room for a 10 MB string
READ = 2.0  # --read-timeout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(
        small_chat_model(tmp_path_factory.mktemp("hostile")),
        "--api-key",
        KEY,
        "--max-body",
        str(LIMIT),
        "--read-timeout",
        str(READ),
    )
    yield s
    assert s.stop() == 0
    assert not any("Traceback" in x or "internal error" in x for x in s.lines), s.lines


@pytest.fixture(autouse=True)
def alive(server):
    yield
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def _post(server, path, body=None, raw=None, key=KEY):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    return httpx.post(server.url + path, json=body, content=raw, headers=h, timeout=60)


def _error(r, status, param="any"):
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "any":
        assert err["param"] == param, err
    return err


def _sock(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return s


def _head(path="/v1/completions", extra=b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\n"
    ).encode() + extra


def _read_all(s: socket.socket, limit: float = 30) -> bytes:
    s.settimeout(limit)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
    except (ConnectionResetError, socket.timeout):
        return out


# -- bodies past the limit, bodies that never end, heads that never end ---------------------------
def test_a_declared_length_past_the_limit_is_refused_unread(server):
    s = _sock(server)
    s.sendall(_head(extra=b"Content-Length: 100000000\r\n\r\n"))  # no body follows
    t0 = time.monotonic()
    out = _read_all(s, 10)
    assert out.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 5
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"


def test_a_chunked_body_past_the_limit_is_cut_at_the_limit(server):
    s = _sock(server)
    s.sendall(_head(extra=b"Transfer-Encoding: chunked\r\n\r\n"))
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    sent = 0
    try:
        while sent < 4 * LIMIT:  # never ends by itself: the server must stop it
            s.sendall(chunk)
            sent += 1 << 20
    except (BrokenPipeError, ConnectionResetError):
        pass
    out = _read_all(s, 10)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert sent < 4 * LIMIT or out  # refused before the sender gave up


def test_a_chunked_upload_that_never_ends_times_out(server):
    s = _sock(server)
    s.sendall(_head(extra=b"Transfer-Encoding: chunked\r\n\r\n") + b"1\r\n{\r\n")
    t0 = time.monotonic()
    s.settimeout(0.5)
    out = b""
    while time.monotonic() - t0 < READ + 10 and not out:
        try:
            s.sendall(b"1\r\n \r\n")  # a byte of whitespace every half second, forever
            out = s.recv(65536)
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    assert READ - 0.5 < time.monotonic() - t0 < READ + 5
    out += _read_all(s, 10)  # the head and the body may come in two reads
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("trickle", [b"", b"X-Slow: a"])
def test_a_head_that_never_ends_is_closed(server, trickle):
    """Slowloris: a connection that sends nothing, or a header a byte at a time."""
    s = _sock(server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" if trickle else b"")
    t0 = time.monotonic()
    s.settimeout(0.5)
    closed = False
    while time.monotonic() - t0 < READ + 10:
        try:
            if trickle:
                s.sendall(trickle[:1])
            if s.recv(1024) == b"":
                closed = True
                break
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
    assert closed and READ - 0.5 < time.monotonic() - t0 < READ + 5


@pytest.mark.parametrize(
    "head, status, code",
    [
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n",
            431,
            "request_header_fields_too_large",
        ),
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n",
            431,
            "request_header_fields_too_large",
        ),
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n",
            431,
            "request_header_fields_too_large",
        ),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "invalid_http_request"),
        (b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n", 400, "invalid_http_request"),
    ],
    ids=[
        "a 200 KB header",
        "a 4 MB header",
        "20,000 headers",
        "no request line",
        "a header line without colon",
    ],
)
def test_heads_uvicorn_cannot_parse_get_an_error_object(server, head, status, code):
    """uvicorn answers these before the app: the answer is still OpenAI's error object."""
    s = _sock(server)
    try:
        s.sendall(head)
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered and closed while the rest was still being sent
    out = _read_all(s, 10)
    head_out, _, body = out.partition(b"\r\n\r\n")
    assert head_out.startswith(b"HTTP/1.1 %d " % status), out[:300]
    assert b"content-type: application/json" in head_out.lower()
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code and err["type"] == "invalid_request_error"


def test_a_client_gone_mid_body_is_no_error(server):
    s = _sock(server)
    s.sendall(_head(extra=b"Content-Length: 1000\r\n\r\n") + b'{"prompt": "a')
    time.sleep(0.3)
    s.close()
    time.sleep(0.5)
    m = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'endpoint="/v1/completions",status="499"' in m


# -- bodies that parse badly ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    # short ids: pytest puts the test's id in PYTEST_CURRENT_TEST, and a server started under
    # a 200 KB id would inherit an environment exec refuses (E2BIG)
    ids=["arrays", "objects", "prompt"],
)
def test_json_nested_100000_deep(server, raw):
    for path in ("/v1/completions", "/tokenize", "/v1/chat/completions", "/detokenize"):
        assert "nested too deeply" in _error(_post(server, path, raw=raw), 400)["message"]


@pytest.mark.parametrize(
    "raw,what",
    [
        (b'{"prompt": "\xff\xfe"}', "not UTF-8"),
        (b'{"prompt": "a", "prompt": "b"}', "duplicate"),
        (b'{"messages": [{"role": "user", "role": "x", "content": "a"}]}', "duplicate"),
        (b'{"prompt": NaN}', "not a JSON number"),
        (b'{"prompt": "a"', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'"a"', "must be a JSON object"),
    ],
)
def test_bodies_that_are_not_json_objects(server, raw, what):
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        assert what in _error(_post(server, path, raw=raw), 400)["message"]


def test_a_documented_field_is_checked_beside_another(server):
    # schema fuzzing's case (negative mode, reduced): a "prompt" the document calls invalid
    # beside valid "messages" was ignored (200)
    body = {"prompt": {"a": [None]}, "messages": [{"role": "0"}]}
    _error(_post(server, "/tokenize", body), 400, "prompt")


def test_10_mb_strings(server):
    big = "a" * 10_000_000
    t0 = time.monotonic()
    err = _error(_post(server, "/v1/completions", {"prompt": big, "max_tokens": 1}), 400, "prompt")
    assert "characters" in err["message"]
    _error(
        _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": big}]}),
        400,
        "messages",
    )
    _error(_post(server, "/tokenize", {"prompt": big}), 400, "prompt")
    _error(_post(server, "/v1/completions", {"prompt": [big[:5000]] * 1000}), 400, "prompt")
    assert time.monotonic() - t0 < 20  # refused before tokenizing (~15 s for one here)
    r = _post(server, "/v1/completions", {"prompt": "a", "max_tokens": 1, "x": big})
    assert r.status_code == 200  # an unknown field is ignored, however long


# -- fields that are wrong ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids",
    [
        [260],
        [-1],
        [1.0],
        [2.5],
        [True],
        [False],
        [10**30],
        [-(10**30)],
        [1, None],
        [1, {}],
        [1, "a"],
        [1, [1]],
    ],
)
def test_token_ids_out_of_range_or_not_integers(server, ids):
    _error(_post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1}), 400, "prompt")
    _error(_post(server, "/v1/completions", {"prompt": [[1, 2], ids], "max_tokens": 1}), 400)
    _error(_post(server, "/detokenize", {"tokens": ids}), 400, "tokens")


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "\ud800"}),
        ("/v1/completions", {"prompt": ["ok", "a\udfffb"]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udc00"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "\ud800", "content": "a"}]}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        ),
        ("/tokenize", {"prompt": "\ud83d"}),
    ],
)
def test_lone_surrogates(server, path, body):
    raw = json.dumps(body).encode()  # ensure_ascii: the lone surrogate as a \\uXXXX escape
    assert b"\\ud" in raw or b"\\udc" in raw
    err = _error(_post(server, path, raw=raw), 400)
    assert (
        "Unicode" in err["message"] or "UTF-8" in err["message"] or "surrogate" in err["message"]
    ), err


def test_lone_surrogates_where_no_text_is_tokenized(server):
    raw = b'{"prompt": "a", "max_tokens": 2, "stop": ["\\ud800"], "user": "\\udfff"}'
    assert _post(server, "/v1/completions", raw=raw).status_code == 200
    err = _error(
        _post(server, "/v1/completions", raw=b'{"prompt": "a", "model": "\\ud800"}'), 404, "model"
    )
    assert err["code"] == "model_not_found"


def test_the_api_key_on_every_endpoint(server):
    routes = [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("GET", "/tokenizer_info"),
        ("GET", "/openapi.json"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/nope"),
        ("DELETE", "/v1/completions"),
    ]
    for method, path in routes:
        for h in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": KEY},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": f"Bearer {KEY}x"},
        ):
            r = httpx.request(method, server.url + path, headers=h, json={"prompt": "a"})
            assert _error(r, 401)["code"] == "invalid_api_key", (method, path, h)
        r = httpx.request(
            method,
            server.url + path,
            headers=AUTH,
            json={
                "prompt": "a",
                "tokens": [1],
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "a"}],
            },
        )
        assert r.status_code == (404 if path == "/nope" else 405 if method == "DELETE" else 200), (
            method,
            path,
            r.text[:200],
        )
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # the one open route


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
)
@pytest.mark.parametrize("model", ["gpt-4", "small-chat ", "SMALL-CHAT", ""])
def test_a_model_that_is_not_the_served_one(server, path, model):
    body = {
        "model": model,
        "prompt": "a",
        "tokens": [1],
        "messages": [{"role": "user", "content": "a"}],
    }
    assert _error(_post(server, path, body), 404, "model")["code"] == "model_not_found"


def test_chat_past_the_context_without_max_tokens(server):
    """Found by the schema fuzzing: max_tokens defaulted to context - prompt went negative, so
    a prompt past the context reached the engine (an error from the forward)."""
    msgs = [{"role": "user", "content": "a " * 400}]
    err = _error(_post(server, "/v1/chat/completions", {"messages": msgs}), 400, "prompt")
    assert "maximum context length" in err["message"]


def test_tokenize_checks_add_generation_prompt_for_a_prompt_too(server):
    """Found by the schema fuzzing: a known field of the wrong type was ignored."""
    _error(
        _post(server, "/tokenize", {"prompt": "a", "add_generation_prompt": 3.5}),
        400,
        "add_generation_prompt",
    )


def test_chat_checks_max_tokens_beside_max_completion_tokens(server):
    """Found by the schema fuzzing: max_tokens went unchecked when max_completion_tokens was
    given."""
    _error(
        _post(
            server,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "a"}],
                "max_completion_tokens": 0,
                "max_tokens": False,
            },
        ),
        400,
        "max_tokens",
    )
