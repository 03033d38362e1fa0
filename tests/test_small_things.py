"""Small things a user notices (issue 36, item 5): one version source, counts in words (`1
token`, `1 layer`), -c 0's meaning (prefill: the model's context, as llama.cpp; perplexity:
refused, as llama-perplexity), -q/-v on every command."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from cli_inproc import error_lines, run_cli

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    p = tmp_path_factory.mktemp("one") / "one.gguf"
    code, _, err = run_cli(
        [
            "synth",
            "--preset",
            "tiny",
            "--layers",
            "1",
            "-o",
            str(p),
            "--tokenizer-from",
            "none",
            "--vocab",
            "300",
            "-t",
            "1",
            "-q",
        ]
    )
    assert code == 0, err
    return str(p)


@pytest.mark.filterwarnings("ignore::UserWarning")  # setuptools: [tool.setuptools] is "beta"
def test_one_version_source():
    from setuptools.config.pyprojecttoml import read_configuration

    import minfer

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in proj and "version" in proj["dynamic"]
    conf = read_configuration(REPO / "pyproject.toml", expand=True)
    assert conf["project"]["version"] == minfer.__version__
    code, out, _ = run_cli(["--version"])
    assert code == 0 and out.strip().endswith(minfer.__version__)


def test_counts_in_words(one_layer, tmp_path):
    from minfer.host.words import plural

    assert (plural(1, "token"), plural(2, "token"), plural(1234, "layer")) == (
        "1 token",
        "2 tokens",
        "1,234 layers",
    )
    code, out, err = run_cli(["inspect", one_layer])
    assert code == 0, err
    assert ", 1 layer, d=" in out.splitlines()[0]
    code, out, err = run_cli(["prefill", "-m", one_layer, "--backend", "cpu", "-p", "a", "-n", "2"])
    assert code == 0, err
    assert "prompt   1 token\n" in out or "prompt   2 tokens\n" in out  # BOS or not
    assert "(1 single-token step," in out
    code, out, err = run_cli(
        [
            "synth",
            "--preset",
            "tiny",
            "--layers",
            "1",
            "-o",
            str(tmp_path / "s.gguf"),
            "--tokenizer-from",
            "none",
            "--vocab",
            "300",
            "-t",
            "1",
        ]
    )
    assert code == 0 and ", 1 layer, " in out


def test_ctx_0(one_layer, tmp_path):
    code, out, err = run_cli(
        ["prefill", "-m", one_layer, "--backend", "cpu", "-p", "ab", "-n", "1", "-c", "0", "--json"]
    )
    assert code == 0, err  # 0: the model's context, as llama.cpp's -c 0
    assert len(json.loads(out)["greedy_ids"]) == 1
    txt = tmp_path / "t.txt"
    txt.write_text("some text " * 50)
    code, out, err = run_cli(
        ["perplexity", "-m", one_layer, "-f", str(txt), "--backend", "cpu", "-c", "0"]
    )
    assert code == 2 and "--ctx must be >= 4" in error_lines(err)[0]  # llama-perplexity too


def test_quiet_and_verbose_on_every_command(one_layer, tmp_path):
    code, out, err = run_cli(
        ["quantize", one_layer, str(tmp_path / "q.gguf"), "q8_0", "-q", "--allow-requantize"]
    )
    assert (code, out, err) == (0, "", "")
    code, out, err = run_cli(["inspect", one_layer, "-v", "--mlock"])
    assert code == 0 and "--mlock ignored" in err
    code, out, err = run_cli(["inspect", one_layer, "-v", "-q", "--mlock"])
    assert (code, err) == (0, "")  # -q wins over -v
