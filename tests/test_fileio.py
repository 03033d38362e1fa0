"""Special files, full disks, unwritable places, control characters: one `error:` line each.

Inputs are refused by type before an open() that could block (a FIFO) or never end
(/dev/zero); outputs never replace a device, FIFO or directory and leave no temporary file;
write failures on outputs and on stdout are exit 3 (2 for a bad path). Cases that would hang
or eat memory without the fix run as subprocesses with a timeout and a memory limit.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minfer.errors import BadInput, ResourceError
from minfer.host.fileio import (
    atomic_output,
    check_input_file,
    escape_controls,
    prompt_cap,
    read_prompt_file,
)

REPO = Path(__file__).resolve().parent.parent


def _cli(*args, timeout=120, stdout=subprocess.PIPE, limit_fsize=None, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def pre():
        # a missing fix must not eat the machine: 4 GB of address space at most
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if limit_fsize:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, limit_fsize))

    r = subprocess.run(
        [sys.executable, "-m", "minfer", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=timeout,
        env=env,
        preexec_fn=pre,
        **kw,
    )
    out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else ""
    return r.returncode, out, r.stderr.decode(errors="replace")


def _one_error_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _main(capsys, argv):
    from minfer.cli import main

    with pytest.raises(SystemExit) as ei:
        main(argv)
    out, err = capsys.readouterr()
    return ei.value.code, out, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("fileio_tiny"), seed=5)


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


def _char_device(folder: Path) -> Path:
    """A private twin of /dev/null (so a failing test cannot replace the real one)."""
    p = folder / "null"
    try:
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot make a device node here (not root)")
    return p


# ---- the module itself ---------------------------------------------------------------------


def test_check_input_file_refuses_by_type(tmp_path, fifo):
    reg = tmp_path / "f"
    reg.write_bytes(b"x")
    assert check_input_file(reg, "model").st_size == 1
    for p, kind in [
        (fifo, "FIFO"),
        (tmp_path, "directory"),
        (Path("/dev/zero"), "character"),
        (tmp_path / "none", "no such"),
    ]:
        with pytest.raises(BadInput, match=kind):
            check_input_file(p, "model")


def test_atomic_output_removes_temp_and_maps_errors(tmp_path):
    out = tmp_path / "o.bin"
    out.write_bytes(b"old")
    for err, cls, code in [
        (errno.ENOSPC, ResourceError, 3),
        (errno.EDQUOT, ResourceError, 3),
        (errno.EACCES, BadInput, 2),
        (errno.EROFS, BadInput, 2),
    ]:
        with pytest.raises(cls) as ei:
            with atomic_output(out) as tmp:
                tmp.write_bytes(b"partial")
                raise OSError(err, os.strerror(err))
        assert ei.value.exit_code == code and "\n" not in str(ei.value)
        assert sorted(os.listdir(tmp_path)) == ["o.bin"] and out.read_bytes() == b"old"
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(out) as tmp:
            tmp.write_bytes(b"partial")
            raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["o.bin"] and out.read_bytes() == b"old"
    with atomic_output(out) as tmp:
        tmp.write_bytes(b"new")
    assert sorted(os.listdir(tmp_path)) == ["o.bin"] and out.read_bytes() == b"new"


def test_escape_controls_keeps_unicode():
    assert escape_controls("a\nb\r\x1b[31m\u2028é漢") == "a\\nb\\r\\x1b[31m\\u2028é漢"


def test_prompt_cap_tied_to_context(tmp_path):
    assert prompt_cap(1000) == 1 << 20 and prompt_cap(1 << 20) == 16 << 20
    p = tmp_path / "p.txt"
    p.write_bytes(b"a" * ((1 << 20) + 1))
    with pytest.raises(BadInput, match="1,048,576 bytes"):
        read_prompt_file(str(p), n_ctx=2048)
    assert len(read_prompt_file(str(p), n_ctx=1 << 17)) == (1 << 20) + 1


# ---- outputs -------------------------------------------------------------------------------


def test_quantize_refuses_directory_writes_through_device(tmp_path, tiny, capsys):
    code, _, err = _main(
        capsys, ["quantize", str(tiny), str(tmp_path), "--type", "q8_0", "--quiet"]
    )
    assert code == 2, err
    _one_error_line(err, "directory", "refusing")
    dev = _char_device(tmp_path)
    code, _, err = _main(
        capsys, ["quantize", str(tiny), str(dev), "--type", "q8_0", "--quiet", "--allow-requantize"]
    )
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(dev).st_mode)  # written through, never renamed over
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


@pytest.mark.parametrize(
    "out,needle",
    [
        ("/proc/x.gguf", "/proc/x.gguf"),
        ("/sys/x.gguf", "/sys/x.gguf"),
        ("{tmp}/nodir/x.gguf", "no such directory"),
        ("{tmp}", "directory"),
    ],
)
def test_synth_bad_outputs_one_line(tmp_path, capsys, out, needle):
    out = out.format(tmp=tmp_path)
    code, _, err = _main(
        capsys,
        [
            "synth",
            "-o",
            out,
            "--preset",
            "tiny",
            "--vocab",
            "512",
            "--tokenizer-from",
            "none",
            "--workers",
            "1",
            "--quiet",
        ],
    )
    assert code == 2, err
    _one_error_line(err, needle)


def test_quantize_disk_full_exit_3(tmp_path, tiny):
    # RLIMIT_FSIZE: writes past 64 KiB fail with EFBIG, as a full disk fails with ENOSPC
    code, _, err = _cli(
        "quantize",
        str(tiny),
        str(tmp_path / "o.gguf"),
        "--type",
        "q8_0",
        "--threads",
        "1",
        "--quiet",
        "--allow-requantize",
        limit_fsize=64 << 10,
    )
    assert code == 3, err
    _one_error_line(err, "o.gguf")
    assert os.listdir(tmp_path) == []


def test_progress_bars_only_on_terminals(tmp_path, tiny):
    code, _, err = _cli(
        "quantize",
        str(tiny),
        str(tmp_path / "o.gguf"),
        "--type",
        "q8_0",
        "--threads",
        "1",
        "--allow-requantize",
    )
    assert code == 0, err
    assert "\r" not in err and "it/s" not in err and "w/s]" not in err


# ---- output targets: links resolved, devices and FIFOs written through ----------------------


def _write(path, data: bytes = b"new"):
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def test_output_through_symlink_replaces_its_target(tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    _write(link)
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link kept
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["link", "real.jsonl"]  # no temporary left


def test_output_through_dangling_symlink_creates_target(tmp_path):
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link"
    link.symlink_to("sub/new.jsonl")  # relative, as `ln -s` makes them
    _write(link)
    assert link.is_symlink() and (tmp_path / "sub" / "new.jsonl").read_bytes() == b"new"
    gone = tmp_path / "gone"
    gone.symlink_to(tmp_path / "nodir" / "x")
    with pytest.raises(BadInput, match="no such directory"):
        _write(gone)
    assert gone.is_symlink()


def test_output_to_dev_null_written_through(tmp_path):
    _write("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    _write(link)
    assert link.is_symlink()
    with pytest.raises(ResourceError, match="/dev/full"):  # a full device: exit 3
        _write("/dev/full")


def test_output_to_fifo_read_by_a_thread(tmp_path, fifo):
    import threading

    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    _write(fifo, b"x" * 200_000)  # beyond a pipe's buffer: the reader drains it
    reader.join(timeout=30)
    assert got == [b"x" * 200_000]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["pipe"]


def _prompts(tmp_path, n=3):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(f'"prompt number {i}"\n' for i in range(n)))
    return p


def test_prefill_prompts_through_proc_self_fd_link(tmp_path, tiny):
    """`ln -s /proc/self/fd/1 so; minfer prefill --prompts p -o so > r.jsonl`: r.jsonl holds
    the records (once an empty file, `so` replaced by a regular file)."""
    so = tmp_path / "so"
    so.symlink_to("/proc/self/fd/1")
    r = tmp_path / "r.jsonl"
    with open(r, "wb") as f:
        code, _, err = _cli(
            "prefill",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--prompts",
            str(_prompts(tmp_path)),
            "-n",
            "1",
            "-o",
            str(so),
            "-q",
            stdout=f,
        )
    assert code == 0, err
    assert so.is_symlink()
    assert len(r.read_text().splitlines()) == 3
    code, out, err = _cli(
        "prefill",
        "-m",
        str(tiny),
        "--backend",
        "cpu",
        "--prompts",
        str(_prompts(tmp_path)),
        "-n",
        "1",
        "-o",
        "/dev/stdout",
        "-q",
    )
    assert code == 0, err
    assert len(out.splitlines()) == 3 and os.path.islink("/dev/stdout")


def test_prefill_prompts_stdout_full_exit_3(tmp_path, tiny):
    with open("/dev/full", "w") as full:
        code, _, err = _cli(
            "prefill",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--prompts",
            str(_prompts(tmp_path)),
            "-n",
            "1",
            stdout=full,
        )
    assert code == 3
    _one_error_line(err, "standard output")


def test_prefill_prompts_closed_pipe_quiet_exit_0(tmp_path, tiny):
    """`prefill --prompts p | head -1` after head has gone: the first record meets EPIPE
    (the reader closed first, so the write cannot land in the pipe's buffer)."""
    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        code, _, err = _cli(
            "prefill",
            "-m",
            str(tiny),
            "--backend",
            "cpu",
            "--prompts",
            str(_prompts(tmp_path)),
            "-n",
            "1",
            "-q",
            stdout=wfd,
        )
    finally:
        os.close(wfd)
    assert (code, err) == (0, "")
    sh = (
        f"{sys.executable} -m minfer prefill -m {tiny} --backend cpu --prompts "
        f"{_prompts(tmp_path, 40)} -n 1 -q | head -1; exit ${{PIPESTATUS[0]}}"
    )
    r = subprocess.run(
        ["bash", "-c", sh],
        capture_output=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert r.returncode == 0 and r.stderr == b"", r.stderr[-2000:]
    assert len(r.stdout.splitlines()) == 1


# ---- inputs --------------------------------------------------------------------------------


def test_fifo_model_and_prompt_do_not_block(tmp_path, tiny, fifo):
    code, _, err = _cli("inspect", str(fifo), timeout=60)
    assert code == 2
    _one_error_line(err, "FIFO")
    code, _, err = _cli("prefill", "-m", str(fifo), "--backend", "cpu", "-p", "hi", timeout=60)
    assert code == 2
    _one_error_line(err, "FIFO")
    code, _, err = _cli(
        "prefill", "-m", str(tiny), "--backend", "cpu", "--prompt-file", str(fifo), timeout=60
    )
    assert code == 2
    _one_error_line(err, "FIFO")


def test_dev_zero_prompt_refused_fast(tiny):
    code, _, err = _cli(
        "prefill", "-m", str(tiny), "--backend", "cpu", "--prompt-file", "/dev/zero", timeout=60
    )
    assert code == 2
    _one_error_line(err, "character device")


def test_prompt_file_dash_reads_stdin_with_cap(tiny):
    code, out, err = _cli(
        "prefill",
        "-m",
        str(tiny),
        "--backend",
        "cpu",
        "--prompt-file",
        "-",
        "--greedy",
        "2",
        input=b"hello world",
    )
    assert code == 0, err
    code, _, err = _cli(
        "prefill",
        "-m",
        str(tiny),
        "--backend",
        "cpu",
        "--prompt-file",
        "-",
        stdin=open("/dev/zero", "rb"),
    )
    assert code == 2
    _one_error_line(err, "stdin", "bytes")


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{dir}"],
        ["prefill", "-m", "{dir}", "-p", "x"],
        ["quantize", "{dir}", "{dir}/o.gguf", "--type", "q8_0"],
    ],
)
def test_directory_as_model_exit_2_one_line(tmp_path, capsys, argv):
    argv = [a.format(dir=tmp_path) for a in argv]
    code, _, err = _main(capsys, argv)
    assert code == 2, err
    _one_error_line(err, "directory")


