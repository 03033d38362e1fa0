"""CPU: many prompts through minfer.batch (the runner, the Engine API, `prefill --prompts`) on the
CPU reference's packed forward, against each prompt run alone (batch.single.run, window_logits).

Identity tolerances: tests/tolerance.py's rule (the `tols` fixture): float64 (the oracle engine)
to the f32 rounding of its outputs; float32 to 4x the f32 engine's own error against the oracle
on _prompts, measured on this machine's BLAS. Greedy ids are equal up to the first near-tie
(a reference margin below the tolerance), after which nothing is compared."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tolerance
from cli_inproc import error_lines, run_cli

from minfer.tools.gates import compare_greedy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("batch"), seed=11, vocab=512, n_ctx=256)


@pytest.fixture(scope="module")
def engine(tiny):
    import minfer  # the README's entry point

    return _prepared(minfer.Engine(str(tiny), backend="cpu", ubatch=48))


@pytest.fixture(scope="module")
def oracle(tiny):
    """engine's float64 twin (the oracle mode): the same model, ubatch and API."""
    import minfer

    return _prepared(minfer.Engine(str(tiny), backend="cpu", ubatch=48, dtype="f64"))


def _prepared(eng):
    """eng with its backend built for _prompts at once (128 slots each): the tests call
    runner.run and single.run on eng.backend directly."""
    eng.prepare(128, 128 * len(_prompts(eng.model.config.vocab_size)))
    return eng


def _prompts(vocab: int) -> list[np.ndarray]:
    """Ragged (1 .. 2 chunks of 48 + 1), a duplicate, three sharing a 30-token prefix."""
    rng = np.random.default_rng(3)
    r = lambda n: rng.integers(0, vocab, n).astype(np.int32)  # noqa: E731
    ps = [r(n) for n in (1, 5, 49, 2, 97, 20)]
    head = r(30)
    ps += [ps[1].copy()] + [np.concatenate([head, r(n)]) for n in (3, 1, 17)]
    return ps


def _alone(engine, ids, n):
    """ids run alone: (single.run's result, the log-probs of ids[1:] from window_logits or None,
    tolerance.scale of the logits seen)."""
    from minfer.batch import single

    be = engine.backend
    res = single.run(be, ids, n, 48, warmup=False)
    lp, s = None, tolerance.scale(res.last_logits)
    if len(ids) > 1:
        lg = be.window_logits(ids, 0)[:-1].astype(np.float64)
        m = lg.max(1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(lg - m).sum(1))
        lp = lg[np.arange(len(ids) - 1), ids[1:]] - lse
        s = max(s, tolerance.scale(lg))
    return res, lp, s


@pytest.fixture(scope="module")
def alone(engine, oracle):
    """dtype -> _alone(n=6) of each of _prompts, on engine ("f32") and oracle ("f64")."""
    prompts = _prompts(engine.model.config.vocab_size)
    return {dt: [_alone(e, p, 6) for p in prompts] for dt, e in (("f32", engine), ("f64", oracle))}


@pytest.fixture(scope="module")
def tols(engine, alone):
    """dtype -> tests/tolerance.py's tolerance on this model: f32 from the error of the f32
    engine against the f64 oracle on _prompts (last prompt logits and log-probs), here."""
    s = max(x[2] for x in alone["f64"])
    pairs = [(a[0].last_logits, b[0].last_logits) for a, b in zip(alone["f32"], alone["f64"])]
    pairs += [(a[1], b[1]) for a, b in zip(alone["f32"], alone["f64"]) if a[1] is not None]
    cfg = engine.model.config
    return {"f32": tolerance.f32_tol(tolerance.f32_err(pairs), s), "f64": tolerance.f64_tol(cfg, s)}


@pytest.mark.identity
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("share", [True, False])
def test_packed_equals_each_prompt_alone(engine, oracle, alone, tols, dtype, share):
    eng, tol = (engine if dtype == "f32" else oracle), tols[dtype]
    prompts = _prompts(eng.model.config.vocab_size)
    out = eng.prefill(prompts, n_predict=6, logprobs=True, share_prefix=share)
    assert [c.index for c in out] == list(range(len(prompts)))  # input order
    for c, ids, (res, lp, _) in zip(out, prompts, alone[dtype]):
        assert c.prompt_tokens == len(ids) and len(c.tokens) == 6
        v = compare_greedy(c.tokens, res.greedy_ids, res.step_margins, tol)
        assert v.ok, f"prompt {c.index}: {v.describe()}"
        if lp is None:
            assert c.logprobs == []
        else:
            assert np.abs(np.array(c.logprobs) - lp).max() <= tol, c.index
            assert c.logprob_sum == pytest.approx(float(np.sum(c.logprobs)), abs=1e-9)


