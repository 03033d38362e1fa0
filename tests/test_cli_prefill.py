"""`minfer prefill` end to end on the default model (CPU backend): JSON output, exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_golden import MAX_DIFF

from minfer.cli import main


@pytest.fixture(autouse=True)
def _reuse_loaded_model(monkeypatch, default_model, default_model_path):
    """Opening the GGUF costs ~8 s on 2 cores (gguf's reader parses 98k vocab/merge strings):
    the command gets the session's already-opened default model instead."""
    import minfer.gguf.loader

    real = minfer.gguf.loader.load_model

    def load(path):
        return default_model if str(path) == str(default_model_path) else real(path)

    monkeypatch.setattr(minfer.gguf.loader, "load_model", load)


def _run(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["prefill", *args])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_prefill_json_default_prompt(capsys, default_model_path, golden_q4_1):
    # --no-chat: the golden prompt 0 as plain text (the default run is a chat, test_cli_chat.py)
    code, out, err = _run(capsys, "--backend", "cpu", "--json", "--greedy", "4", "--no-chat")
    assert code == 0, err
    d = json.loads(out)  # exactly one JSON object on stdout, nothing else
    for key in (
        "model",
        "backend",
        "prompt_ids",
        "greedy_ids",
        "greedy_text",
        "prefill_tok_s",
        "decode_tok_s",
        "load_s",
        "n_prompt",
    ):
        assert key in d, key
    p0 = golden_q4_1["prompts"][0]
    assert d["backend"] == "cpu" and d["model"] == str(default_model_path)
    assert d["prompt_ids"] == p0["prompt_ids"] and d["n_prompt"] == len(p0["prompt_ids"])
    assert len(d["greedy_ids"]) == 4 and d["prefill_tok_s"] > 0 and d["decode_tok_s"] > 0
    from minfer.tools.gates import compare_greedy

    v = compare_greedy(
        d["greedy_ids"],
        p0["greedy32_ids"][:4],
        p0["greedy32_top1_top2_margin"][:4],
        tau=2 * MAX_DIFF,
    )
    assert v.ok, v.describe()
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(load_model(default_model_path).metadata)
    assert d["greedy_text"] == tok.decode(d["greedy_ids"])


def test_prefill_text_output(capsys, default_model_path):
    code, out, err = _run(
        capsys, "--backend", "cpu", "-p", "Hello", "--greedy", "2", "--dtype", "f64"
    )
    assert code == 0, err
    assert "cpu-f64 (requested)" in out and "prompt   1 token\n" in out  # not "1 tokens"
    for word in ("prefill", "decode", "load", "greedy", "text"):
        assert word in out


@pytest.mark.parametrize(
    "args,code,msg",
    [
        (["-p", ""], 2, "empty prompt"),
        (["--greedy", "-3"], 2, "-n/--n-predict must be >= 0"),
        (
            ["-n", "9000", "--no-chat"],
            2,
            "9 tokens + 9000 greedy tokens = 9009 exceeds the model's context of 8192",
        ),
        (["-c", "-1"], 2, "-c/--ctx-size must be >= 0"),
        (["-c", "9000"], 2, "-c/--ctx-size 9000 exceeds the model's context of 8192"),
        (
            ["--no-chat", "-c", "12", "-n", "4"],
            2,
            "prompt of 9 tokens + 4 generated tokens = 13 exceeds -c/--ctx-size 12",
        ),
        (["--ubatch", "0"], 2, "--ubatch"),
        (["-p", "x", "--prompt-file", "f.txt"], 2, "not both"),
    ],
)
def test_prefill_bad_input(capsys, default_model_path, args, code, msg):
    got, out, err = _run(capsys, "--backend", "cpu", *args)
    assert got == code and msg in err and out == ""


def test_prefill_n_predict_and_ctx_size(capsys, default_model_path):
    # -n is llama.cpp's name for the generated-token count; a context that just fits runs
    code, out, err = _run(capsys, "--backend", "CPU", "--no-chat", "-n", "2", "-c", "11", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["n_prompt"] == 9 and len(d["greedy_ids"]) == 2 and d["backend"] == "cpu"


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--ubatch", "0"], 2, "--ubatch"),
        (["-n", "-3"], 2, "--n-predict"),
        (["-c", "-2"], 2, "--ctx-size"),
        (["--no-chat", "--system", "s"], 2, "--system"),
        (["--backend", "cuda"], 3, "--backend cpu"),
    ],
)
def test_prefill_checks_options_before_fetching_the_model(
    monkeypatch, capsys, tmp_path, args, code, needle
):
    """Options and the backend are checked before the 93 MB default model is fetched."""
    import minfer.gguf.fetch as F

    if "cuda" in args:
        from minfer.cuda.runtime.runtime import gpu_available

        if gpu_available():
            pytest.skip("a GPU is present")
    monkeypatch.setenv("MINFER_MODELS", str(tmp_path / "empty"))
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("model fetched"))
    monkeypatch.setattr(F, "_fetch", lambda *a, **k: pytest.fail("model fetched"))
    with pytest.raises(SystemExit) as e:
        main(["prefill", *args])
    err = capsys.readouterr().err
    assert e.value.code == code and needle in err and "fetching" not in err
    assert not (tmp_path / "empty").exists()


def test_prefill_prompt_file(capsys, default_model_path, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("caf\u00e9 ".encode() + b"\xff\xfe")
    code, _, err = _run(capsys, "--backend", "cpu", "--prompt-file", str(bad))
    assert code == 2 and str(bad) in err and "byte offset 6" in err
    code, _, err = _run(capsys, "--backend", "cpu", "--prompt-file", str(tmp_path / "nope"))
    assert code == 2 and "no such prompt file" in err
    good = tmp_path / "p.txt"
    good.write_text("The name of the capital city of France is", encoding="utf-8")
    code, out, err = _run(
        capsys, "--backend", "cpu", "--prompt-file", str(good), "--json", "--greedy", "1"
    )
    assert code == 0, err
    assert json.loads(out)["greedy_ids"] == [7042]  # " Paris", llama.cpp margin 2.05 > 2*MAX_DIFF


def test_prefill_cuda_without_gpu_names_cpu(capsys, default_model_path):
    from minfer.cuda.runtime.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    code, out, err = _run(capsys, "--backend", "cuda", "--greedy", "1")
    assert code == 3 and "--backend cpu" in err and out == ""
    code, _, err = _run(capsys, "--backend", "cuda", "--dtype", "f64")
    assert code == 2 and "--dtype" in err


def test_engine_rejects_context_overflow_with_large_greedy(default_model):
    from minfer.batch import single
    from minfer.errors import BadInput
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(default_model)
    with pytest.raises(BadInput, match="exceeds the model's context of 8192"):
        single.run(be, [1, 2, 3], n_greedy=8190)
    assert be._w == {}  # rejected before any weight was dequantized
    assert np.all(be._k[0] == 0)
