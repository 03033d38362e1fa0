"""Schema fuzzing in CI: a bounded sample of scripts/serve_fuzz.py's campaign (schemathesis
over GET /openapi.json, every operation, schema-valid and schema-breaking requests): no 5xx,
no answer that breaks the document, /health after each batch. The full run (>= 5,000
requests) is the script; its counts are in docs/serve.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("schemathesis")

from serve_helpers import Server, small_chat_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import serve_fuzz  # noqa: E402


def test_schema_fuzzing_sample(tmp_path):
    s = Server(
        small_chat_model(tmp_path, n_ctx=64),
        "--api-key",
        serve_fuzz.KEY,
        "--max-body",
        "65536",
        "--max-batch-tokens",
        "64",
    )
    try:
        out = serve_fuzz.campaign(
            s.url, serve_fuzz.KEY, examples=12, log=lambda *a: None, derandomize=True
        )
    finally:
        assert s.stop() == 0
    assert out["operations"] >= 8 and out["requests"] >= 150
    assert not [k for k in out["statuses"] if k >= 500], out["statuses"]
    assert out["failures"] == [], out["failures"][:3]
    assert out["statuses"][200] > 0 and out["statuses"][400] > 0 and out["statuses"][401] > 0


def test_the_document_has_every_route_and_body(tmp_path):
    from fastapi import FastAPI

    from minfer.serve.schema import openapi

    app = FastAPI()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        app.post(path)(lambda: None)
    doc = openapi(app, 260, "m")
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        op = doc["paths"][path]["post"]
        assert "requestBody" in op and {"200", "400", "401", "413"} <= set(op["responses"])
    tid = doc["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert tid["minimum"] == 0 and tid["maximum"] == 259