@pytest.mark.identity
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_waves_give_the_same_results(tiny, tols, dtype):
    """A KV cache of 3 slot blocks: the 10 prompts run in several waves, with equal results."""
    from minfer.batch import run as runner
    from minfer.engine.api import Engine

    one = Engine(str(tiny), backend="cpu", ubatch=48, dtype=dtype)
    prompts = _prompts(one.model.config.vocab_size)
    full = one.prefill(prompts, n_predict=3, logprobs=True)
    got = []
    tot = runner.run(
        one.backend,
        enumerate(prompts),
        3,
        kv_slots=3 * 128,
        ubatch=48,
        logprobs=True,
        emit=got.append,
    )
    assert tot.waves > 2 and [r.key for r in got] == list(range(len(prompts)))
    for a, b in zip(got, full):
        v = compare_greedy(a.greedy, b.tokens, b.margins, tols[dtype])
        assert v.ok, f"prompt {a.key}: {v.describe()}"
        assert np.allclose(a.logprobs, b.logprobs, rtol=0, atol=tols[dtype], equal_nan=True)


@pytest.mark.identity
def test_shared_prefixes_are_computed_once(engine, tols):
    from minfer.batch import run as runner

    prompts = _prompts(engine.model.config.vocab_size)
    on, off = [], []
    t_on = runner.run(
        engine.backend, enumerate(prompts), 1, kv_slots=engine.kv_slots, ubatch=48, emit=on.append
    )
    t_off = runner.run(
        engine.backend,
        enumerate(prompts),
        1,
        kv_slots=engine.kv_slots,
        ubatch=48,
        share=False,
        emit=off.append,
    )
    assert t_off.computed_tokens == t_on.prompt_tokens == sum(map(len, prompts))
    # the duplicate's 4 rows and two sharers' 29 + 29 rows... at least the 30-token head twice
    assert t_on.computed_tokens <= t_off.computed_tokens - 2 * 29
    for a, b in zip(on, off):  # another packing: equal up to a near-tie
        v = compare_greedy(a.greedy, b.greedy, b.margins, tols["f32"])
        assert v.ok, f"prompt {a.key}: {v.describe()}"


def test_stop_ids_end_a_sequence(oracle):
    """On the f64 oracle: a stopped sequence leaves the decode batch, and in f32 the smaller
    GEMM could flip a near-tie of another sequence; here equal ids are exact."""
    from minfer.batch import run as runner

    engine = oracle
    prompts = _prompts(engine.model.config.vocab_size)[:4]
    free = []
    runner.run(
        engine.backend, enumerate(prompts), 5, kv_slots=engine.kv_slots, ubatch=48, emit=free.append
    )
    stop = {free[0].greedy[2]}
    got = []
    runner.run(
        engine.backend,
        enumerate(prompts),
        5,
        kv_slots=engine.kv_slots,
        ubatch=48,
        emit=got.append,
        stop_ids=stop,
    )
    for a, b in zip(got, free):
        k = next((i for i, t in enumerate(b.greedy) if t in stop), None)
        assert a.greedy == (b.greedy if k is None else b.greedy[: k + 1])
        assert a.eos == (k is not None)


def test_zero_predict_scores_only(engine):
    prompts = _prompts(engine.model.config.vocab_size)[:3]
    out = engine.prefill(prompts, n_predict=0, logprobs=True)
    assert all(c.tokens == [] for c in out)
    assert all(len(c.logprobs) == len(p) - 1 for c, p in zip(out, prompts))


def test_api_refusals(engine):
    from minfer.errors import BadInput

    n_ctx = engine.model.config.n_ctx
    with pytest.raises(BadInput, match=r"prompts\[0\]: .* exceeds the context of 256"):
        engine.prefill([np.zeros(n_ctx, np.int32)], n_predict=1)
    with pytest.raises(BadInput, match="0 tokens"):
        engine.prefill([[]])
    with pytest.raises(BadInput, match="out of range"):
        engine.prefill([[10**6]])
    with pytest.raises(BadInput, match='unknown key "text"'):
        engine.prefill([{"text": "x"}])


def test_api_ids_text_and_close(tiny):
    import minfer

    with minfer.Engine(str(tiny), backend="cpu") as eng:
        out = eng.prefill([{"prompt": "abc", "id": "first"}, "abc", [97, 98, 99]], n_predict=3)
        assert [c.id for c in out] == ["first", 1, 2]
        assert out[0].tokens == out[1].tokens == out[2].tokens  # the same ids three ways
        assert out[0].text == eng.tok.decode(out[0].tokens)
    assert eng.backend is None


