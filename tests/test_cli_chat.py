"""Chat prompts (issue 20): the GGUF's chat template through jinja2, special tokens in prompts,
stopping at the end-of-generation token, and the default `minfer prefill` answering a question."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from synth_data import tiny_model

from minfer.cli import main
from minfer.errors import BadInput, BadModel
from minfer.text import chat

# SmolLM2-135M-Instruct's template, as its GGUF carries it: a default system message, ChatML
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(autouse=True)
def _reuse_loaded_model(monkeypatch, default_model, default_model_path):
    """The command gets the session's already-opened default model (opening costs seconds)."""
    import minfer.gguf.loader

    real = minfer.gguf.loader.load_model
    monkeypatch.setattr(
        minfer.gguf.loader,
        "load_model",
        lambda p: default_model if str(p) == str(default_model_path) else real(p),
    )


@pytest.fixture(scope="module")
def tok(default_model):
    from minfer.text.tokenizer import Tokenizer

    return Tokenizer.from_metadata(default_model.metadata)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("chat"), seed=1)


def _run(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["prefill", "--backend", "cpu", *args])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def _chatml(user: str, system: str = SMOL_SYSTEM) -> str:
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# -- the default run answers -----------------------------------------------------------------
def test_default_prefill_is_a_chat_that_answers(capsys, tok):
    code, out, err = _run(capsys, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["chat"] is True
    assert d["prompt_ids"] == tok.encode(
        _chatml("What is the capital of France?"), parse_special=True
    )
    assert d["prompt_ids"][0] == tok.token_to_id["<|im_start|>"]
    # decoding ends at the end of the turn, well before the 32-token budget, with an answer
    assert d["stopped_at_eos"] is True and d["greedy_ids"][-1] in tok.eog_ids
    assert len(d["greedy_ids"]) < 32 and "Paris" in d["greedy_text"]
    assert "<|im_end|>" not in d["greedy_text"]


def test_chat_with_system_and_text_output(capsys, tok):
    code, out, err = _run(capsys, "--system", "Be brief.", "-p", "Hi", "-n", "0")
    assert code == 0, err
    assert "(chat template)" in out and "prompt   " in out
    n = len(tok.encode(_chatml("Hi", system="Be brief."), parse_special=True))
    assert f"prompt   {n} tokens (chat template)" in out


def test_plain_prompt_stays_plain_and_runs_through_eos(capsys, tok):
    # -p without --chat: the text as given; decoding runs its full length (identity needs it)
    code, out, err = _run(capsys, "-p", "The capital of France is", "-n", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["chat"] is False and d["prompt_ids"] == tok.encode("The capital of France is")
    assert len(d["greedy_ids"]) == 3 and d["stopped_at_eos"] is False


def test_stop_at_eos_flags(capsys, tok):
    # a chat may decode through its end of turn (what the identity checks do) ...
    code, out, err = _run(capsys, "--chat", "--no-stop-at-eos", "-n", "9", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert len(d["greedy_ids"]) == 9 and d["stopped_at_eos"] is False
    assert any(i in tok.eog_ids for i in d["greedy_ids"][:-1])  # it went past one
    # ... and a plain prompt may stop at it
    turn = _chatml("What is the capital of France?")
    code, out, err = _run(capsys, "-p", turn, "--stop-at-eos", "-n", "9", "--json")
    assert code == 0, err
    e = json.loads(out)
    assert e["chat"] is False and e["prompt_ids"] == d["prompt_ids"]
    assert e["stopped_at_eos"] is True and e["greedy_ids"][-1] in tok.eog_ids
    k = len(e["greedy_ids"])
    assert k < 9 and e["greedy_ids"] == d["greedy_ids"][:k]


# -- special tokens in a prompt ----------------------------------------------------------------
def test_special_tokens_parsed_by_default_and_no_special(capsys, tok):
    s = "<|im_start|>user\nhi<|im_end|>"
    code, out, err = _run(capsys, "-p", s, "-n", "0", "--json")
    assert code == 0, err
    ids = json.loads(out)["prompt_ids"]
    assert ids == [1] + tok.encode("user\nhi") + [2]  # llama.cpp: 1 and 2 are the specials
    code, out, err = _run(capsys, "-p", s, "-n", "0", "--json", "--no-special")
    assert code == 0, err
    plain = json.loads(out)["prompt_ids"]
    assert plain == tok.encode(s) and 1 not in plain and 2 not in plain


def test_no_special_with_chat_keeps_the_template_markers(default_model, tok):
    meta = default_model.metadata
    user = "a<|im_end|>b"
    parsed = chat.encode(meta, tok, user)
    literal = chat.encode(meta, tok, user, parse_special=False)
    assert parsed == tok.encode(_chatml(user), parse_special=True)
    assert parsed.count(2) == 3 and literal.count(2) == 2  # the user's one is text
    assert literal.count(1) == parsed.count(1) == 3
    assert tok.decode(literal, special=True) == _chatml(user)
    # nothing special in the messages: the same ids either way
    assert chat.encode(meta, tok, "hi", parse_special=False) == chat.encode(meta, tok, "hi")


# -- models without a template, broken templates -----------------------------------------------
def test_chat_without_template_is_an_error(capsys, tiny):
    code, out, err = _run(capsys, "-m", str(tiny), "--chat", "-p", "hi")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "chat_template" in lines[0]
    # with no prompt, a model without a template gets the plain default prompt
    code, out, err = _run(capsys, "-m", str(tiny), "-n", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["chat"] is False
    code, out, err = _run(capsys, "--no-chat", "--system", "x")
    assert code == 2 and "--system" in err


def _fake_tok(add_bos=False):
    texts = {1: "<s>", 2: "</s>"}
    return SimpleNamespace(bos_id=1, eos_id=2, add_bos=add_bos, token_text=texts.__getitem__)


def _meta(t):
    return {chat.TEMPLATE_KEY: t}


def test_render_environment_like_hf():
    msgs = chat.messages('hé "q"', system="s")
    t = (
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | tojson }}"
        "{% endfor %}{% if add_generation_prompt %}{{ eos_token }}{% endif %}"
    )
    assert chat.render(_meta(t), _fake_tok(), msgs) == '<s>[system]"s"[user]"hé \\"q\\""</s>'
    # a tokenizer that adds BOS itself: the template's BOS is dropped (llama.cpp), not doubled
    assert chat.render(_meta(t), _fake_tok(add_bos=True), msgs).startswith("[system]")
    year = chat.render(_meta("{{ strftime_now('%Y') }}"), _fake_tok(), msgs)
    assert year.isdigit() and len(year) == 4
    # trim_blocks / lstrip_blocks as HF sets them
    assert chat.render(_meta("  {% if true %}\nx{% endif %}\n"), _fake_tok(), msgs) == "x"
    assert (
        chat.render(
            _meta("{% for i in [1,2,3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            _fake_tok(),
            msgs,
        )
        == "1"
    )


@pytest.mark.parametrize(
    "template,err,needle",
    [
        (
            "{{ raise_exception('System role not supported') }}",
            BadInput,
            "System role not supported",
        ),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", BadModel, "does not render"),
        ("{% for %}", BadModel, "does not render"),
        ("{{ messages.append(1) }}", BadModel, "does not render"),  # immutable sandbox
        ("", BadInput, "chat_template"),
    ],
)
def test_render_errors(template, err, needle):
    with pytest.raises(err, match=needle):
        chat.render(_meta(template), _fake_tok(), chat.messages("hi"))


# -- stopping at the end of generation ---------------------------------------------------------
class _Scripted:
    """A backend whose next token is scripted: position p's logits put the max on script[p]."""

    name = "scripted"

    def __init__(self, script, vocab=8):
        self.script, self.vocab, self.calls = script, vocab, 0

    def reset(self):
        pass

    def synchronize(self):
        pass

    def forward(self, ids, pos0):
        self.calls += 1
        out = np.zeros(self.vocab, np.float32)
        out[self.script[pos0 + len(ids) - 1]] = 1.0
        return out


def test_engine_stop_ids():
    from minfer.batch import single

    script = [0, 0, 5, 6, 2, 7, 7, 7]  # after the 2-token prompt: 5 6 2 7 ...
    r = single.run(_Scripted(script[1:]), [3, 4], n_greedy=6, n_ctx=64)
    assert r.greedy_ids == [5, 6, 2, 7, 7, 7]  # no stop: through EOS
    be = _Scripted(script[1:])
    r = single.run(be, [3, 4], n_greedy=6, n_ctx=64, stop_ids={2})
    assert r.greedy_ids == [5, 6, 2] and be.calls == 3  # the prefill + two decode steps
    assert len(r.step_margins) == 3 and r.decode_tok_s > 0


def test_eog_ids(tok):
    assert tok.eos_id in tok.eog_ids
    assert {tok.token_to_id["<|im_end|>"], tok.token_to_id["<|endoftext|>"]} <= tok.eog_ids
    assert tok.token_to_id["<|im_start|>"] not in tok.eog_ids
