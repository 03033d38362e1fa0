"""GPU: an Engine built and prepared on one thread and called on another (Ray Data's actors: the
constructor on one thread, the batches on another, which failed on an H100 with "invalid device
context" once `--ray` planned the actors' KV cache in the constructor). The records equal the
same engine's on the thread that made it."""

from __future__ import annotations

import pytest
from helpers import on_thread as _on_thread

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from synth_data import tiny_model

    return str(tiny_model(tmp_path_factory.mktemp("synth"), seed=11, workers=None))


def test_predictor_made_here_called_on_another_thread(model_path):
    import numpy as np

    from minfer.engine.api import kv_plan
    from minfer.engine.ray.predictor import MinferPredictor

    rng = np.random.default_rng(3)
    ids = [rng.integers(1, 200, int(n)).astype(np.int32) for n in (5, 40, 17, 90)]
    batch = {"ids": [a.tobytes() for a in ids], "index": np.arange(len(ids))}
    p = MinferPredictor(
        model_path, backend="cuda", n_predict=4, kv_for=kv_plan([len(a) for a in ids], 4)
    )
    here = p(batch)["record"]
    there = _on_thread(lambda: p(batch)["record"])
    assert list(there) == list(here)


def test_engine_built_on_a_thread_runs_on_the_main_one(model_path):
    from minfer.engine.api import Engine

    eng = _on_thread(lambda: Engine(model_path, backend="cuda"))
    a = _on_thread(lambda: [r.tokens for r in eng.prefill(["a b c", "d e f g"], n_predict=4)])
    b = [r.tokens for r in eng.prefill(["a b c", "d e f g"], n_predict=4)]
    assert a == b
    emb = _on_thread(lambda: eng.embed(["a b c"]))
    assert emb.shape[0] == 1
