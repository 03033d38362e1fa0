"""The Python API's argument checks (issue 48, item 4): every bad argument to Engine, prefill and
encode is a BadInput (a ValueError) naming the argument and the prompt's index, with the prompt
file's own checks (minfer.batch.records); a hypothesis fuzz of generated garbage arguments
on a tiny model: only BadInput escapes, and every valid call runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from minfer.errors import BadInput

VOCAB, N_CTX = 320, 128
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny synthetic model with a small chat template (it has none), loaded once."""
    from synth_data import tiny_model

    from minfer.gguf.loader import load_model

    m = load_model(
        str(tiny_model(tmp_path_factory.mktemp("api"), seed=7, vocab=VOCAB, n_ctx=N_CTX))
    )
    m.metadata["tokenizer.chat_template"] = TEMPLATE
    return m


@pytest.fixture(scope="module")
def engine(model):
    from minfer.engine.api import Engine

    return Engine(model, backend="cpu", ubatch=64, threads=1)


def test_bad_input_is_a_value_error():
    assert issubclass(BadInput, ValueError)


# -- issue 48's list, one case each --------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts,needle",
    [
        ([{"messages": []}], r'prompts\[0\]: "messages" must be a non-empty array'),
        (["ok", {"messages": [{"content": "x"}]}], r'prompts\[1\]: "messages"\[0\] has no "role"'),
        (
            [[1.7, 2.2]],
            r"prompts\[0\]: token ids\[0\]: a token id must be an integer, not 1\.7 "
            r"\(float\)",
        ),
        ([[3, True, False]], r"prompts\[0\]: token ids\[1\]: .* not True \(bool\)"),
        ([["5"]], r"prompts\[0\]: token ids\[0\]: .* not '5' \(str\)"),
        (b"abc", r"prompts must be a prompt or a list of prompts, not b'abc' \(bytes\)"),
        (["x", b"abc"], r"prompts\[1\]: a prompt is a string, a list of token ids or a dict"),
        (
            [[2**70]],
            r"prompts\[0\]: token ids\[0\]: token id 1180591620717411303424 out of "
            rf"range \[0, {VOCAB}\)",
        ),
        ([[VOCAB]], rf"out of range \[0, {VOCAB}\)"),
        ([[-1]], "out of range"),
        (
            [np.array([1.0, 2.0])],
            r"prompts\[0\]: token ids: token ids must be integers, not "
            "float64",
        ),
        ([np.array([True])], "not bool"),
        ([np.zeros((2, 2), np.int32)], "1-D array"),
        ([[]], r"prompts\[0\]: token ids is empty \(0 tokens\)"),
        ([""], r"prompts\[0\]: the prompt is empty"),
        (["a\x00b"], "NUL character"),
        (["\ud800"], "lone surrogate"),
        ([{"prompt": "a", "id": 1.5}], r'"id" must be a string or an integer, not a number'),
        ([{"prompt": "a", "messages": []}], "not two"),
        ([{"context": "a"}], '"continuation" is missing'),
        ([{"context": "a", "continuation": [1]}], "must both be strings or both lists"),
        ([{"context": "a", "continuation": ""}], '"continuation" is empty'),
        ([{"text": "a"}], r'unknown key "text"'),
        ([None], r"prompts\[0\]: .* got null"),
        (None, "prompts must be a prompt or a list of prompts, not None"),
        (5, "prompts must be a prompt or a list of prompts, not 5"),
    ],
)
def test_a_bad_prompt_is_named(engine, prompts, needle):
    with pytest.raises(BadInput, match=needle):
        engine.prefill(prompts, n_predict=1)


def test_a_string_or_a_dict_alone_is_one_prompt(engine):
    one = engine.prefill("hello", n_predict=2)
    assert len(one) == 1 and one[0].prompt_tokens == len(engine.encode("hello"))
    assert one[0].tokens == engine.prefill(["hello"], n_predict=2)[0].tokens
    d = engine.prefill({"prompt": "hi", "id": "x"}, n_predict=2)
    assert [(c.id, c.prompt_tokens) for c in d] == [("x", len(engine.encode("hi")))]
    assert d[0].tokens == engine.prefill(["hi"], n_predict=2)[0].tokens