# ---- error lines and stdout ----------------------------------------------------------------


def test_newline_in_path_stays_one_line(tmp_path, capsys):
    bad = str(tmp_path / "evil\nerror: forged.gguf")
    code, _, err = _main(capsys, ["inspect", bad])
    assert code == 2
    line = _one_error_line(err, "evil\\nerror: forged.gguf")
    assert line.count("error:") == 2  # the forged one is inside the escaped path


def test_inspect_escapes_metadata(tmp_path, tiny, capsys):
    from minfer.gguf.loader import load_model
    from minfer.gguf.write import metadata_from_reader, write_gguf

    m = load_model(tiny)
    meta = metadata_from_reader(m)
    meta["evil\nkey"] = "red \x1b[31m text\r\nline"
    tensors = [
        (n, t.qtype, t.shape, lambda t=t: t.data.reshape(-1).view("uint8"))
        for n, t in m.tensors.items()
    ]
    out = write_gguf(tmp_path / "evil.gguf", m.config.arch, meta, tensors, progress=False)
    code, text, err = _main(capsys, ["inspect", str(out)])
    assert code == 0, err
    assert "\x1b" not in text and "\r" not in text
    lines = [x for x in text.splitlines() if x.startswith("  ") and "evil" in x]
    assert lines == ["  evil\\nkey = 'red \\x1b[31m text\\r\\nline'"], lines


