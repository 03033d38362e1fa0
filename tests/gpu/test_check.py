"""`minfer check` on a tiny synthetic Q4_K_M model: every parity row and identity row passes,
the table names every path; a model with no MMQ weights still passes (nothing to gate)."""

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
    for path in ("f16", "mmq-r1", "mmq-narrow", "mmq-wide-kd4", "mmq-wide-kd8"):
        assert f"| {path} | " in out
    assert "| q4_K " in out and "| q6_K " in out and " +=" in out
    assert "/32 |" in out and "MMQ (mmq-wide-kd8)" in out


def test_check_parity_rows_fail_when_launcher_writes_nothing(tiny_path, rt, monkeypatch):
    """The gate can fail: a launcher that writes nothing (NaN-filled or untouched += output)
    fails every row."""
    import minfer.commands.check as C
    import minfer.cuda.mmq as mmq
    from minfer.loader import load_model

    monkeypatch.setattr(mmq, "mmq_linear", lambda *a, **k: None)
    rows = C.parity_rows(rt, load_model(tiny_path), n_sample=16)
    assert rows and not any(ok for *_, ok in rows)
