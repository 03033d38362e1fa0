"""`minfer check` on a tiny synthetic Q4_K_M model and on a 2-layer synthetic model of the
Llama-3-8B shape (issue 5: d 4096, d_ff 14336, GQA 32:8): every parity row and identity row
passes, the table names every path; the gate can fail (a launcher that writes nothing)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from synth_data import tiny_model

    return str(tiny_model(tmp_path_factory.mktemp("check"), seed=4, workers=None))


def test_check_passes_on_tiny_q4km(tiny_path):
    from click.testing import CliRunner

    from minfer.commands.check import check

    r = CliRunner().invoke(check, ["-m", tiny_path, "-p", "hello world, hello"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "check: PASS" in out
    from minfer.cuda.paths import TABLE
    from minfer.cuda.runtime.runtime import get_runtime

    for path in TABLE:  # an identity row per path of the table, parity rows per int8 path
        if TABLE[path].opt_in:  # (blk-split: only when named, --gemm)
            continue
        if TABLE[path].archs is None or get_runtime().arch in TABLE[path].archs:
            assert f"| {path} | " in out, path
    assert "| q4_K " in out and "| q6_K " in out and " +=" in out
    assert "/32 |" in out and "MMQ (wide-kd8)" in out


def test_check_passes_on_8b_shape_2_layers(tmp_path):
    """The real GEMM shapes (K = 4096 and 14336, N up to 14336 and the 4096 x vocab head) through
    every path, ragged rows included, and greedy-32 identity on a 2-layer 8B-width model."""
    from click.testing import CliRunner

    from minfer.commands.check import check
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    path = tmp_path / "l8b2.gguf"
    make_synthetic_model(
        path,
        SynthOptions(
            preset="llama3-8b", layers=2, qtype="q4_K_M", seed=5, vocab=8192, tokenizer_from=None
        ),
        progress=False,
    )
    r = CliRunner().invoke(check, ["-m", str(path), "-p", "hello world, hello"])
    assert r.exit_code == 0, r.output
    assert "check: PASS" in r.output
    assert "4096" in r.output and "14336" in r.output  # parity rows at the 8B shapes
    for p in ("f16", "r1", "narrow", "wide-kd4", "wide-kd8"):
        assert f"| {p} | " in r.output


def test_check_one_path(tiny_path):
    """--gemm NAME: that path's parity and identity rows only."""
    from click.testing import CliRunner

    from minfer.commands.check import check

    r = CliRunner().invoke(check, ["-m", tiny_path, "--gemm", "narrow"])
    assert r.exit_code == 0, r.output
    assert "| narrow | " in r.output and "| wide-kd4 | " not in r.output
    assert ", 1 identity rows, 1 batch rows)" in r.output


def test_check_parity_rows_fail_when_launcher_writes_nothing(tiny_path, rt, monkeypatch):
    """The gate can fail: a launcher that writes nothing (NaN-filled or untouched += output)
    fails every row."""
    import minfer.tools.check as C
    from minfer.cuda.paths import TABLE
    from minfer.cuda.paths.q8_1 import RawInt8Route
    from minfer.gguf.loader import load_model

    monkeypatch.setattr(RawInt8Route, "run", lambda *a, **k: None)
    rows = C.parity_rows(
        rt,
        load_model(tiny_path),
        n_sample=16,
        paths=[TABLE[p] for p in ("r1", "narrow", "wide-kd4", "wide-kd8")],
    )
    assert rows and not any(ok for *_, ok in rows)


def _real_model():
    """The default model where present, else MINFER_TEST_MODEL (the device calls' slice)."""
    import os
    from pathlib import Path

    from minfer.gguf.fetch import default_model_path

    try:
        p = default_model_path(fetch=False)
        if p.exists():
            return p
    except Exception:
        pass
    env = os.environ.get("MINFER_TEST_MODEL")
    if env and Path(env).exists():
        return Path(env)
    pytest.skip("neither the default model nor MINFER_TEST_MODEL is present")


def test_check_on_real_model_requantized_q4km(tmp_path):
    """Issue 5's real-model gate: the default model (Q4_1, no MMQ type) requantized to Q4_K_M by
    `minfer quantize`, then `minfer check`: parity rows for q4_K and q6_K on every MMQ path,
    greedy-32 identity on every path (with the default model absent, the MINFER_TEST_MODEL
    slice stands in; the device calls carry one)."""
    from click.testing import CliRunner

    from minfer.commands.check import check
    from minfer.commands.quantize import quantize

    src = _real_model()
    dst = tmp_path / "q4km.gguf"
    r = CliRunner().invoke(
        quantize, [str(src), str(dst), "--type", "q4_k_m", "--quiet", "--allow-requantize"]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(check, ["-m", str(dst)])
    assert r.exit_code == 0, r.output
    assert "check: PASS" in r.output
    assert "| q4_K " in r.output and "| q6_K " in r.output
    for p in ("f16", "r1", "narrow", "wide-kd4", "wide-kd8"):
        assert f"| {p} | " in r.output  # an identity row per path (exit 0: all passed)
