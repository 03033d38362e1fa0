"""`minfer serve --backend cuda`: a non-finite number in one request of a batch (a model whose
embedding row for one token id is NaN) fails that request alone with the layer probe's error
(500 engine_error naming where the residual first went non-finite); the others' answers
equal each prompt alone through Engine.prefill on the same GPU path."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import CHATML, Server  # noqa: E402

pytestmark = pytest.mark.gpu
BAD_ID = 200


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    from synth_data import small_parts, write_small

    meta, tensors = small_parts(
        seed=3, tied=False, d_model=128, d_ff=256, n_heads=2, n_kv_heads=1
    )  # head_dim 64, untied: the output stays finite
    meta["tokenizer.chat_template"] = CHATML
    name, q, shape, data = tensors[0]
    data = np.array(data, copy=True)
    data[BAD_ID] = np.nan
    tensors[0] = (name, q, shape, data)
    return write_small(tmp_path_factory.mktemp("nan") / "poisoned.gguf", meta, tensors)


def test_a_nan_in_one_request_of_a_batch(poisoned):
    from minfer.engine.api import Engine

    prompts = [[1, 5, 9, 14], [3, 1, BAD_ID, 7], [2, 2, 40, 41, 42], [9, 8], [BAD_ID, 4]]
    eng = Engine(str(poisoned), backend="cuda")
    want = {i: eng.prefill([prompts[i]], n_predict=4)[0].text for i in (0, 2, 3)}
    eng.close()
    s = Server(poisoned, backend="cuda")
    try:
        out = [None] * len(prompts)

        def one(i):
            out[i] = httpx.post(
                s.url + "/v1/completions",
                json={"prompt": prompts[i], "max_tokens": 4, "ignore_eos": True},
                timeout=120,
            )

        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i in (1, 4):
            err = out[i].json()["error"]
            assert out[i].status_code == 500 and err["code"] == "engine_error", out[i].text
            assert "non-finite" in err["message"] and "first non-finite" in err["message"]
        for i, text in want.items():
            assert out[i].status_code == 200 and out[i].json()["choices"][0]["text"] == text
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0
