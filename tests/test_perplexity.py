"""CPU: `minfer perplexity` (minfer.tools.perplexity.windows, minfer/commands/perplexity.py) on a small 2-layer
model: PPL equals a direct numpy computation from the reference forward's last-position
logits, window by window (with and without BOS); --save-logits / --kld-base round trip
(KLD 0, top-1 100 % against itself; a perturbed base gives the KLD computed here); refusals
with one `error:` line; the shipped text is >= 10,000 tokens with the default tokenizer."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tolerance
from cli_inproc import error_lines, run_cli
from ppl_data import run_ppl, short_text
from synth_data import small_parts, write_small

CTX, CHUNKS = 24, 3


@pytest.fixture(scope="module", params=[False, True], ids=["no-bos", "bos"])
def small(request, tmp_path_factory):
    """(model path, add_bos) of the 2-layer small model (vocab 260, byte-level tokenizer)."""
    meta, tensors = small_parts(seed=4)
    meta["tokenizer.ggml.add_bos_token"] = request.param
    p = tmp_path_factory.mktemp("ppl") / f"small-{request.param}.gguf"
    return write_small(p, meta, tensors), request.param


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """A few hundred tokens of the shipped text (byte-level: ~1 token per byte)."""
    return short_text(tmp_path_factory, 300)


def _ppl(model, text, *extra):
    return run_ppl(model, text, CTX, CHUNKS, "--backend", "cpu", *extra)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


@pytest.mark.identity
def test_ppl_equals_direct_numpy(small, text):
    """The tool's f32 perplexity (window_logits: many rows per forward) equals a loop of plain
    last-position forwards, to tests/tolerance.py's f32 rule: the loop's nll, f32 against the
    f64 oracle, gives err; each nll may move by tol = 4 err, so log(ppl) (their mean) by tol
    and the error bar (ppl times their standard deviation sigma, 1-Lipschitz in the max norm)
    by a factor up to exp(tol) (1 + tol / sigma)."""
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend
    from minfer.text.tokenizer import Tokenizer

    path, add_bos = small
    model = load_model(path)
    tok = Tokenizer.from_metadata(model.metadata)
    ids = tok.encode(text.read_text())
    assert (ids[0] == tok.bos_id) == add_bos
    nll, s = {}, 0.0
    for dt in (np.float32, np.float64):
        be = ReferenceBackend(model, dtype=dt)
        nll[dt] = []
        for i in range(CHUNKS):
            w = np.array(ids[i * CTX : (i + 1) * CTX], np.int32)
            if add_bos:
                w[0] = tok.bos_id
            for j in range(CTX // 2, CTX - 1):  # position j predicts w[j + 1]
                be.reset()
                logits = be.forward(w[: j + 1], 0)  # the plain last-position forward
                nll[dt].append(-_log_softmax(logits)[w[j + 1]])
                s = max(s, tolerance.scale(logits))
    tol = tolerance.f32_tol(tolerance.f32_err([(nll[np.float32], nll[np.float64])]), s)
    nll = np.array(nll[np.float32])
    ppl = np.exp(nll.mean())
    sigma = np.sqrt(np.mean(nll**2) - nll.mean() ** 2)
    err = ppl * sigma / np.sqrt(nll.size - 1)
    r = _ppl(path, text)
    assert r["n_scored"] == nll.size == CHUNKS * (CTX - 1 - CTX // 2)
    assert abs(np.log(r["ppl"]) - np.log(ppl)) <= tol
    assert r["ppl_err"] == pytest.approx(err, rel=np.exp(tol) * (1 + tol / sigma) - 1)
    assert r["running_ppl"][-1] == pytest.approx(r["ppl"])
    assert r["kld"] is None


def test_text_output_has_the_final_ppl_line(small, text):
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            str(small[0]),
            "-f",
            str(text),
            "--backend",
            "cpu",
            "--ctx",
            str(CTX),
            "--chunks",
            "2",
        ]
    )
    assert code == 0, err
    last = out.splitlines()[-1]
    assert last.startswith("Final estimate: PPL = ") and " +/- " in last  # llama.cpp's
    assert any(ln.startswith("[1]") and ",[2]" in ln for ln in out.splitlines())


def test_save_and_kld_round_trip(small, text, tmp_path):
    base = tmp_path / "base.logits"
    r0 = _ppl(small[0], text, "--save-logits", str(base))
    assert r0["saved_logits"] == str(base) and base.is_file()
    # ctx and chunks default to the base's
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            str(small[0]),
            "-f",
            str(text),
            "--backend",
            "cpu",
            "--kld-base",
            str(base),
            "--json",
        ]
    )
    assert code == 0, err
    r = json.loads(out)
    assert (r["ctx"], r["chunks"]) == (CTX, CHUNKS)
    k = r["kld"]
    assert k["mean"] < 1e-12 and k["p99"] < 1e-12 and k["max_abs_dlogit"] == 0.0
    assert k["same_top1"] == 1.0
    assert k["base_ppl"] == pytest.approx(r["ppl"], rel=1e-12) == pytest.approx(r0["ppl"])
    assert k["mean_dlogprob"] == pytest.approx(0.0, abs=1e-12)


def test_perturbed_base_gives_the_kld_computed_here(small, text, tmp_path):
    from minfer.tools.perplexity.windows import read_logits

    base = tmp_path / "base.logits"
    _ppl(small[0], text, "--save-logits", str(base))
    this = np.array(read_logits(str(base))[1])  # the unperturbed logits: this run's
    pert = tmp_path / "pert.logits"
    shutil.copy(base, pert)
    hdr, m = read_logits(str(pert))
    m = np.memmap(str(pert), "<f4", "r+", offset=m.offset, shape=m.shape)
    rng = np.random.default_rng(0)
    m[:] = this + rng.standard_normal(this.shape).astype(np.float32) * 0.5
    m.flush()
    del m
    r = _ppl(small[0], text, "--kld-base", str(pert))
    k = r["kld"]
    b = np.array(read_logits(str(pert))[1])
    want = []
    for bb, tt in zip(b, this):
        lp, lq = _log_softmax(bb), _log_softmax(tt)
        want.append(float((np.exp(lp) * (lp - lq)).sum()))
    assert k["mean"] > 1e-3
    assert k["mean"] == pytest.approx(np.mean(want), rel=1e-9)
    assert k["p99"] == pytest.approx(np.percentile(want, 99), rel=1e-9)
    assert k["max_abs_dlogit"] == pytest.approx(float(np.abs(b - this).max()), rel=1e-6)
    assert k["same_top1"] == pytest.approx(np.mean(b.argmax(1) == this.argmax(1)))
    assert r["ppl"] == pytest.approx(_ppl(small[0], text)["ppl"])  # this run is unchanged


def test_mismatched_base_is_refused(small, text, tmp_path):
    base = tmp_path / "base.logits"
    _ppl(small[0], text, "--save-logits", str(base))
    other = tmp_path / "other.txt"
    other.write_text(text.read_text()[::-1])
    cases = [
        (["-f", str(other)], "text"),
        (["-f", str(text), "--ctx", "16"], "--ctx"),
        (["-f", str(text), "--chunks", "2"], "--chunks"),
    ]
    for extra, what in cases:
        code, out, err = run_cli(
            ["perplexity", "-m", str(small[0]), "--backend", "cpu", "--kld-base", str(base), *extra]
        )
        lines = error_lines(err)
        assert code == 2 and len(lines) == 1 and what in lines[0], (extra, err)
        assert "Traceback" not in err and out == ""
    junk = tmp_path / "junk.logits"
    junk.write_bytes(base.read_bytes()[:-4])  # truncated
    code, _, err = run_cli(
        [
            "perplexity",
            "-m",
            str(small[0]),
            "--backend",
            "cpu",
            "--kld-base",
            str(junk),
            "-f",
            str(text),
        ]
    )
    assert code == 2 and "truncated" in error_lines(err)[0]


def test_refusals(small, text, tmp_path):
    m = str(small[0])
    short = tmp_path / "short.txt"
    short.write_text("a short text of fifty-some bytes, fewer than --ctx")
    for args, says in (
        (["-f", str(short), "--ctx", "64"], "fewer than one window"),
        (["-f", str(text), "--ctx", "2"], "--ctx must be >= 4"),
        (["-f", str(text), "--chunks", "-2"], "--chunks must be >= -1"),
        (["-f", str(text), "--ctx", "100000"], "exceeds the model's context"),
        (["-f", str(tmp_path / "missing.txt")], "no such text file"),
        (["-f", str(text), "--save-logits", "a", "--kld-base", "b"], "not both"),
    ):
        code, out, err = run_cli(["perplexity", "-m", m, "--backend", "cpu", *args])
        lines = error_lines(err)
        assert code == 2 and len(lines) == 1 and says in lines[0], (args, err)


def test_failed_run_leaves_no_logits_file(small, text, tmp_path, monkeypatch):
    from minfer.errors import NumericError
    from minfer.reference.forward import ReferenceBackend

    calls = []

    def boom(self, ids, first):
        calls.append(1)
        if len(calls) == 2:
            raise NumericError("injected")
        return np.zeros((len(ids) - first, self.cfg.vocab_size), np.float32)

    monkeypatch.setattr(ReferenceBackend, "window_logits", boom)
    out = tmp_path / "x.logits"
    code, _, err = run_cli(
        [
            "perplexity",
            "-m",
            str(small[0]),
            "-f",
            str(text),
            "--backend",
            "cpu",
            "--ctx",
            str(CTX),
            "--save-logits",
            str(out),
        ]
    )
    assert code == 3 and error_lines(err) == ["error: injected"]
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


@pytest.mark.identity
def test_window_logits_rows_equal_forward(small):
    """ReferenceBackend.window_logits(ids, first) row r == forward(ids[:first + r + 1]) of a
    fresh cache (f64: the two differ only by BLAS summation order)."""
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(load_model(small[0]), dtype=np.float64)
    ids = np.arange(3, 3 + 20, dtype=np.int32) * 7 % 260
    rows = be.window_logits(ids, 12)
    assert rows.shape == (8, 260) and be.n_past == 20
    tol = tolerance.f64_tol(be.cfg, tolerance.scale(rows))
    for r in (0, 5, 7):
        be.reset()
        np.testing.assert_allclose(rows[r], be.forward(ids[: 13 + r], 0), rtol=0, atol=tol)


def test_ppl_stats_and_windows():
    from minfer.tools.perplexity import windows as P

    nll = np.array([1.0, 2.0, 3.0, 2.0])
    ppl, err = P.ppl_stats(nll)
    assert ppl == pytest.approx(np.exp(2.0))
    assert err == pytest.approx(np.exp(2.0) * np.sqrt(0.5 / 3))
    ids = np.arange(10, 30)
    assert P.window(ids, 1, 8, None).tolist() == list(range(18, 26))
    assert P.window(ids, 1, 8, 1).tolist() == [1] + list(range(19, 26))
    assert P.n_windows(20, 8, 0, "t") == 2 and P.n_windows(20, 8, 1, "t") == 1
    assert P.n_windows(20, 8, 9, "t") == 2
    assert P.rows_per_window(512) == 255 and P.first_scored(512) == 256


def test_shipped_text_is_long_enough(default_model):
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.perplexity.windows import DEFAULT_TEXT

    tok = Tokenizer.from_metadata(default_model.metadata)
    assert len(tok.encode(DEFAULT_TEXT.read_text(encoding="utf-8"))) >= 10_000
    readme = (DEFAULT_TEXT.parent / "README.md").read_text()
    assert DEFAULT_TEXT.name in readme and "verbatim" in readme


# -- a --kld-base file's header and numbers are checked, never trusted ----------------------------
def _rewrite_header(src, dst, **fields):
    """dst: src's logits with its JSON header's fields replaced (None: removed)."""
    import struct

    from minfer.tools.perplexity.windows import ALIGN, MAGIC, read_logits

    hdr, data = read_logits(str(src))
    for k, v in fields.items():
        if v is None:
            hdr.pop(k)
        else:
            hdr[k] = v
    head = json.dumps(hdr).encode()
    pre = len(MAGIC) + 4 + len(head)
    dst.write_bytes(
        MAGIC
        + struct.pack("<I", len(head))
        + head
        + b"\0" * (-pre % ALIGN)
        + np.asarray(data).tobytes()
    )


@pytest.mark.parametrize(
    "fields,says",
    [
        (dict(ctx=0), "'ctx' is 0"),
        (dict(ctx=None), "no 'ctx' field"),
        (dict(chunks=3.0), "'chunks' is 3.0"),
        (dict(vocab=260.0), "'vocab' is 260.0"),
        (dict(vocab=10**12), "vocab 1,000,000,000,000"),
        (dict(chunks=True), "'chunks' is True"),
        (dict(rows_per_chunk=5), "'rows_per_chunk' is 5"),
        (dict(ids_sha256=7), "'ids_sha256'"),
    ],
)
def test_kld_base_header_checked_field_by_field(small, text, tmp_path, fields, says):
    base = tmp_path / "base.logits"
    _ppl(small[0], text, "--save-logits", str(base))
    bad = tmp_path / "bad.logits"
    _rewrite_header(base, bad, **fields)
    code, out, err = run_cli(
        [
            "perplexity",
            "-m",
            str(small[0]),
            "-f",
            str(text),
            "--backend",
            "cpu",
            "--kld-base",
            str(bad),
        ]
    )
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert out == "" and "Traceback" not in err


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_kld_base_with_nonfinite_logits_refused(small, text, tmp_path, value):
    from minfer.tools.perplexity.windows import read_logits, rows_per_window

    base = tmp_path / "base.logits"
    _ppl(small[0], text, "--save-logits", str(base))
    _, m = read_logits(str(base))
    m = np.memmap(str(base), "<f4", "r+", offset=m.offset, shape=m.shape)
    m[rows_per_window(CTX) + 4, 7] = value  # chunk 2, row 5
    m.flush()
    del m
    for extra in ([], ["--json"]):
        code, out, err = run_cli(
            [
                "perplexity",
                "-m",
                str(small[0]),
                "-f",
                str(text),
                "--backend",
                "cpu",
                "--kld-base",
                str(base),
                *extra,
            ]
        )
        lines = error_lines(err)
        assert code == 3 and len(lines) == 1, err
        assert "chunk 2, row 5" in lines[0] and ("NaN" if np.isnan(value) else "inf") in lines[0]
        assert "NaN" not in out and "nan" not in out


def test_json_report_never_prints_nan(capsys):
    from minfer.errors import NumericError
    from minfer.tools.perplexity.report import Report

    rep = Report({"model": "m", "kld": None}, as_json=True)
    stats = {
        "ppl": float("nan"),
        "ppl_err": 0.0,
        "running_ppl": [1.0, float("inf")],
        "kld": {"mean": float("nan"), "p99": 0.1},
    }
    with pytest.raises(NumericError, match="kld.mean") as ei:
        rep.result(stats)
    assert ei.value.exit_code == 3
    r = json.loads(capsys.readouterr().out)  # strict JSON: NaN would not parse below either
    assert r["ppl"] is None and r["kld"]["mean"] is None and r["running_ppl"] == [1.0, None]
    assert "non-finite" in r["error"]
    json.loads(json.dumps(r, allow_nan=False))


def test_chunks_minus_one_is_every_window(small, text):
    """llama-perplexity's `--chunks -1`: the whole text, as `--chunks 0`."""
    every = run_ppl(small[0], text, CTX, 0, "--backend", "cpu")
    r = run_ppl(small[0], text, CTX, -1, "--backend", "cpu")
    assert r["chunks"] == every["chunks"] > CHUNKS and r["ppl"] == every["ppl"]