def test_integer_ids_of_any_kind(engine):
    ref = engine.prefill([[5, 6, 7]], n_predict=1)[0].tokens
    for ids in (
        [np.int64(5), np.uint8(6), 7],
        (5, 6, 7),
        np.array([5, 6, 7], np.uint16),
        np.array([5, 6, 7], dtype=object),
    ):
        assert engine.prefill([ids], n_predict=1)[0].tokens == ref
    assert engine.encode([VOCAB - 1]).tolist() == [VOCAB - 1]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(n_predict=1.5), r"n_predict must be an integer, not 1\.5 \(float\)"),
        (dict(n_predict=True), r"n_predict must be an integer, not True \(bool\)"),
        (dict(n_predict=-1), "n_predict must be >= 0, got -1"),
        (dict(n_predict="2"), "n_predict must be an integer"),
        (dict(logprobs=1), "logprobs must be True or False, not 1"),
        (dict(share_prefix="no"), "share_prefix must be True or False"),
        (dict(stop_at_eos=None), "stop_at_eos must be True or False"),
        (dict(chat="yes"), "chat must be True or False"),
        (dict(system=3), "system must be a string, not a number"),
        (dict(system="a\x00"), "system holds a NUL"),
        (dict(top_logprobs=21), r"top_logprobs must be in \[0, 20\], got 21"),
        (dict(top_logprobs=1.0), "top_logprobs must be an integer"),
        (dict(prompt_ids=0), "prompt_ids must be True or False"),
    ],
)
def test_a_bad_option_is_named(engine, kw, needle):
    kw = {"n_predict": 1, **kw}
    with pytest.raises(BadInput, match=needle):
        engine.prefill(["a"], **kw)


def test_numpy_scalars_are_options_too(engine):
    out = engine.prefill(["a"], n_predict=np.int64(2), logprobs=np.bool_(True))
    assert len(out[0].tokens) == 2 and out[0].logprobs == []


def test_past_the_context_names_the_prompt(engine):
    with pytest.raises(
        BadInput,
        match=r"prompts\[1\]: prompt of 127 tokens \+ 2 generated "
        r"tokens = 129 exceeds the context of 128",
    ):
        engine.prefill(["a", "b" * 127], n_predict=2)


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(ubatch=0), "ubatch must be >= 1, got 0"),
        (dict(ubatch=2.5), "ubatch must be an integer"),
        (dict(ubatch=True), "ubatch must be an integer"),
        (dict(threads=0), "threads must be >= 1, got 0"),
        (dict(threads="2"), "threads must be an integer"),
        (dict(progress="yes"), "progress must be True or False"),
        (dict(backend=1), "backend must be"),
        (dict(backend="tpu"), "expected cuda or cpu"),
    ],
)
def test_bad_engine_arguments(model, kw, needle):
    from minfer.engine.api import Engine

    with pytest.raises(BadInput, match=needle):
        Engine(model, **{"backend": "cpu", **kw})


def test_threads_sets_the_blas_pool(model):
    from threadpoolctl import threadpool_info

    from minfer.engine.api import Engine
    from minfer.host import threads

    Engine(model, backend="cpu", threads=1)
    assert threads.current() == 1
    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    assert all(p["num_threads"] == 1 for p in blas)


def test_the_api_and_the_prompt_file_say_the_same(engine, tmp_path):
    """One set of checks (records.py): a bad record's message is the same through both."""
    import json

    from minfer.batch.prompts import make_encoder, open_prompts

    enc = make_encoder(engine.model.metadata, engine.tok, None, None, True)
    for rec in (
        {"messages": []},
        {"messages": [{"content": "x"}]},
        {"prompt": [1, 1.5]},
        {"prompt": [VOCAB]},
        {"prompt": "a", "id": True},
        {"context": "a"},
        {"prompt": "a", "extra": 1},
        {"context": [1], "continuation": "b"},
        {"prompt": ""},
        {"prompt": "a\x00"},
    ):
        p = tmp_path / "p.jsonl"
        p.write_text(json.dumps(rec) + "\n")
        with open_prompts(str(p), "jsonl", enc, VOCAB) as src:
            with pytest.raises(BadInput) as file_err:
                src.scan(N_CTX, 1)
        with pytest.raises(BadInput) as api_err:
            engine.prefill([rec], n_predict=1)
        want = str(file_err.value).split(" line 1: ", 1)[1]
        assert str(api_err.value) == f"prompts[0]: {want}", rec


