"""lm-eval 0.4.13 against `minfer serve`: its local-completions model (the remote tokenizer:
/tokenizer_info, /tokenize; log-likelihoods through /v1/completions with echo, logprobs 1,
max_tokens 1) on tests/lmeval/minfer_mc.yaml, 30 questions x 4 choices. Every request's
log-likelihood must equal the engine's own (the CPU reference in float64, each prompt alone),
and the accuracy lm-eval reports the one computed from those."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("lm_eval")

from serve_helpers import Server, engine_logprobs, small_chat_model  # noqa: E402

HERE = Path(__file__).resolve().parent / "lmeval"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_chat_model(tmp_path_factory.mktemp("lmeval"), seed=2)


def _task_folder(tmp: Path) -> Path:
    d = tmp / "tasks"
    d.mkdir()
    shutil.copy(HERE / "mc.jsonl", d / "mc.jsonl")
    yaml = (
        (HERE / "minfer_mc.yaml").read_text().replace("test: mc.jsonl", f"test: {d / 'mc.jsonl'}")
    )
    (d / "minfer_mc.yaml").write_text(yaml)
    return d


def test_lm_eval_scores_through_the_server(model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import lm_eval
    from lm_eval.tasks import TaskManager

    from minfer.engine.api import Engine

    s = Server(model, "--dtype", "f64", "--served-model-name", "small")
    try:
        res = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"base_url={s.url}/v1/completions,tokenizer_backend=remote,"
            "model=small,num_concurrent=4,max_retries=1,max_length=512",
            tasks=["minfer_mc"],
            task_manager=TaskManager(include_path=str(_task_folder(tmp_path))),
            log_samples=True,
            batch_size=4,
        )
    finally:
        assert s.stop() == 0
    samples = res["samples"]["minfer_mc"]
    assert len(samples) == 30

    eng = Engine(str(model), backend="cpu", dtype="f64")
    tok = eng.tok
    correct = 0
    for smp in samples:
        lls = []
        for (context, cont), resp in zip(smp["arguments"], smp["resps"]):
            # lm-eval's _encode_pair with the remote tokenizer (no BOS): whole and context
            # encoded apart, the continuation the whole's tail
            n_sp = len(context) - len(context.rstrip())
            if n_sp:
                context, cont = context[:-n_sp], context[-n_sp:] + cont
            whole = tok.encode(context + cont, add_bos=False, parse_special=True)
            ctx = tok.encode(context, add_bos=False, parse_special=True)
            lp = engine_logprobs(eng, [whole])[0]
            ll = float(np.sum(lp[len(ctx) - 1 :]))
            got = resp[0][0]
            assert got == pytest.approx(ll, abs=1e-4), (context, cont)
            lls.append(ll)
        correct += int(np.argmax(lls) == smp["target"])
        assert smp["acc"] == float(np.argmax(lls) == smp["target"])
    acc = res["results"]["minfer_mc"]["acc,none"]
    assert math.isclose(acc, correct / 30)
