"""`minfer perplexity` as llama-perplexity prints and stores it (issue 36, item 2): `[i]x,`
streamed and flushed as each window ends (into a pipe too), `Final estimate: PPL = X +/- Y`,
the partial result on Ctrl-C / SIGTERM, and llama.cpp's --kl-divergence-base file, read
(--kld-base, or --kl-divergence-base F --kl-divergence) and written (--kl-divergence-base F).

The llama.cpp files here come from a writer of this test's own, made from the format as
llama.cpp's tools/perplexity/perplexity.cpp writes it (not from minfer's writer), and are
read back by this test's own reader."""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_inproc import error_lines, run_cli
from ppl_data import run_ppl, short_text
from synth_data import small_parts, write_small

REPO = Path(__file__).resolve().parent.parent
CTX, CHUNKS = 24, 3
ROWS = CTX - 1 - CTX // 2


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    meta, tensors = small_parts(seed=9)
    meta["tokenizer.ggml.add_bos_token"] = True
    return str(write_small(tmp_path_factory.mktemp("lcppl") / "small.gguf", meta, tensors))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return short_text(tmp_path_factory, 300)


@pytest.fixture(scope="module")
def run(small, text, tmp_path_factory):
    """(the run's JSON, its f32 logits [CHUNKS * ROWS, vocab], the text's ids)."""
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.perplexity.windows import read_logits

    f = tmp_path_factory.mktemp("base") / "f32.logits"
    r = run_ppl(small, text, CTX, CHUNKS, "--backend", "cpu", "--save-logits", str(f))
    ids = Tokenizer.from_metadata(load_model(small).metadata).encode(text.read_text())
    return r, np.array(read_logits(str(f))[1]), np.asarray(ids[: CHUNKS * CTX], np.int32)


