"""minfer bench on the CPU backend (a tiny synthetic model): interleaving, table, config parsing."""

from __future__ import annotations

import pytest

from minfer import bench as B
from minfer.cuda.config import GemmConfig
from minfer.errors import BadInput
from synth_data import tiny_model


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("bench"), seed=1, qtype="q8_0")


def test_gemm_config_env_and_overrides():
    env = {"MINFER_MMQ": "1", "MINFER_MMQ_RAW_KD": "8"}
    c = GemmConfig.resolve(env)
    assert c.mmq and c.kd == 8 and c.raw and c.wide and c.wgmma
    assert c.label() == "mmq-wgmma-kd8"
    assert GemmConfig.resolve({**env, "MINFER_MMQ_WGMMA": "0"}).label() == "mmq-wide-kd8"
    c2 = GemmConfig.resolve(env, {"MINFER_MMQ": "0"})  # explicit override wins
    assert not c2.mmq and c2.label() == "f16"
    c3 = GemmConfig.parse_ab("MINFER_MMQ=1 MINFER_MMQ_RAW_WIDE=0", env={})
    assert c3.mmq and not c3.wide and c3.kd == 4
    assert GemmConfig.resolve({}) == GemmConfig()
    with pytest.raises(BadInput, match="KD"):
        GemmConfig.resolve({"MINFER_MMQ_RAW_KD": "5"})
    with pytest.raises(BadInput, match="unknown key"):
        GemmConfig.parse_ab("MINFER_FOO=1", env={})
    with pytest.raises(BadInput, match="KEY=VALUE"):
        GemmConfig.parse_ab("MINFER_MMQ", env={})
    with pytest.raises(BadInput, match="0 or 1"):
        GemmConfig.resolve({"MINFER_MMQ": "maybe"})


def test_parse_tokens():
    assert B.parse_tokens("512,2048") == [512, 2048]
    for bad in ("", "a,b", "0", "-3"):
        with pytest.raises(BadInput):
            B.parse_tokens(bad)


def test_table_noise_verdicts():
    a = B.Row("A", "cpu", 8, [100.0, 110.0, 105.0])  # band 10/105
    b = B.Row("B", "cpu", 8, [104.0, 106.0, 108.0])  # inside A's band -> noise
    c = B.Row("C", "cpu", 8, [200.0, 201.0, 202.0])  # far outside -> faster
    t = B.table([a, b, c])
    lines = t.splitlines()
    assert len(lines) == 5
    assert "noise" in lines[3] and "faster" in lines[4]
    assert a.median == 105.0 and a.spread == 10.0


def test_bench_cpu_interleaved(tiny_model_path):
    rows = B.run(str(tiny_model_path), [4, 8], ["", "MINFER_MMQ=1"], 2, "cpu", echo=lambda *a: None)
    assert [(r.config, r.tokens) for r in rows] == [
        ("default", 4), ("MINFER_MMQ=1", 4), ("default", 8), ("MINFER_MMQ=1", 8)]
    for r in rows:
        assert len(r.tok_s) == 2 and all(v > 0 for v in r.tok_s)
        assert r.backend == "cpu"


def test_bench_cli_cpu(tiny_model_path):
    from click.testing import CliRunner

    from minfer.cli import cli

    r = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model_path), "--tokens", "3",
                                 "--backend", "cpu", "--repeats", "1", "--ab", "",
                                 "MINFER_MMQ=1"])
    assert r.exit_code == 0, r.output
    assert "| config | backend | tokens | tok/s |" in r.output
    assert "MINFER_MMQ=1" in r.output
    bad = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model_path), "--tokens", "x",
                                   "--backend", "cpu"])
    assert bad.exit_code != 0
