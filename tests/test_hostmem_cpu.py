"""Host memory: the CPU backend refuses what will not fit (exit 3, one line naming both numbers)
before allocating, and a MemoryError anyway is one line, exit 3 (issues 20 and 24)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inproc import error_lines  # noqa: E402
from synth_data import small_parts, write_small  # noqa: E402


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(write_small(tmp_path_factory.mktemp("hm") / "m.gguf", *small_parts()))


def test_headroom_reads_this_machine():
    from minfer.host import hostmem

    room, limit = hostmem.headroom()
    assert room is not None and room > 0  # Linux: /proc/meminfo at least
    assert limit in ("MemAvailable", "ulimit -v", "ulimit -d")
    avail = hostmem.mem_available()
    assert avail is not None and room <= avail


def test_headroom_sees_rlimit_as():
    code = (
        "import resource; from minfer.host import hostmem; "
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY)); "
        "r, l = hostmem.headroom(); print(r, l)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) < 2 << 30
    assert " ".join(out[1:]) in ("ulimit -v", "MemAvailable")


def test_preload_refused_when_weights_do_not_fit(small_model, monkeypatch):
    from minfer.errors import ResourceError
    from minfer.host import hostmem
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(small_model, max_tokens=8)
    need = be.preload_bytes()
    sizes = [
        int(np.prod(t.shape)) for n, t in small_model.tensors.items() if n != "token_embd.weight"
    ] + [
        int(np.prod(small_model.tensors["token_embd.weight"].shape))
    ]  # tied: the LM head is the table
    assert need >= 4 * sum(sizes)
    monkeypatch.setattr(hostmem, "headroom", lambda: (need // 2, "ulimit -v"))
    with pytest.raises(ResourceError) as e:
        be.preload()
    msg = str(e.value)
    assert e.value.exit_code == 3
    assert hostmem.fmt_bytes(need // 2) in msg and "needed" in msg and "ulimit -v" in msg
    assert not be._w  # nothing converted before the refusal
    monkeypatch.setattr(hostmem, "headroom", lambda: (10 * need, "MemAvailable"))
    be.preload()
    assert be._w


def test_forward_refused_when_attention_does_not_fit(small_model, monkeypatch):
    from minfer.errors import ResourceError
    from minfer.host import hostmem
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(small_model, max_tokens=200)
    be.preload()
    monkeypatch.setattr(hostmem, "headroom", lambda: (be.forward_bytes(100, 100) - 1, "x"))
    be.forward(np.arange(10, dtype=np.int32), 0)  # small: fits
    be.reset()
    with pytest.raises(ResourceError, match="CPU forward of 100 tokens"):
        be.forward(np.arange(100, dtype=np.int32) % 200, 0)


def test_memory_error_is_one_line_exit_3(small_model, monkeypatch):
    from minfer.errors import ResourceError
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(small_model, max_tokens=8)

    def boom(*a, **k):
        raise MemoryError("Unable to allocate 4.00 TiB")

    monkeypatch.setattr(small_model, "dequant", boom)
    with pytest.raises(ResourceError, match="out of host memory while converting"):
        be.preload()
    with pytest.raises(ResourceError, match="out of host memory while running the CPU forward"):
        be.forward(np.array([1, 2], dtype=np.int32), 0)


@pytest.mark.slow
def test_prefill_under_ulimit_v_is_exit_3(default_model_path):
    # issue 24: `ulimit -v 700000` during a CPU prefill ended in an _ArrayMemoryError traceback
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (700_000 * 1024, resource.RLIM_INFINITY))

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "minfer",
            "prefill",
            "-m",
            str(default_model_path),
            "--backend",
            "cpu",
            "--greedy",
            "2",
        ],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
    )
    assert r.returncode == 3, r.stderr[-2000:]
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "needed" in lines[0] and "available (ulimit -v)" in lines[0]


def test_huge_tensor_in_a_sparse_file_is_exit_3(tmp_path):
    # issue 24: a header claiming a giant (valid-shaped) tensor in a sparse file ended in
    # numpy's `Unable to allocate 4.00 TiB` traceback; now the preload check refuses it
    import os
    import struct

    from cli_inproc import run_cli

    from minfer.gguf.header import read_header

    meta, tensors = small_parts(tied=True)
    meta.pop("llama.vocab_size")  # the vocab is the table's row count
    tensors = tensors[1:] + tensors[:1]  # token_embd last: its growth moves no other tensor
    p = write_small(tmp_path / "huge.gguf", meta, tensors)
    emb = next(t for t in read_header(p).tensors if t.name == "token_embd.weight")
    buf = bytearray(p.read_bytes())
    at = buf.index(b"token_embd.weight") + len(b"token_embd.weight") + 4  # past n_dims
    rows = 2**31 - 1  # F16 [rows, 64]: a 275 GB file, 512 GiB as f32
    struct.pack_into("<Q", buf, at + 8, rows)
    p.write_bytes(bytes(buf))
    os.truncate(p, emb.offset + rows * 64 * 2)
    if os.stat(p).st_blocks * 512 > 1 << 30:
        pytest.skip("this filesystem does not keep files sparse")
    try:
        code, out, err = run_cli(
            ["prefill", "-m", str(p), "--backend", "cpu", "-p", "hi", "--greedy", "2"]
        )
    finally:
        p.unlink()  # a 275 GB apparent size: not left for tools that walk /tmp
    assert code == 3, err
    lines = error_lines(err)
    assert len(lines) == 1 and err.count("\n") == 1, err
    assert "not enough host memory" in lines[0] and "TiB needed" in lines[0]