def test_stdout_full_and_closed_pipe(default_model_path):
    # the default model's --all-metadata output (49k tokens, merges) is far beyond a pipe's
    # buffer, so the closed pipe is met while writing
    with open("/dev/full", "w") as full:
        code, _, err = _cli("inspect", str(default_model_path), stdout=full)
    assert code == 3
    _one_error_line(err, "standard output")
    p = subprocess.Popen(
        [sys.executable, "-m", "minfer", "inspect", "--all-metadata", str(default_model_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    p.stdout.readline()
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0  # the reader had enough: not an error (issue 36)
    assert err == "", err


def test_prompt_file_over_the_context_cap_refused(tmp_path, tiny):
    """Under the fixed pre-read cap (2 MiB) but over this model's context cap (1 MiB floor for
    a 256-token context): refused once the header says the context, naming the cap."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (prompt_cap(256) + 10))
    code, _, err = _cli(
        "prefill",
        "-m",
        str(tiny),
        "--backend",
        "cpu",
        "--prompt-file",
        str(big),
        "--greedy",
        "1",
        timeout=60,
    )
    assert code == 2
    _one_error_line(err, f"{prompt_cap(256):,} bytes", "context")


def test_every_progress_bar_goes_through_minfer_progress():
    """Bars only on terminals, everywhere: no module builds a tqdm bar but minfer/host/progress.py
    (a raw tqdm(...) once wrote \\r lines into redirected device logs from the GPU upload)."""
    import re

    raw = [
        str(p.relative_to(REPO))
        for p in (REPO / "minfer").rglob("*.py")
        if p.name != "progress.py" and re.search(r"\btqdm\(", p.read_text())
    ]
    assert raw == []