# -- the fuzz ------------------------------------------------------------------------------------
def choose(good, bad, one_in: int):
    """(value, valid): good's draws, one time in `one_in` bad's."""
    return st.integers(0, one_in - 1).flatmap(
        lambda i: bad.map(lambda v: (v, False)) if i == 0 else good.map(lambda v: (v, True))
    )


TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=6
)
BAD_TEXT = st.sampled_from(["", "a\x00", "\ud800x", b"ab", 3, None])
INT_ID = (
    st.integers(0, VOCAB - 1)
    | st.integers(0, VOCAB - 1).map(np.int64)
    | st.integers(0, 255).map(np.uint8)
)
BAD_ID = st.sampled_from(
    [-1, VOCAB, 2**70, 1.0, 2.5, True, False, "5", b"5", None, np.float32(3), np.bool_(True)]
)
_IDS = st.lists(INT_ID, min_size=1, max_size=6)
IDS = _IDS | _IDS.map(tuple) | _IDS.map(lambda v: np.array([int(x) for x in v], np.int32))
BAD_IDS = st.tuples(_IDS, BAD_ID, st.integers(0, 6)).map(
    lambda t: t[0][: t[2]] + [t[1]] + t[0][t[2] :]
) | st.sampled_from(
    [[], np.array([1.5]), np.array([True]), np.zeros((1, 2), np.int32), np.array([], np.int64)]
)
MSGS = st.lists(
    st.builds(
        lambda r, c: {"role": r, "content": c},
        st.sampled_from(["user", "system", "assistant"]),
        TEXT,
    ),
    min_size=1,
    max_size=3,
)
BAD_MSGS = st.sampled_from(
    [
        [],
        "hi",
        [1],
        [{"role": "user"}],
        [{"content": "x"}],
        [{"role": "", "content": "x"}],
        [{"role": "u", "content": 1}],
        [{"role": "u", "content": "x", "name": "n"}],
    ]
)
PID = st.sampled_from([{}, {"id": "q"}, {"id": 7}, {"id": np.int64(2)}])
BAD_PID = st.sampled_from([{"id": True}, {"id": 1.5}, {"id": None}, {"id": []}, {"id": "\x00"}])
# a text context that is only whitespace is 0 tokens once its trailing whitespace moves (the
# tiny vocab adds no BOS)
CONTEXT = TEXT.filter(lambda t: t.rstrip() != "")


def _dict(body: dict, pid: dict) -> dict:
    return {**body, **pid}


def good_record(chat: bool):
    forms = [
        TEXT,
        IDS,
        st.builds(lambda p, i: _dict({"prompt": p}, i), TEXT | IDS, PID),
        st.builds(lambda m, i: _dict({"messages": m}, i), MSGS, PID),
        st.builds(lambda c, n, i: _dict({"context": c, "continuation": n}, i), _IDS, _IDS, PID),
    ]
    if not chat:  # a text pair is plain text: refused under the chat template
        forms.append(st.builds(lambda c, n: {"context": c, "continuation": n}, CONTEXT, TEXT))
    return st.one_of(forms)