def test_a_prompt_exactly_at_the_context(engine):
    n_ctx = engine.model.config.n_ctx
    ids = np.arange(n_ctx - 2, dtype=np.int32) % 300
    out = engine.prefill([ids, ids[:3]], n_predict=2)
    assert [len(c.tokens) for c in out] == [2, 2]


def test_cli_prompts_file(tmp_path, tiny):
    p = tmp_path / "p.jsonl"
    p.write_text('"hello there"\n{"prompt": "abc", "id": "x"}\n\n"hello there"\n"q"\n')
    out = tmp_path / "out.jsonl"
    code, stdout, stderr = run_cli(
        [
            "prefill",
            "--prompts",
            str(p),
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "-n",
            "3",
            "--logprobs",
            "-o",
            str(out),
        ]
    )
    assert code == 0, stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == [0, "x", 2, 3]
    assert recs[0]["greedy_ids"] == recs[2]["greedy_ids"]  # duplicates
    for r in recs:
        assert len(r["greedy_ids"]) == 3 and len(r["logprobs"]) == r["n_prompt"] - 1
        assert r["logprob_sum"] == pytest.approx(sum(r["logprobs"]), abs=1e-4)
        assert set(r) == {
            "id",
            "n_prompt",
            "greedy_ids",
            "text",
            "stopped_at_eos",
            "logprobs",
            "logprob_sum",
        }
    assert "prompts  4 prompts" in stderr and "tok/s aggregate" in stderr
    # stdout mode: the same records
    code, stdout, _ = run_cli(
        [
            "prefill",
            "--prompts",
            str(p),
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "-n",
            "3",
            "--logprobs",
            "-q",
        ]
    )
    assert code == 0 and [json.loads(x) for x in stdout.splitlines()] == recs


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-p", "x"], "either --prompts FILE or one prompt"),
        (["--json"], "--json: with --prompts"),
        (["-n", "-1"], "-n -1"),
    ],
)
def test_cli_prompts_refusals(tmp_path, tiny, args, needle):
    p = tmp_path / "p.jsonl"
    p.write_text('"a"\n')
    code, _, stderr = run_cli(
        ["prefill", "--prompts", str(p), "-m", str(tiny), "--backend", "cpu", *args]
    )
    assert code == 2 and len(error_lines(stderr)) == 1 and needle in stderr


def test_cli_batch_flags_need_prompts(tiny):
    for flag in (["--logprobs"], ["-o", "x.jsonl"], ["--no-prefix-share"]):
        code, _, stderr = run_cli(["prefill", "-m", str(tiny), "--backend", "cpu", *flag])
        assert code == 2 and "goes with --prompts FILE" in stderr


def test_cli_bad_line_before_any_work(tmp_path, tiny):
    p = tmp_path / "p.jsonl"
    p.write_text('"a"\n{"promt": "b"}\n')
    out = tmp_path / "o.jsonl"
    code, _, stderr = run_cli(
        ["prefill", "--prompts", str(p), "-m", str(tiny), "--backend", "cpu", "-o", str(out)]
    )
    assert code == 2 and error_lines(stderr) and "line 2" in error_lines(stderr)[0]
    assert not out.exists()


def test_bench_batch_cpu(tiny):
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--batch",
            "6",
            "--tokens",
            "9",
            "--shared-prefix",
            "20",
            "-n",
            "3",
            "-r",
            "1",
        ]
    )
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith("| default")]
    assert len(rows) == 2 and "| on (" in rows[0] and "| off (174 computed)" in rows[1]
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--batch",
            "5",
            "--log-uniform",
            "2:40",
            "-r",
            "1",
        ]
    )
    assert code == 0, err
    assert "5 prompts" in out
    for bad, needle in (
        (["--batch", "0"], "--batch 0"),
        (["--batch", "2", "-n", "1,2"], "one count"),
        (["--log-uniform", "5:2", "--batch", "2"], "1 <= A <= B"),
        (["--shared-prefix", "4"], "goes with --batch"),
        (["--batch", "2", "--plot", "x.png"], "--plot draws"),
    ):
        code, _, err = run_cli(["bench", "-m", str(tiny), "--backend", "cpu", *bad])
        assert code == 2 and needle in err, err


