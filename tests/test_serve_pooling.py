"""`minfer serve`'s prefill-only endpoints (issue 52) through real clients, on the CPU
reference in float64 with the tiny qwen3 model carrying `qwen3.pooling_type` as llama.cpp's
converter writes it: /v1/embeddings (the openai client's embeddings.create, base64,
dimensions), /v1/score (SGLang's shape), /v1/rerank and its aliases (Jina's shape), each equal
to Engine.embed / score / rerank; a busy batch of documents equals each alone; the documented
400s. The server is a subprocess on 127.0.0.1 (tests/serve_helpers.py)."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from pooling_helpers import qwen3_pooling_model  # noqa: E402
from serve_helpers import Server  # noqa: E402

TOL = 1e-9  # f64 reference: a request in a busy batch equals itself alone (summation order)
TEXTS = ["The quick brown fox", "jumps over the lazy dog", "a"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return qwen3_pooling_model(tmp_path_factory.mktemp("servepool"), pooling=1)  # mean


@pytest.fixture(scope="module")
def engine(model):
    from minfer.engine.api import Engine

    return Engine(str(model), backend="cpu", dtype="f64")


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, "--dtype", "f64", "--max-batch-tokens", "64")
    yield s
    assert s.stop() == 0


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_client_embeddings_equal_the_engine(server, engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.embeddings.create(model="qwen3-pool", input=TEXTS)
    got = np.array([d.embedding for d in r.data])
    want = engine.embed(TEXTS)  # the GGUF's key: mean pooling
    assert np.allclose(got, want, atol=TOL) and [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(
        len(engine.tok.encode(t, parse_special=True)) for t in TEXTS
    )
    assert np.allclose(np.linalg.norm(got, axis=1), 1)
    one = client.embeddings.create(model="qwen3-pool", input="a", dimensions=8)
    assert np.allclose(one.data[0].embedding, engine.embed("a", dimensions=8)[0], atol=TOL)
    # base64 (what the openai client asks for by default when it decodes itself)
    raw = _post(server, "/v1/embeddings", {"input": [[5, 6, 7]], "encoding_format": "base64"})
    v = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), "<f4")
    assert np.allclose(v, engine.embed([[5, 6, 7]])[0], atol=1e-7)


def test_score_equals_the_engine(server, engine):
    body = {
        "query": "Is the sky blue? Answer:",
        "items": [" yes", " no"],
        "label_token_ids": [1020, 1021],
    }
    for extra in ({}, {"apply_softmax": True}, {"item_first": True}):
        r = _post(server, "/v1/score", {**body, **extra}).json()
        want = engine.score(
            body["query"],
            body["items"],
            body["label_token_ids"],
            apply_softmax=extra.get("apply_softmax", False),
            item_first=extra.get("item_first", False),
        )
        assert r["object"] == "scoring" and np.allclose(r["scores"], want, atol=TOL)
    r = _post(
        server,
        "/v1/score",
        {"query": [5, 6], "items": [[7], [8, 9]], "label_token_ids": [3], "apply_softmax": True},
    ).json()
    assert r["scores"] == [[1.0], [1.0]]


def test_rerank_equals_the_engine_on_every_alias(server, engine):
    q = "what color is the sky"
    docs = ["The sky is blue.", "Bananas are yellow.", {"text": "Clouds are white."}]
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    want = engine.rerank(q, texts, top_n=2)
    for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
        r = _post(server, path, {"query": q, "documents": docs, "top_n": 2}).json()
        assert [x["index"] for x in r["results"]] == [w["index"] for w in want]
        assert np.allclose(
            [x["relevance_score"] for x in r["results"]],
            [w["relevance_score"] for w in want],
            atol=TOL,
        )
        assert r["results"][0]["document"] == {"text": texts[want[0]["index"]]}
    r = _post(
        server, "/v1/rerank", {"query": q, "documents": texts, "return_documents": False}
    ).json()
    assert len(r["results"]) == 3 and "document" not in r["results"][0]


def test_a_busy_batch_of_documents_equals_each_alone(server):
    """Rerank requests of one query in parallel with embeddings: continuous batching and the
    query's prefix shared across requests, the same numbers as each request alone."""
    q = "a fairly long query so that the shared prefix is well past sixteen tokens"
    docs = [f"document {i} has words" for i in range(8)]
    alone = [
        _post(server, "/v1/rerank", {"query": q, "documents": [d]}).json()["results"][0][
            "relevance_score"
        ]
        for d in docs
    ]
    got = [None] * len(docs)

    def go(i):
        got[i] = _post(server, "/v1/rerank", {"query": q, "documents": [docs[i]]}).json()

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(docs))]
    ts.append(
        threading.Thread(target=lambda: _post(server, "/v1/embeddings", {"input": TEXTS * 3}))
    )
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert np.allclose([g["results"][0]["relevance_score"] for g in got], alone, atol=TOL)


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/embeddings", {"input": ""}, "input"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {}, "input"),
        ("/v1/embeddings", {"input": "a", "dimensions": 10**6}, "dimensions"),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": [[1, 10**6]]}, "input[0]"),
        ("/v1/embeddings", {"input": ["a", 1]}, "input"),
        (
            "/v1/score",
            {"query": "q", "items": ["a"], "label_token_ids": [10**6]},
            "label_token_ids",
        ),
        ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids"),
        ("/v1/score", {"query": "q", "items": [], "label_token_ids": [1]}, "items"),
        ("/v1/score", {"query": "q", "items": [[1]], "label_token_ids": [1]}, "items"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": [3]}, "documents"),
        ("/rerank", {"documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ],
)
def test_bad_requests_are_400(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param, e