# -- llama.cpp's file, by this test's own hand ----------------------------------------------------
def nv(vocab):
    return 2 * ((vocab + 1) // 2) + 4


def lc_row(x: np.ndarray) -> np.ndarray:
    """One row as perplexity.cpp's log_softmax(n_vocab, logits, log_prob, tok) fills it."""
    x = x.astype(np.float32)
    mx, mn = float(x.max()), float(x.min())
    mn = max(mn, mx - 16)
    lse = np.float32(np.log(sum(np.exp(np.float64(v - mx)) for v in x)))
    min_lp = np.float32(np.float32(mn) - np.float32(mx) - lse)
    scale = np.float32((np.float32(mx) - np.float32(mn)) / np.float32(65535))
    out = np.zeros(nv(len(x)), np.uint16)
    out[:4] = np.frombuffer(struct.pack("<ff", scale, min_lp), np.uint16)
    if scale:
        inv = np.float32(1) / scale
        for i, v in enumerate(x):
            out[4 + i] = int(np.rint(inv * (v - np.float32(mn)))) if v > mn else 0
    return out


def write_lc(path: Path, ctx: int, tokens: np.ndarray, rows: np.ndarray, vocab: int) -> None:
    chunks = len(tokens) // ctx
    with open(path, "wb") as f:
        f.write(b"_logits_" + struct.pack("<iii", ctx, vocab, chunks))
        f.write(np.asarray(tokens, "<i4").tobytes())
        for r in rows:
            f.write(lc_row(r).tobytes())


def read_lc(path: Path):
    b = path.read_bytes()
    assert b[:8] == b"_logits_"
    ctx, vocab, chunks = struct.unpack("<iii", b[8:20])
    tokens = np.frombuffer(b[20 : 20 + 4 * ctx * chunks], "<i4")
    q = np.frombuffer(b[20 + 4 * ctx * chunks :], "<u2").reshape(-1, nv(vocab))
    return ctx, vocab, chunks, tokens, q


def dequant(q: np.ndarray, vocab: int) -> np.ndarray:
    d = np.ascontiguousarray(q[:, :4]).view("<f4")
    return d[:, :1].astype(np.float64) * q[:, 4 : 4 + vocab] + d[:, 1:2]


def lc_kld(base_lp: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """perplexity.cpp's kl-divergence sum per row: over the base's entries above -16."""
    x = logits.astype(np.float64)
    lq = x - x.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    return np.where(base_lp > -16, np.exp(base_lp) * (base_lp - lq), 0.0).sum(1)


# -- reading a llama.cpp base ---------------------------------------------------------------------
def test_a_llamacpp_base_of_this_run_reads_as_itself(small, run, tmp_path):
    r0, logits, ids = run
    base = tmp_path / "lc.kld"
    write_lc(base, CTX, ids, logits, logits.shape[1])
    # no -f: the windows are the base's tokens, its ctx and chunks, as llama.cpp's
    code, out, err = run_cli(
        ["perplexity", "-m", small, "--backend", "cpu", "--kld-base", str(base), "--json"]
    )
    assert code == 0, err
    r = json.loads(out)
    assert (r["ctx"], r["chunks"], r["kld_base_format"]) == (CTX, CHUNKS, "llama.cpp")
    assert r["ppl"] == pytest.approx(r0["ppl"], rel=1e-9)  # the same windows
    k = r["kld"]
    assert k["base_ppl"] == pytest.approx(r0["ppl"], rel=1e-3)  # 16-bit log-probs
    assert abs(k["mean"]) < 1e-5 and k["same_top1"] >= 0.97
    assert k["max_abs_dlogit"] is None  # the base holds log-probs, not logits


def test_a_perturbed_llamacpp_base_gives_llamacpps_kld(small, run, tmp_path):
    r0, logits, ids = run
    rng = np.random.default_rng(3)
    pert = logits + rng.standard_normal(logits.shape).astype(np.float32)
    base = tmp_path / "lc.kld"
    write_lc(base, CTX, ids, pert, logits.shape[1])
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            small,
            "--backend",
            "cpu",
            "--kl-divergence-base",
            str(base),
            "--kl-divergence",
            "--json",
        ]
    )
    assert code == 0, err
    k = json.loads(out)["kld"]
    blp = dequant(read_lc(base)[4], logits.shape[1])
    want = lc_kld(blp, logits)
    assert k["mean"] > 1e-2
    assert k["mean"] == pytest.approx(want.mean(), rel=1e-6)
    assert k["same_top1"] == pytest.approx(np.mean(blp.argmax(1) == logits.argmax(1)))
    targets = np.concatenate([ids[i * CTX + CTX // 2 + 1 : (i + 1) * CTX] for i in range(CHUNKS)])
    base_nll = -blp[np.arange(len(targets)), targets]
    assert k["base_ppl"] == pytest.approx(np.exp(base_nll.mean()), rel=1e-6)


def test_llamacpp_base_refusals(small, run, text, tmp_path):
    r0, logits, ids = run
    good = tmp_path / "lc.kld"
    write_lc(good, CTX, ids, logits, logits.shape[1])
    trunc = tmp_path / "trunc.kld"
    trunc.write_bytes(good.read_bytes()[:-10])
    other = tmp_path / "vocab.kld"
    write_lc(other, CTX, ids, np.pad(logits, ((0, 0), (0, 2))), logits.shape[1] + 2)
    for args, says in (
        (["--kld-base", str(trunc)], "truncated"),
        (["--kld-base", str(other)], "vocabulary of 262"),
        (["--kld-base", str(good), "-c", "32"], "made with -c/--ctx 24, not 32"),
        (["--kl-divergence"], "--kl-divergence compares with a base run"),
        (["--kl-divergence-base", str(good), "--save-logits", str(tmp_path / "x")], "not both"),
    ):
        code, out, err = run_cli(["perplexity", "-m", small, "--backend", "cpu", *args])
        lines = error_lines(err)
        assert code == 2 and len(lines) == 1 and says in lines[0], (args, err)
        assert out == "" and "Traceback" not in err


def test_llamacpp_base_header_fields_and_nan_scale(small, run, tmp_path):
    r0, logits, ids = run
    good = tmp_path / "lc.kld"
    write_lc(good, CTX, ids, logits, logits.shape[1])
    b = bytearray(good.read_bytes())
    zero = tmp_path / "ctx0.kld"
    zero.write_bytes(b[:8] + struct.pack("<i", 0) + b[12:])
    code, out, err = run_cli(
        ["perplexity", "-m", small, "--backend", "cpu", "--kld-base", str(zero)]
    )
    assert code == 2 and "n_ctx is 0" in error_lines(err)[0], err
    rows = CTX - 1 - CTX // 2
    at = 20 + 4 * CTX * CHUNKS + 2 * nv(logits.shape[1]) * (rows + 2)  # chunk 2, row 3
    b[at : at + 4] = struct.pack("<f", float("nan"))  # its scale
    nan = tmp_path / "nan.kld"
    nan.write_bytes(bytes(b))
    code, out, err = run_cli(
        ["perplexity", "-m", small, "--backend", "cpu", "--kld-base", str(nan), "--json"]
    )
    lines = error_lines(err)
    assert code == 3 and len(lines) == 1 and "chunk 2, row 3" in lines[0], err
    assert "NaN" not in out


# -- writing one ----------------------------------------------------------------------------------
def test_kl_divergence_base_writes_llamacpps_file(small, text, run, tmp_path):
    r0, logits, ids = run
    out = tmp_path / "minfer.kld"
    r = run_ppl(small, text, CTX, CHUNKS, "--backend", "cpu", "--kl-divergence-base", str(out))
    assert r["saved_format"] == "llama.cpp" and r["ppl"] == pytest.approx(r0["ppl"], rel=1e-9)
    ctx, vocab, chunks, tokens, q = read_lc(out)
    assert (ctx, vocab, chunks) == (CTX, logits.shape[1], CHUNKS)
    assert tokens.tolist() == ids.tolist()  # before the BOS swap, as llama.cpp writes
    assert q.shape == (CHUNKS * ROWS, nv(vocab))
    mine = np.stack([lc_row(x) for x in logits])
    np.testing.assert_array_equal(q[:, :4], mine[:, :4])  # scale, min_log_prob
    assert np.abs(q[:, 4:].astype(int) - mine[:, 4:].astype(int)).max() <= 1
    # and it reads back as the base of this run
    r2 = run_ppl(
        small,
        text,
        CTX,
        CHUNKS,
        "--backend",
        "cpu",
        "--kl-divergence-base",
        str(out),
        "--kl-divergence",
    )
    assert abs(r2["kld"]["mean"]) < 1e-5


# -- llama-perplexity's output --------------------------------------------------------------------
def test_final_estimate_line_and_the_running_line(small, text):
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            small,
            "-f",
            str(text),
            "--backend",
            "cpu",
            "-c",
            str(CTX),
            "--chunks",
            "2",
        ]
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1].startswith("Final estimate: PPL = ") and " +/- " in lines[-1]
    run_line = next(ln for ln in lines if ln.startswith("[1]"))
    assert len(run_line.split(",")) == 3 and run_line.endswith(",")  # [1]x,[2]y,
    assert "1 window " not in out and "2 windows of 24" in out


def _stop_at(monkeypatch, call: int, exc):
    from minfer.reference.forward import ReferenceBackend

    real, calls = ReferenceBackend.window_logits, []

    def wl(self, ids, first):
        calls.append(sys.stdout.getvalue() if hasattr(sys.stdout, "getvalue") else "")
        if len(calls) == call:
            raise exc
        return real(self, ids, first)

    monkeypatch.setattr(ReferenceBackend, "window_logits", wl)
    return calls


def test_each_window_is_printed_when_it_ends(small, text, monkeypatch):
    calls = _stop_at(monkeypatch, 99, None)
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            small,
            "-f",
            str(text),
            "--backend",
            "cpu",
            "-c",
            str(CTX),
            "--chunks",
            "3",
        ]
    )
    assert code == 0, err
    assert "[1]" not in calls[0] and calls[1].endswith(",") and "[1]" in calls[1]
    assert "[2]" in calls[2] and "[3]" not in calls[2]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_prints_the_partial_result(small, text, tmp_path, monkeypatch, as_json):
    import signal

    from minfer.host.signals import Interrupted

    _stop_at(monkeypatch, 3, Interrupted(signal.SIGINT))
    save = tmp_path / "s.logits"
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            small,
            "-f",
            str(text),
            "--backend",
            "cpu",
            "-c",
            str(CTX),
            "--chunks",
            "3",
            "--save-logits",
            str(save),
        ]
        + (["--json"] if as_json else [])
    )
    assert code == 130 and err.strip() == "interrupted"
    assert list(tmp_path.iterdir()) == []  # no half-written logits file
    if as_json:
        r = json.loads(out)
        assert r["interrupted"] and r["chunks_done"] == 2 and len(r["running_ppl"]) == 2
    else:
        assert "[1]" in out and "[2]" in out and "[3]" not in out
        last = out.splitlines()[-1]
        assert last.startswith("Partial estimate (2 of 3 windows, interrupted): PPL = ")
        assert "Final estimate" not in out


