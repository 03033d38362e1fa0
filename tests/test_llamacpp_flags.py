"""A llama.cpp user's command lines (issue 36): the flags whose meaning is the same are ours
(prefill -f, -n -1, -ub; perplexity -c; bench -p / -r; quantize IN OUT TYPE [NTHREADS]), the
ones with no meaning here are one note on stderr each and the command goes on (never a
misparse like -ngl read as -n gl), and docs/llamacpp.md's table names each of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_inproc import error_lines, run_cli
from synth_data import tiny_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_model(tmp_path_factory.mktemp("lcpp"), seed=7, vocab=512, qtype="q8_0"))


def _prefill(tiny, *args):
    return run_cli(["prefill", "-m", tiny, "--backend", "cpu", "--json", *args])


def test_prefill_f_is_the_prompt_file_less_one_trailing_newline(tiny, tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("hello world\n\n")  # llama.cpp's -f drops one trailing newline, not two
    code, out, err = _prefill(tiny, "-f", str(p), "-n", "1")
    assert code == 0, err
    code2, out2, _ = _prefill(tiny, "-p", "hello world\n", "-n", "1")
    assert json.loads(out)["prompt_ids"] == json.loads(out2)["prompt_ids"]
    code3, out3, _ = _prefill(tiny, "--file", str(p), "-n", "1")
    assert json.loads(out3)["prompt_ids"] == json.loads(out)["prompt_ids"]


def test_prefill_prompt_from_stdin_drops_one_newline(tiny, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello world\n")))
    code, out, err = _prefill(tiny, "--prompt-file", "-", "-n", "1")
    assert code == 0, err
    want = json.loads(_prefill(tiny, "-p", "hello world", "-n", "1")[1])["prompt_ids"]
    assert json.loads(out)["prompt_ids"] == want


def test_prompt_with_a_nul_byte_is_one_note(tiny, tmp_path):
    # kept and tokenized, as llama.cpp does (tests/test_faults_cpu.py pins the ids), but said
    p = tmp_path / "utf16.txt"
    p.write_bytes("hi".encode("utf-16-le"))
    code, out, err = _prefill(tiny, "-f", str(p), "-n", "1")
    assert code == 0 and err.count("\n") == 1
    assert err.startswith(
        f"minfer: {p}: the prompt holds 2 NUL byte(s), the first at character 1; tokenized as text"
    )
    assert (
        run_cli(["prefill", "-m", tiny, "--backend", "cpu", "-f", str(p), "-n", "1", "-q"])[2] == ""
    )


def test_n_minus_one_runs_to_the_end_of_the_context(tiny):
    code, out, err = _prefill(tiny, "-p", "abc", "-n", "-1", "-c", "12", "--no-stop-at-eos")
    assert code == 0, err
    d = json.loads(out)
    assert d["n_prompt"] + len(d["greedy_ids"]) == 12
    # with EOS on (the default of -n -1) it ends at EOS or at the same place
    d2 = json.loads(_prefill(tiny, "-p", "abc", "-n", "-1", "-c", "12")[1])
    assert d2["greedy_ids"] == d["greedy_ids"][: len(d2["greedy_ids"])]
    assert d2["stopped_at_eos"] or len(d2["greedy_ids"]) == len(d["greedy_ids"])
    code, _, err = _prefill(tiny, "-p", "abc", "-n", "-3")
    assert code == 2 and "-n/--n-predict must be >= 0, or -1" in err


def test_ubatch_size_is_ubatch(tiny):
    code, out, err = _prefill(tiny, "-p", "abcdef", "-n", "1", "-ub", "2")
    assert code == 0, err
    assert "ignored" not in err


@pytest.mark.parametrize(
    "flags,shown",
    [
        (["-ngl", "99"], "-ngl 99 ignored"),
        (["--n-gpu-layers", "99"], "-ngl 99 ignored"),
        (["-fa", "on"], "-fa on ignored"),
        (["-fa"], "-fa on ignored"),  # the bare flag of older llama.cpp
        (["--flash-attn", "auto"], "-fa auto ignored"),
        (["--mlock"], "--mlock ignored"),
        (["--no-mmap"], "--no-mmap ignored"),
        (["--temp", "0.7"], "--temp 0.7 ignored"),
        (["-b", "2048"], "-b 2048 ignored"),
    ],
)
def test_meaningless_flags_are_one_note_and_the_run_goes_on(tiny, flags, shown):
    code, out, err = _prefill(tiny, *flags, "-p", "abc", "-n", "2")
    assert code == 0, err
    assert len(json.loads(out)["greedy_ids"]) == 2  # -n 2 still read as -n (not -ngl's n)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"minfer: {shown}: "), err


def test_ngl_never_misparses_as_n(tiny):
    code, out, err = _prefill(tiny, "-ngl", "99", "-p", "abc")
    assert code == 0, err
    assert len(json.loads(out)["greedy_ids"]) == 32  # the default -n


def test_quiet_silences_the_notes(tiny):
    code, out, err = _prefill(tiny, "-q", "-ngl", "99", "-p", "abc", "-n", "1")
    assert (code, err) == (0, "")


def test_a_value_that_is_not_one_is_refused(tiny, tmp_path):
    # `inspect -ngl model.gguf`: the model name is not a layer count, so it is not swallowed
    code, out, err = run_cli(["inspect", "-ngl", tiny])
    assert code == 2 and error_lines(err) and "-ngl" in err
    code, out, err = run_cli(["inspect", "-fa", tiny])
    assert code == 2 and "-fa" in error_lines(err)[0]


@pytest.mark.parametrize("cmd", ["inspect", "quantize", "synth", "perplexity", "bench", "check"])
def test_every_command_takes_them_and_q_v(cmd):
    from click.testing import CliRunner

    from minfer.cli import cli

    c = cli.commands[cmd]
    opts = {o for p in c.params for o in p.opts}
    assert {"-ngl", "-fa", "--mlock", "--no-mmap", "-q", "-v"} <= opts, cmd
    h = CliRunner().invoke(cli, [cmd, "--help"]).output
    assert "-ngl" not in h and "-q, --quiet" in h  # hidden: not our options


def test_inspect_with_llamacpp_flags(tiny):
    code, out, err = run_cli(["inspect", tiny, "--no-mmap", "-t", "4"])
    assert code == 0, err
    assert [ln.split(":")[0] for ln in err.splitlines()] == ["minfer", "minfer"]
    assert "--no-mmap ignored" in err and "-t 4 ignored" in err


def test_perplexity_c_is_the_context(tiny, tmp_path):
    from ppl_data import short_text  # noqa: F401  (the shipped text's head)

    txt = tmp_path / "t.txt"
    txt.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            tiny,
            "-f",
            str(txt),
            "--backend",
            "cpu",
            "-c",
            "32",
            "--chunks",
            "1",
            "--json",
        ]
    )
    assert code == 0, err
    assert json.loads(out)["ctx"] == 32
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            tiny,
            "-f",
            str(txt),
            "--backend",
            "cpu",
            "--ctx-size",
            "16",
            "--chunks",
            "1",
            "--json",
        ]
    )
    assert code == 0 and json.loads(out)["ctx"] == 16


def test_bench_p_and_r(tiny):
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            tiny,
            "--backend",
            "cpu",
            "-p",
            "3,5",
            "-r",
            "2",
            "--min-ms",
            "0",
            "-o",
            "json",
            "--no-breakdown",
            "-ngl",
            "99",
        ]
    )
    assert code == 0, err
    recs = json.loads(out)
    assert [r["n_prompt"] for r in recs] == [3, 5] and all(
        len(r["samples_tok_s"]) == 2 for r in recs
    )
    assert "-ngl 99 ignored" in err
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            tiny,
            "--backend",
            "cpu",
            "-p",
            "3",
            "-n",
            "128",
            "--min-ms",
            "0",
            "--repeats",
            "1",
            "-o",
            "json",
            "--no-breakdown",
        ]
    )
    assert code == 0, err
    assert "-n 128 ignored: minfer bench times prefill only" in err


def test_quantize_positional_type_and_threads(tiny, tmp_path):
    from minfer.gguf.header import read_header

    for i, args in enumerate(
        (["q8_0"], ["Q8_0", "1"], ["7"], ["--type", "q8_0", "-t", "1"], ["q8_0", "--type", "Q8_0"])
    ):
        out = tmp_path / f"o{i}.gguf"
        code, _, err = run_cli(["quantize", tiny, str(out), *args, "-q", "--allow-requantize"])
        assert code == 0, (args, err)
        assert len(read_header(out).tensors) == len(read_header(tiny).tensors)
    for args, needle in (
        (["q3_K_X"], "q3_K_X"),
        ([], "missing the output type"),
        (["q8_0", "x"], "NTHREADS"),
        (["q8_0", "--type", "f16"], "two types"),
        (["q8_0", "2", "3"], "unexpected extra"),
    ):
        code, _, err = run_cli(["quantize", tiny, str(tmp_path / "bad.gguf"), *args])
        assert code == 1 and needle in err, (args, err)
    assert not (tmp_path / "bad.gguf").exists()


def test_t_means_threads_everywhere(tmp_path):
    from click.testing import CliRunner

    from minfer.cli import cli

    for cmd in ("prefill", "bench", "perplexity", "check", "quantize", "synth"):
        h = CliRunner().invoke(cli, [cmd, "--help"]).output
        assert re.search(r"-t, --threads", h), cmd
    code, _, err = run_cli(
        [
            "synth",
            "--preset",
            "tiny",
            "-o",
            str(tmp_path / "s.gguf"),
            "--tokenizer-from",
            "none",
            "--vocab",
            "300",
            "-t",
            "1",
            "-q",
        ]
    )
    assert (code, err) == (0, "")
    code, _, err = run_cli(
        [
            "synth",
            "--preset",
            "tiny",
            "-o",
            str(tmp_path / "s2.gguf"),
            "--tokenizer-from",
            "none",
            "--vocab",
            "300",
            "--workers",
            "1",
            "-q",
        ]
    )
    assert code == 0, err


def test_the_docs_table_names_every_flag():
    from minfer.commands.llamacpp_flags import BENCH_IGNORED, IGNORED, REFUSED

    doc = (REPO / "docs" / "llamacpp.md").read_text()
    for names, _, _ in IGNORED + BENCH_IGNORED:
        assert f"`{names[0]}" in doc, names
    for names, _ in REFUSED:
        assert f"`{names[0]}" in doc, names
    for ours in (
        "-f",
        "-c",
        "-p",
        "-r",
        "-n -1",
        "--kl-divergence-base",
        "--kl-divergence",
        "IN OUT TYPE",
        "--ignore-eos",
        "--chat-template",
        "--allow-requantize",
        "--chunks -1",
        "avg_ts",
        "-o jsonl",
    ):
        assert ours in doc, ours


# -- llama-cli's conversation flags, --ignore-eos, --jinja, --chat-template --------------------------
def test_cnv_is_refused_not_misparsed(tiny):
    code, out, err = _prefill(tiny, "-cnv", "-p", "hi")
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "one-shot" in lines[0], err  # not `-c nv`
    assert out == ""
    code, out, err = _prefill(tiny, "--conversation", "-p", "hi")
    assert code == 2 and "one-shot" in err


@pytest.mark.parametrize(
    "flag,shown",
    [
        ("-no-cnv", "-no-cnv"),
        ("-st", "-st"),
        ("--jinja", "--jinja"),
        ("--no-conversation", "-no-cnv"),
        ("--single-turn", "-st"),
    ],
)
def test_one_shot_flags_are_no_ops(tiny, flag, shown):
    code, out, err = _prefill(tiny, flag, "-p", "hi", "-n", "2")
    assert code == 0, err  # -no-cnv was once `-n o-cnv`: exit 1
    assert f"{shown} ignored" in err
    d = json.loads(out)
    plain = json.loads(_prefill(tiny, "-p", "hi", "-n", "2")[1])
    assert d["greedy_ids"] == plain["greedy_ids"] and d["prompt_ids"] == plain["prompt_ids"]


def test_ignore_eos_runs_through_eos(tiny):
    """--ignore-eos is --no-stop-at-eos: with -n -1 the context is filled."""
    code, out, err = _prefill(tiny, "-p", "hi", "-n", "-1", "-c", "24", "--ignore-eos")
    assert code == 0, err
    d = json.loads(out)
    assert d["n_prompt"] + len(d["greedy_ids"]) == 24 and not d["stopped_at_eos"]
    from click.testing import CliRunner

    from minfer.cli import cli

    assert "--ignore-eos" in CliRunner().invoke(cli, ["prefill", "--help"]).output


def test_chat_template_builtin_and_file(tiny, tmp_path):
    from minfer.gguf.loader import load_model
    from minfer.text.chat import BUILTIN
    from minfer.text.tokenizer import Tokenizer

    code, out, err = _prefill(tiny, "--chat", "-p", "hi", "-n", "1")
    assert code == 2 and "--chat-template" in error_lines(err)[0]  # no template in the file
    tok = Tokenizer.from_metadata(load_model(tiny).metadata)
    for name in BUILTIN:
        code, out, err = _prefill(
            tiny,
            "--chat",
            "-p",
            "hi",
            "-n",
            "1",
            "--chat-template",
            name.upper() if name == "gemma" else name,
        )
        assert code == 0, (name, err)
        d = json.loads(out)
        assert d["chat"] and d["n_prompt"] > len(tok.encode("hi")) + 4, name
    t = tmp_path / "t.jinja"
    t.write_text("<<{{ messages[-1]['content'] }}>>")
    code, out, err = _prefill(tiny, "--chat", "-p", "hi", "-n", "1", "--chat-template", str(t))
    assert code == 0, err
    assert json.loads(out)["prompt_ids"] == tok.encode("<<hi>>")
    for bad, says in (("nope", "not a built-in template"), (str(tmp_path), "directory")):
        code, out, err = _prefill(tiny, "--chat", "-p", "hi", "--chat-template", bad)
        assert code == 2 and says in error_lines(err)[0], err


def test_builtin_templates_render_llama_cpps_formats():
    from minfer.text.chat import BUILTIN, _environment

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    got = {
        k: _environment()
        .from_string(t)
        .render(messages=msgs, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
        for k, t in BUILTIN.items()
    }
    assert got["chatml"] == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert got["llama3"] == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert got["gemma"] == ("<s><start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\n")
    assert got["phi3"] == "<|system|>\nS<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert got["mistral"] == "<s>[INST] S\n\nHi [/INST]"
