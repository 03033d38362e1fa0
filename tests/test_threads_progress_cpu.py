"""CPU backend conveniences (issue 20): -t/--threads limits the BLAS pool; progress for a
single-chunk CPU prefill (per layer) and for decode (per token), on terminals only."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inproc import error_lines, run_cli  # noqa: E402
from synth_data import small_parts, write_small  # noqa: E402


@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("tp") / "m.gguf", *small_parts())


@pytest.fixture
def restore_threads():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=None):  # restores the pools' sizes on exit
        yield


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def test_physical_cores_within_affinity():
    from minfer.host.threads import physical_cores

    n = physical_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))


def test_threads_option_limits_the_blas_pool(small_path, restore_threads):
    if not _blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl sees")
    code, out, err = run_cli(
        [
            "prefill",
            "-m",
            str(small_path),
            "--backend",
            "cpu",
            "-t",
            "1",
            "-p",
            "hi",
            "--greedy",
            "2",
        ]
    )
    assert code == 0, err
    assert _blas_threads() == {1}
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


def test_threads_env_fallback_without_threadpoolctl(monkeypatch):
    from minfer.host import threads

    for k in threads._ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails
    assert threads.set_threads(3) == "env"
    assert all(os.environ[k] == "3" for k in threads._ENV)


@pytest.mark.parametrize("cmd", [["prefill"], ["bench"], ["check"]])
def test_threads_zero_refused_before_any_work(cmd, tmp_path):
    missing = tmp_path / "nope.gguf"  # never opened: the option is checked first
    code, out, err = run_cli(cmd + ["-m", str(missing), "-t", "0"])
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and "--threads must be >= 1" in lines[0]


def test_prefill_help_says_what_the_cpu_path_is_for():
    code, out, _ = run_cli(["prefill", "--help"])
    assert code == 0
    flat = " ".join(out.split())
    assert "correctness oracle" in flat and "-t, --threads" in flat


# -- progress ------------------------------------------------------------------------------------
class _TTY(io.StringIO):
    def isatty(self):
        return True


def _run_with_stderr(monkeypatch, stream, model_path, n_prompt, n_greedy, ubatch=512):
    from minfer.batch import single
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(load_model(model_path), max_tokens=n_prompt + n_greedy)
    monkeypatch.setattr(sys, "stderr", stream)
    res = single.run(
        be, list(range(1, n_prompt + 1)), n_greedy=n_greedy, ubatch=ubatch, progress=True
    )
    monkeypatch.undo()
    assert be.layer_hook is None  # detached after prefill
    return res


def test_progress_per_layer_and_per_token_on_a_terminal(monkeypatch, small_path):
    tty = _TTY()
    res = _run_with_stderr(monkeypatch, tty, small_path, 20, 5)
    text = tty.getvalue()
    # (tqdm redraws at most every 0.1 s: the totals show what is counted)
    assert "prefill" in text and "0/2" in text and "layer" in text  # single chunk: 2 layers
    assert "decode" in text and "0/4" in text  # 5 greedy ids: 4 single-token steps
    assert len(res.greedy_ids) == 5 and np.isfinite(res.last_logits).all()


def test_progress_multi_chunk_counts_layers_of_all_chunks(monkeypatch, small_path):
    tty = _TTY()
    _run_with_stderr(monkeypatch, tty, small_path, 20, 1, ubatch=8)  # 3 chunks x 2 layers
    assert "0/6" in tty.getvalue() and "decode" not in tty.getvalue()


def test_layer_hook_called_once_per_layer(small_path):
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(load_model(small_path), max_tokens=8)
    calls = []
    be.layer_hook = lambda: calls.append(1)
    be.forward(np.arange(1, 5, dtype=np.int32), 0)
    assert len(calls) == be.cfg.n_layers


def test_no_progress_when_not_a_terminal(monkeypatch, small_path):
    plain = io.StringIO()
    _run_with_stderr(monkeypatch, plain, small_path, 20, 5)
    assert plain.getvalue() == ""
