"""Engine.embed / score / rerank (issue 52) on the CPU reference in float64 against the
reference forward itself: an embedding is the lone prompt's final-normed hidden state (last
row, mean of rows, row 0), cut and L2-normalised; a score is the softmax over the labels of the
full logits (window_logits) at the prompt's last row, or their full-vocabulary probabilities;
a relevance is sigmoid(yes - no) of those logits under the rerank template. Then the
pooling key as llama.cpp's converter writes it, the shared query prefix, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from pooling_helpers import qwen3_pooling_model

from minfer.errors import BadInput

TOL = 1e-6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("poolapi")


@pytest.fixture(scope="module")
def engine(folder):
    from minfer.engine.api import Engine

    return Engine(str(qwen3_pooling_model(folder)), backend="cpu", dtype="f64")


def _rows(engine, ids):
    """Every row's final-normed hidden state [n, d] of ids alone (the reference's packed)."""
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(engine.model, dtype=np.float64)
    be.reserve_slots(len(ids))
    n = len(ids)
    tok = np.stack([np.arange(n), np.zeros(n, int)], 1)
    return be.packed(ids, tok, [], [], hidden=np.arange(n))[1].astype(np.float64)


def _logits(engine, ids):
    from minfer.reference.forward import ReferenceBackend

    return (
        ReferenceBackend(engine.model, dtype=np.float64)
        .window_logits(np.asarray(ids), len(ids) - 1)[0]
        .astype(np.float64)
    )


def test_embed_pools_the_final_hidden_states(engine):
    texts = ["The quick brown fox", "jumps over the lazy dog, twice.", "a"]
    for pooling, pick in (
        ("last", lambda h: h[-1]),
        ("mean", lambda h: h.mean(0)),
        ("cls", lambda h: h[0]),
    ):
        got = engine.embed(texts, pooling=pooling)
        assert got.shape == (3, engine.model.config.d_model) and got.dtype == np.float32
        for t, g in zip(texts, got):
            v = pick(_rows(engine, engine.tok.encode(t, parse_special=True)))
            assert np.allclose(g, v / np.linalg.norm(v), atol=TOL), pooling
    # Matryoshka: cut first, then normalised; normalize=False: the raw pooled state
    v = _rows(engine, engine.tok.encode(texts[0], parse_special=True))[-1]
    cut = engine.embed(texts[0], dimensions=16)[0]
    assert cut.shape == (16,) and np.allclose(cut, v[:16] / np.linalg.norm(v[:16]), atol=TOL)
    assert np.allclose(engine.embed([texts[0]], normalize=False)[0], v, atol=1e-5)
    # token ids in, the same numbers
    ids = engine.tok.encode(texts[1], parse_special=True)
    assert np.allclose(engine.embed([ids])[0], engine.embed(texts[1])[0], atol=TOL)


def test_the_gguf_pooling_key_chooses(folder):
    from minfer.batch.pooling import model_pooling
    from minfer.engine.api import Engine

    for key, name in (
        (1, "mean"),
        (2, "cls"),
        (3, "last"),
        (4, "last"),
        (0, "last"),
        (None, "last"),
    ):
        p = qwen3_pooling_model(folder, key, name=f"k{key}.gguf")
        e = Engine(str(p), backend="cpu", dtype="f64")
        assert model_pooling(e.model)[0] == name
        if key in (1, 2):
            assert np.allclose(e.embed("hello there"), e.embed("hello there", pooling=name))
            assert not np.allclose(e.embed("hello there"), e.embed("hello there", pooling="last"))


def test_score_is_the_label_tokens_share(engine):
    labels = [1020, 1021, 7]
    q, items = "Is the sky blue? Answer:", [" yes", " no", " it is"]
    soft = engine.score(q, items, labels, apply_softmax=True)
    full = engine.score(q, items, labels)
    first = engine.score(q, items, labels, apply_softmax=True, item_first=True)
    for i, it in enumerate(items):
        lg = _logits(engine, engine.tok.encode(q + it, parse_special=True, add_eos=False))
        e = np.exp(lg[labels] - lg[labels].max())
        assert np.allclose(soft[i], e / e.sum(), atol=TOL)
        lp = lg - (np.log(np.exp(lg - lg.max()).sum()) + lg.max())
        assert np.allclose(full[i], np.exp(lp[labels]), atol=TOL)
        lg = _logits(engine, engine.tok.encode(it + q, parse_special=True, add_eos=False))
        e = np.exp(lg[labels] - lg[labels].max())
        assert np.allclose(first[i], e / e.sum(), atol=TOL)
    # token id lists: joined as ids
    qi, ii = [5, 6, 7], [[8, 9], [10]]
    got = engine.score(qi, ii, labels, apply_softmax=True)
    lg = _logits(engine, qi + ii[0])
    e = np.exp(lg[labels] - lg[labels].max())
    assert np.allclose(got[0], e / e.sum(), atol=TOL)


def test_rerank_is_yes_against_no_under_the_template(engine):
    from minfer.batch.pooling import QWEN3_RERANK

    q = "what color is the sky"
    docs = ["The sky is blue.", "Bananas are yellow.", "Clouds are white and the sky blue."]
    res = engine.rerank(q, docs)
    assert [r["index"] for r in res] == sorted(
        range(3), key=lambda i: -res[[r["index"] for r in res].index(i)]["relevance_score"]
    )
    for r in res:
        text = QWEN3_RERANK.replace("{query}", q).replace("{document}", docs[r["index"]])
        lg = _logits(engine, engine.tok.encode(text, parse_special=True, add_eos=False))
        want = 1 / (1 + np.exp(-(lg[1020] - lg[1021])))
        assert abs(r["relevance_score"] - want) < TOL and r["document"] == docs[r["index"]]
    assert [r["index"] for r in engine.rerank(q, docs, top_n=2)] == [r["index"] for r in res[:2]]
    own = engine.rerank(q, docs, template="Q: {query}\nD: {document}\nRelevant:")
    assert [r["relevance_score"] for r in own] != [r["relevance_score"] for r in res]


def test_rerank_documents_share_the_query_prefix(engine, monkeypatch):
    """The documents' common head (the template and the query) is computed once: the
    scheduler copies it (copy_kv) into the others, and the scores equal those computed alone."""
    from minfer.batch import jobs

    docs = [f"document number {i} says something" for i in range(6)]
    q = "a fairly long query so that the shared prefix is well past sixteen tokens"
    alone = [engine.rerank(q, [d])[0]["relevance_score"] for d in docs]
    copies = []
    real = jobs.run_pooled

    def spy(eng, *a, **kw):
        be = eng.backend
        orig = be.copy_kv
        be.copy_kv = lambda s, d, n: (copies.append(n), orig(s, d, n))
        try:
            return real(eng, *a, **kw)
        finally:
            be.copy_kv = orig

    monkeypatch.setattr(jobs, "run_pooled", spy)
    res = engine.rerank(q, docs)
    assert len(copies) == 5 and min(copies) > 40  # 5 followers, the template + the query
    got = {r["index"]: r["relevance_score"] for r in res}
    assert np.allclose([got[i] for i in range(6)], alone, atol=1e-9)


@pytest.mark.parametrize(
    "call,msg",
    [
        (lambda e: e.embed([""]), "empty"),
        (lambda e: e.embed([]), None),
        (lambda e: e.embed(["x"], dimensions=10**6), "dimensions must be"),
        (lambda e: e.embed(["x"], dimensions=0), "dimensions must be"),
        (lambda e: e.embed(["x"], pooling="max"), "pooling must be"),
        (lambda e: e.embed([[1, 10**6]]), "out of range"),
        (lambda e: e.score("q", ["a"], [10**6]), "label id"),
        (lambda e: e.score("q", ["a"], []), "label_token_ids"),
        (lambda e: e.score("q", [], [1]), "items is empty"),
        (lambda e: e.score("q", [[1]], [1]), "both be text"),
        (lambda e: e.rerank("q", []), "0 documents"),
        (lambda e: e.rerank("q", ["a"], top_n=0), "top_n"),
        (lambda e: e.rerank("q", ["a"], template="no placeholders"), "has no"),
    ],
)
def test_bad_arguments(engine, call, msg):
    if msg is None:
        assert call(engine).shape == (0, engine.model.config.d_model)
        return
    with pytest.raises(BadInput, match=msg):
        call(engine)


def test_cli_embed_jsonl_and_npy(engine, folder, tmp_path):
    import json
    import subprocess
    import sys

    m = str(engine.model.path)
    src = tmp_path / "p.jsonl"
    src.write_text('"The quick brown fox"\n{"prompt": "a b", "id": "x"}\n{"prompt": [5, 6]}\n')
    want = engine.embed(["The quick brown fox", "a b", [5, 6]], dimensions=32)

    def run(*a):
        cmd = [sys.executable, "-m", "minfer", "embed", "-m", m, "--prompts", str(src)]
        return subprocess.run([*cmd, "--backend", "cpu", *a], capture_output=True, text=True)

    r = run("--dimensions", "32")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == [0, "x", 2]
    assert np.allclose([x["embedding"] for x in recs], want, atol=1e-4)  # f32 vs f64
    r = run("--dimensions", "32", "-o", str(tmp_path / "e.npy"), "--timing")
    assert r.returncode == 0 and "tok/s" in r.stderr
    assert np.allclose(np.load(tmp_path / "e.npy"), want, atol=1e-4)
    r = run("--dimensions", "100000")
    assert r.returncode == 2 and r.stderr.startswith("error: dimensions must be")


def test_the_jobs_reach_the_backend_through_the_gpu_entry(engine, monkeypatch):
    """embed, score and rerank run their forwards through Engine.pooled, which enters the GPU's
    context on the calling thread (an Engine built on one thread and called on another failed
    on an H100 with "invalid device context" in embed, which called the scheduler itself)."""
    from minfer.engine import api

    assert api.Engine.pooled.__wrapped__  # decorated with _on_gpu_thread
    calls, real = [], api.Engine.pooled

    def spy(self, *a, **kw):
        calls.append(len(a[0]))
        return real(self, *a, **kw)

    monkeypatch.setattr(api.Engine, "pooled", spy)
    engine.embed(["a b"])
    engine.score("q", [" x"], [5, 6])
    engine.rerank("q", ["d"])
    assert calls == [1, 1, 1]  # one forward each, of its one prompt