HOOK = r"""
import os, sys, time
from minfer.reference.forward import ReferenceBackend
real, n, mark = ReferenceBackend.window_logits, [0], sys.argv[1]
def wl(self, ids, first):
    n[0] += 1
    if n[0] == 2:   # the first window's line must be in the pipe by now
        open(mark, "w").close()
        t = time.monotonic() + 60
        while not os.path.exists(mark + ".go") and time.monotonic() < t:
            time.sleep(0.02)
    return real(self, ids, first)
ReferenceBackend.window_logits = wl
sys.argv = ["minfer", *sys.argv[2:]]
from minfer.cli import main
main()
"""


def test_the_running_line_is_flushed_into_a_pipe(small, text, tmp_path):
    mark = tmp_path / "mark"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + str(REPO / "tests"))
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOOK,
            str(mark),
            "perplexity",
            "-m",
            small,
            "-f",
            str(text),
            "--backend",
            "cpu",
            "-c",
            str(CTX),
            "--chunks",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        t_end = time.monotonic() + 120
        while not mark.exists() and p.poll() is None and time.monotonic() < t_end:
            time.sleep(0.02)
        assert mark.exists(), p.stderr.read().decode()
        got = b""
        while select.select([p.stdout], [], [], 2.0)[0]:
            chunk = os.read(p.stdout.fileno(), 65536)
            got += chunk
            if not chunk or b"[1]" in got:
                break
        assert b"[1]" in got and b"[2]" not in got, got
    finally:
        (tmp_path / "mark.go").touch()
        rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert b"Final estimate: PPL = " in rest
