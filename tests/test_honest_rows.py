"""Honest rows (issue 36): a GPU GEMM path asked of the CPU backend (bench --ab / --gemm,
prefill and perplexity --gemm) is refused with one `error:` line, exit 2, never the CPU's
figures under the path's name; a closed pipe on stdout (`minfer inspect M | head`) ends every
command quietly with exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inproc import run_cli
from synth_data import tiny_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_model(tmp_path_factory.mktemp("honest"), seed=11, vocab=512, qtype="q8_0"))


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["bench", "--backend", "cpu", "--ab", "f16", "blk"], "--ab 'f16': a GPU GEMM path"),
        (["bench", "--backend", "cpu", "--ab", "", "wide-kd8"], "--ab 'wide-kd8'"),
        (["bench", "--backend", "cpu", "--gemm", "f16"], "--gemm f16"),
        (["prefill", "--backend", "cpu", "--gemm", "blk", "-p", "hi"], "--gemm blk"),
        (["perplexity", "--backend", "cpu", "--gemm", "f16"], "--gemm f16"),
    ],
)
def test_gpu_path_on_the_cpu_backend_is_refused(tiny, argv, needle):
    code, out, err = run_cli([*argv, "-m", tiny])
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith(f"error: {needle}") and "--backend cuda" in err


def test_the_cpu_backend_alone_still_benches(tiny):
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            tiny,
            "--backend",
            "cpu",
            "-p",
            "3",
            "-r",
            "1",
            "--min-ms",
            "0",
            "--no-breakdown",
            "--gemm",
            "auto",
            "--ab",
            "",
        ]
    )
    assert code == 0, err
    assert "| default | cpu | 3 |" in out


def test_auto_cpu_names_why(tiny):
    from minfer.cuda.runtime.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    code, _, err = run_cli(["prefill", "-m", tiny, "--gemm", "f16", "-p", "hi"])
    assert code == 2 and "backend is cpu (auto: no usable GPU)" in err


def _closed_reader(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run `python -m minfer ARGV` with its stdout a pipe whose reader has gone."""
    r, w = os.pipe()
    os.close(r)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, "-m", "minfer", *argv],
        stdout=w,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        timeout=300,
        text=True,
    )
    os.close(w)
    return p.returncode, p.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{m}"],
        ["prefill", "-m", "{m}", "--backend", "cpu", "-p", "hi", "-n", "2"],
        ["quantize", "{m}", "out.gguf", "q8_0", "1", "--allow-requantize"],
        ["bench", "-m", "{m}", "--backend", "cpu", "-p", "3", "-r", "1", "--min-ms", "0"],
        ["perplexity", "-m", "{m}", "--backend", "cpu", "-c", "16", "--chunks", "1"],
        ["--help"],
    ],
    ids=["inspect", "prefill", "quantize", "bench", "perplexity", "help"],
)
def test_a_closed_pipe_is_exit_0_quietly(tiny, tmp_path, argv):
    code, err = _closed_reader([a.replace("{m}", tiny) for a in argv], tmp_path)
    assert (code, err) == (0, ""), err[-3000:]
    if argv[0] == "quantize":  # the file was written before the summary met the pipe
        assert (tmp_path / "out.gguf").is_file()


def test_inspect_into_head_exits_0(tiny):
    p = subprocess.run(
        [
            "bash",
            "-c",
            f'set -o pipefail; "{sys.executable}" -m minfer inspect '
            f'--all-metadata "{tiny}" | head -1',
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
    assert p.stdout.startswith("tiny.gguf")