def test_a_nan_names_the_prompts_of_its_forward(tmp_path):
    """A NaN embedding row (token 7): the error names the prompt whose chunk met it, not the
    others; the CLI names its line and id."""
    import numpy as np
    from synth_data import small_parts, write_small

    from minfer.batch import run as runner
    from minfer.engine.api import Engine
    from minfer.errors import NumericError

    meta, tensors = small_parts(seed=1, tied=False)  # (tied: every logit row 7 NaN)
    name, qt, shape, data = tensors[0]
    data = data.copy()
    data[7] = np.nan
    tensors[0] = (name, qt, shape, data)
    path = write_small(tmp_path / "nan.gguf", meta, tensors)
    eng = Engine(str(path), backend="cpu", ubatch=3)
    eng.prepare(128, 512)
    with pytest.raises(NumericError, match=r"\[the prefill chunk of prompt 1\]"):
        runner.run(
            eng.backend,
            enumerate([np.array([1, 2, 3]), np.array([4, 7, 5])]),
            2,
            kv_slots=eng.kv_slots,
            ubatch=3,
            share=False,
        )
    tok = eng.tok
    seven = next(c for c in map(chr, range(1, 127)) if 7 in tok.encode(c))  # (a byte vocab)
    p = tmp_path / "p.jsonl"
    p.write_text('"ab"\n\n' + json.dumps({"prompt": "a" + seven, "id": "q"}) + "\n")
    out = tmp_path / "o.jsonl"
    code, _, err = run_cli(
        [
            "prefill",
            "--prompts",
            str(p),
            "-m",
            str(path),
            "--backend",
            "cpu",
            "-n",
            "1",
            "--no-prefix-share",
            "-ub",
            "2",
            "-o",
            str(out),
        ]
    )
    assert code == 3 and len(error_lines(err)) == 1, err
    assert f"[the prefill chunk of {p} line 3 (id 'q')]" in err and not out.exists()


def test_a_small_first_call_does_not_shrink_later_ones(tiny):
    """The CPU cache grows for a later, larger call (one wave), up to CPU_SLOTS."""
    from minfer.engine.api import Engine

    eng = Engine(str(tiny), backend="cpu", ubatch=48)
    prompts = _prompts(eng.model.config.vocab_size)
    eng.prefill(prompts[:1], n_predict=1)
    small = eng.kv_slots
    tot = eng.run(enumerate(prompts), [len(p) for p in prompts], 2, lambda r: None)
    assert tot.waves == 1 and eng.kv_slots > small


@pytest.mark.identity
def test_ten_thousand_tiny_prompts(tiny, tols):
    """10,000 prompts of 1..3 tokens, streamed: every result, in order; a sample equals its
    prompt alone."""
    from minfer.engine.api import Engine

    eng = Engine(str(tiny), backend="cpu", ubatch=2048)
    rng = np.random.default_rng(9)
    V = eng.model.config.vocab_size
    lens = rng.integers(1, 4, 10_000)
    seen = []

    def prompts():  # a generator: the runner never holds the input whole
        r = np.random.default_rng(10)
        for k, n in enumerate(lens):
            yield k, r.integers(0, V, n).astype(np.int32)

    tot = eng.run(prompts(), lens, 1, seen.append)
    assert [r.key for r in seen] == list(range(10_000)) and tot.prompts == 10_000
    again = dict(prompts())
    for k in (0, 4_321, 9_999):
        res, _, _ = _alone(eng, again[k], 1)
        assert seen[k].greedy == res.greedy_ids or res.step_margins[0] < tols["f32"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_bench_batch_formats(tiny, fmt):
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--batch",
            "3",
            "--tokens",
            "5",
            "-r",
            "1",
            "-o",
            fmt,
        ]
    )
    assert code == 0, err
    if fmt == "json":
        (rec,) = json.loads(out)
        assert rec["prompts"] == 3 and rec["tokens"] == 15 and rec["prefill_tok_s_median"] > 0
    else:
        head, row = out.strip().splitlines()
        assert "prefill_tok_s" in head.split(",") and row.count(",") == head.count(",")
    assert "backend cpu" in err  # the notes on stderr, the records alone on stdout


def test_cli_prompts_f64(tmp_path, tiny, tols):
    """--dtype f64 reaches the packed CPU reference (the oracle mode), with equal greedy ids."""
    p = tmp_path / "p.jsonl"
    p.write_text('"hello"\n"abc"\n')
    outs = []
    for extra in ([], ["--dtype", "f64"]):
        code, out, err = run_cli(
            [
                "prefill",
                "--prompts",
                str(p),
                "-m",
                str(tiny),
                "--backend",
                "cpu",
                "-n",
                "4",
                "--logprobs",
                "-q",
                *extra,
            ]
        )
        assert code == 0, err
        outs.append([json.loads(x) for x in out.splitlines()])
    assert [r["greedy_ids"] for r in outs[0]] == [r["greedy_ids"] for r in outs[1]]
    d = max(abs(a - b) for r0, r1 in zip(*outs) for a, b in zip(r0["logprobs"], r1["logprobs"]))
    assert 0 < d <= tols["f32"]  # f32 and f64 differ, by the f32 error measured on _prompts