def bad_record(chat: bool):
    forms = [
        BAD_TEXT,
        BAD_IDS,
        st.builds(lambda p: {"prompt": p}, BAD_TEXT | BAD_IDS),
        st.builds(lambda m: {"messages": m}, BAD_MSGS),
        st.builds(lambda p, i: _dict({"prompt": p}, i), TEXT, BAD_PID),
        st.builds(
            lambda c, n: {"context": c, "continuation": n},
            st.sampled_from([" ", "\t\n", "", 3]) | IDS,
            TEXT,
        ),
        st.builds(lambda c, n: {"context": c, "continuation": n}, IDS, BAD_IDS),
        st.sampled_from(
            [
                {},
                {"prompt": "a", "messages": [{"role": "u", "content": "c"}]},
                {"context": "a"},
                {"continuation": "b"},
                {"prompt": "a", "x": 1},
                {1: "a"},
                None,
                1,
                1.5,
                True,
                b"x",
                {1, 2},
            ]
        ),
    ]
    if chat:
        forms.append(st.builds(lambda c, n: {"context": c, "continuation": n}, CONTEXT, TEXT))
    return st.one_of(forms)


FLAG = st.sampled_from([True, False, np.bool_(True)])
BAD_FLAG = st.sampled_from([1, 0, "yes", None])


@st.composite
def prefill_calls(draw):
    """(args, kwargs, valid): a generated Engine.prefill call and whether it is valid."""
    kw, good = {}, True

    def opt(name, ok, bad):
        nonlocal good
        if draw(st.booleans()):
            kw[name], v_ok = draw(choose(ok, bad, 8))
            good &= v_ok

    opt("chat", FLAG, BAD_FLAG)
    opt("system", TEXT, st.sampled_from([3, "a\x00"]))
    chat = bool(kw.get("chat", False)) or "system" in kw  # system alone implies the template
    recs = draw(st.lists(choose(good_record(chat), bad_record(chat), 6), max_size=4))
    shape, s_ok = draw(
        choose(
            st.sampled_from(["list", "tuple", "one"]),
            st.sampled_from([None, 5, 1.5, b"abc", {1, 2}]),
            8,
        )
    )
    if shape == "one" and recs and isinstance(recs[0][0], (str, dict)):
        prompts, good = recs[0][0], good and recs[0][1]
    elif not s_ok:
        prompts, good = shape, False
    else:
        prompts = [r for r, _ in recs] if shape != "tuple" else tuple(r for r, _ in recs)
        good &= all(o for _, o in recs)
    opt(
        "n_predict",
        st.sampled_from([0, 1, 2, np.int32(1)]),
        st.sampled_from([-1, 1.5, True, "1", None]),
    )
    for name in ("logprobs", "share_prefix", "stop_at_eos", "prompt_ids"):
        opt(name, FLAG, BAD_FLAG)
    opt("top_logprobs", st.sampled_from([0, 2, 20]), st.sampled_from([-1, 21, 1.0, True]))
    kw.setdefault("n_predict", 1)
    return (prompts,), kw, good


@st.composite
def encode_calls(draw):
    """(args, kwargs, valid): a generated Engine.encode call (chat off: text pairs valid)."""
    prompt, good = draw(choose(good_record(False), bad_record(False), 3))
    kw = {}
    if draw(st.booleans()):
        kw["special"], f_ok = draw(choose(FLAG, BAD_FLAG, 4))
        good &= f_ok
    return (prompt,), kw, good


@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(prefill_calls())
def test_fuzz_prefill(engine, call):
    args, kw, good = call
    event("valid" if good else "bad")
    try:
        out = engine.prefill(*args, **kw)
    except BadInput:
        assert not good, f"a valid call refused: {args!r} {kw!r}"
        return
    assert good, f"a bad call ran: {args!r} {kw!r}"
    n = 1 if isinstance(args[0], (str, dict)) else len(args[0])
    assert len(out) == n and all(c.prompt_tokens >= 1 for c in out)
    for c in out:
        if c.n_context is not None:
            assert c.continuation_logprob <= 0 and isinstance(c.is_greedy, bool)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(encode_calls())
def test_fuzz_encode(engine, call):
    args, kw, good = call
    event("valid" if good else "bad")
    try:
        ids = engine.encode(*args, **kw)
    except BadInput:
        assert not good, f"a valid call refused: {args!r} {kw!r}"
        return
    assert good, f"a bad call ran: {args!r} {kw!r}"
    assert ids.dtype == np.int32 and ids.size >= 1 and 0 <= ids.min() and ids.max() < VOCAB
