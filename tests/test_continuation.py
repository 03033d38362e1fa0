"""Scoring a continuation (issue 48, item 5): {"context", "continuation"} prompts through
Engine.prefill and `prefill --prompts`, on the CPU reference: continuation_logprob against a
plain log-probs run of the whole text, is_greedy, top log-probs against ops.row_topk over
window_logits, prompt_ids, and the boundary token of lm-eval's _encode_pair."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_inproc import error_lines, run_cli

from minfer.errors import BadInput

K = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("cont"), seed=13, vocab=384, n_ctx=256)


@pytest.fixture(scope="module")
def engine(tiny):
    from minfer.engine.api import Engine

    return Engine(str(tiny), backend="cpu", ubatch=40, threads=1)


def _pairs(vocab: int):
    """Continuations of one 30-token context (shared prefixes), of another, and short ones."""
    rng = np.random.default_rng(5)
    r = lambda n: rng.integers(0, vocab, n).tolist()  # noqa: E731
    ctx = r(30)
    return [(ctx, r(3)), (ctx, r(1)), (ctx, r(7)), (r(45), r(5)), (r(1), r(2)), (ctx[:20], r(4))]


@pytest.mark.parametrize("logprobs,share", [(False, True), (True, True), (False, False)])
def test_continuation_logprob_is_the_tail_of_a_plain_run(engine, logprobs, share):
    pairs = _pairs(engine.model.config.vocab_size)
    recs = [{"context": c, "continuation": n} for c, n in pairs]
    out = engine.prefill(
        recs, n_predict=0, logprobs=logprobs, share_prefix=share, top_logprobs=K, prompt_ids=True
    )
    whole = engine.prefill(
        [c + n for c, n in pairs], n_predict=0, logprobs=True, share_prefix=False
    )
    for (c, n), got, ref in zip(pairs, out, whole):
        assert got.n_context == len(c) and got.prompt_ids == c + n
        tail = ref.logprobs[len(c) - 1 :]
        assert got.continuation_logprob == pytest.approx(float(np.sum(tail)), abs=1e-3)
        assert len(got.top_logprobs) == (len(c) + len(n) - 1 if logprobs else len(n))
        assert (got.logprobs is not None) == logprobs


def test_is_greedy(engine):
    vocab = engine.model.config.vocab_size
    ctx = np.random.default_rng(2).integers(0, vocab, 25).tolist()
    run = engine.prefill([ctx], n_predict=4)[0]
    assert min(run.margins) > 1e-3  # no near-tie: the greedy ids are the argmax for sure
    own = run.tokens
    other = own[:-1] + [(own[-1] + 1) % vocab]
    out = engine.prefill(
        [
            {"context": ctx, "continuation": own},
            {"context": ctx, "continuation": other},
            {"context": ctx, "continuation": own[:1]},
        ],
        n_predict=0,
    )
    assert [c.is_greedy for c in out] == [True, False, True]
    # the model's own tokens are its likeliest: the greedy continuation scores higher
    assert out[0].continuation_logprob > out[1].continuation_logprob


@pytest.mark.parametrize("logprobs", [False, True])
def test_top_logprobs_are_row_topk_of_the_logits(engine, logprobs):
    from minfer.reference import ops

    pairs = _pairs(engine.model.config.vocab_size)[:4]
    out = engine.prefill(
        [{"context": c, "continuation": n} for c, n in pairs],
        n_predict=0,
        logprobs=logprobs,
        top_logprobs=K,
    )
    be = engine.backend
    for (c, n), got in zip(pairs, out):
        ids = np.array(c + n, np.int32)
        logits = be.window_logits(ids, 0)[:-1]  # [T - 1, V]: row p predicts p + 1
        lse = ops.row_stats(logits, np.full(len(logits), -1))[:, 3]
        top_ids, top_lp = ops.row_topk(logits, lse, K)
        lo = 0 if logprobs else len(c) - 1
        for row, ti, tl in zip(got.top_logprobs, top_ids[lo:], top_lp[lo:]):
            assert [t for t, _, _ in row] == ti.tolist()
            assert np.allclose([v for _, _, v in row], tl, atol=1e-3)
            assert [s for _, s, _ in row] == [engine.tok.piece(t) for t in ti]
            assert all(a >= b for a, b in zip([v for *_, v in row], [v for *_, v in row][1:]))
        # is_greedy is the top-1 of every continuation row
        greedy = [row[0][0] for row in got.top_logprobs[len(c) - 1 - lo :]]
        assert got.is_greedy == (greedy == n)


def test_text_pairs_move_the_trailing_whitespace(engine):
    out = engine.prefill(
        [
            {"context": "The cat sat on ", "continuation": "the mat"},
            {"context": "The cat sat on", "continuation": " the mat"},
        ],
        n_predict=0,
        prompt_ids=True,
    )
    assert (
        out[0].prompt_ids == out[1].prompt_ids == engine.encode("The cat sat on the mat").tolist()
    )
    assert out[0].n_context == out[1].n_context == len(engine.encode("The cat sat on"))
    assert out[0].continuation_logprob == pytest.approx(out[1].continuation_logprob, abs=1e-4)


class Merging:
    """A tokenizer of longest matches over a few merges ("abc" and "ab" are one token each)."""

    VOCAB = {"abc": 10, "ab": 11, "a": 1, "b": 2, "c": 3, "x": 5, " ": 4}

    def encode(self, text, parse_special=True, add_eos=None):
        ids, i = [], 0
        while i < len(text):
            w = next(w for w in sorted(self.VOCAB, key=len, reverse=True) if text.startswith(w, i))
            ids.append(self.VOCAB[w])
            i += len(w)
        return ids


@pytest.mark.parametrize(
    "context,continuation,ids,n_context",
    [
        ("x", "abc", [5, 10], 1),  # no token across the boundary
        ("xa", "bcc", [5, 10, 3], 2),  # "abc" crosses it: the context's (index 1 < 2)
        ("x ", "ab", [5, 4, 11], 1),  # the context's trailing space moves: " ab"
    ],
)
def test_a_token_across_the_boundary(context, continuation, ids, n_context):
    from minfer.batch.prompts import Encoder
    from minfer.batch.records import Record, record_ids

    enc = Encoder(None, Merging(), False, None, True)
    got, first = record_ids(Record(context=context, continuation=continuation), enc)
    assert got.tolist() == ids and first == n_context


def test_a_continuation_the_boundary_swallows_is_refused():
    from minfer.batch.prompts import Encoder
    from minfer.batch.records import Record, RecordError, record_ids

    enc = Encoder(None, Merging(), False, None, True)
    with pytest.raises(
        RecordError,
        match="the continuation is 0 tokens: the whole text is 2 tokens, the context alone 2",
    ):
        record_ids(Record(context="xa", continuation="bc"), enc)  # "xabc": x, abc


def test_refusals(engine):
    with pytest.raises(BadInput, match=r"prompts\[0\]: the context is 0 tokens"):
        engine.prefill([{"context": "  ", "continuation": "a"}])  # no BOS in this vocab
    from minfer.batch.prompts import Encoder

    with pytest.raises(BadInput, match="scored as plain text: not with --chat"):
        Encoder(None, Merging(), True, None, True).pair("a", "b")


def test_a_prompt_file_of_continuations(tmp_path, tiny, engine):
    pairs = _pairs(engine.model.config.vocab_size)[:3]
    lines = [
        json.dumps({"context": c, "continuation": n, "id": f"c{i}"})
        for i, (c, n) in enumerate(pairs)
    ]
    lines += ['{"context": "The cat sat on ", "continuation": "the mat"}', '"plain"']
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_cli(
        [
            "prefill",
            "--prompts",
            str(p),
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "-n",
            "1",
            "--top-logprobs",
            "3",
            "--prompt-ids",
            "-o",
            str(out),
        ]
    )
    assert code == 0, stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    api = engine.prefill(
        [json.loads(x) for x in lines], n_predict=1, top_logprobs=3, prompt_ids=True
    )
    assert [r["id"] for r in recs] == ["c0", "c1", "c2", 3, 4]
    for r, c in zip(recs, api):
        assert r["prompt_ids"] == c.prompt_ids and r["greedy_ids"] == c.tokens
        if c.n_context is None:
            assert "continuation_logprob" not in r and "top_logprobs" not in r
            continue
        assert r["n_context"] == c.n_context and r["is_greedy"] == c.is_greedy
        assert r["continuation_logprob"] == pytest.approx(c.continuation_logprob, abs=1e-5)
        assert [[t for t, _, _ in row] for row in r["top_logprobs"]] == [
            [t for t, _, _ in row] for row in c.top_logprobs
        ]
        assert len(r["top_logprobs"]) == r["n_prompt"] - r["n_context"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--top-logprobs", "21"], "--top-logprobs must be in [0, 20], got 21"),
    ],
)
def test_cli_refusals(tmp_path, tiny, args, needle):
    p = tmp_path / "p.jsonl"
    p.write_text('{"context": [1], "continuation": [2]}\n')
    code, _, stderr = run_cli(
        ["prefill", "--prompts", str(p), "-m", str(tiny), "--backend", "cpu", *args]
    )
    assert code == 2 and error_lines(stderr) == [f"error: {needle}"]
    code, _, stderr = run_cli(
        ["prefill", "-m", str(tiny), "--backend", "cpu", "-p", "x", "--prompt-ids"]
    )
    assert code == 2 and "--prompt-ids goes with --prompts FILE" in stderr
