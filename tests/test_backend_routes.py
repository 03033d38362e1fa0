"""CPU: the CUDA backend's GEMM routing (plan_routes, summary line), the GEMM CLI flags, and
check's tie-aware identity verdict and row sampling (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.backend import plan_routes, summarize_routes
from minfer.cuda.config import GemmConfig
from synth_data import tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("routes"), seed=3))


def test_routes_f16_when_mmq_off(tiny):
    r = plan_routes(tiny, GemmConfig())
    n = tiny.config.n_layers * 7 + 1
    assert len(r) == n and all(p == "f16" and why == "MMQ off" for p, why in r.values())
    assert summarize_routes(tiny, r).startswith(f"MMQ: 0 GEMMs, f16: {n} GEMMs")


@pytest.mark.parametrize("kw,label", [(dict(kd=4), "mmq-wide-kd4"), (dict(kd=8), "mmq-wide-kd8"),
                                      (dict(wide=False), "mmq-narrow"),
                                      (dict(raw=False), "mmq-r1")])
def test_routes_mmq(tiny, kw, label):
    r = plan_routes(tiny, GemmConfig(mmq=True, **kw))
    lone_v = 0
    for name, (path, why) in r.items():
        t = tiny.tensor(name)
        if name.endswith("attn_v.weight") and not _fuses_qkv(tiny, name):
            assert path == "f16" and why == "attn_v alone: faster on f16"   # a fraction of a wave
            lone_v += 1
        elif t.qtype in (12, 14):
            assert path == label, name
        else:
            assert path == "f16" and "no MMQ kernel" in why
    line = summarize_routes(tiny, r)
    n_mmq = sum(p != "f16" for p, _ in r.values())
    q4 = sum(p != "f16" and tiny.tensor(n).qtype == 12 for n, (p, _) in r.items())
    assert f"MMQ ({label}): {n_mmq} GEMMs (q4_K {q4}, q6_K {n_mmq - q4})" in line
    assert f"f16: {len(r) - n_mmq} GEMMs" in line and n_mmq > 0
    assert 0 < lone_v < tiny.config.n_layers   # the mix has attn_v of both kinds
    assert f"attn_v alone: faster on f16 {lone_v}" in line


def test_routes_q6k_f16(tiny):
    """MINFER_MMQ_Q6K_F16: every q6_K weight (the LM head included) runs f16 with its reason,
    q4_K stays MMQ; the flag mirrors the environment and shows in the label."""
    from minfer.commands.gemm_flags import gemm_config

    cfg = GemmConfig(mmq=True, q6k_f16=True)
    r = plan_routes(tiny, cfg)
    q6 = [n for n in r if tiny.tensor(n).qtype == 14]
    q4 = [n for n in r if tiny.tensor(n).qtype == 12]
    assert q6 and q4
    assert all(r[n] == ("f16", "q6_K: f16 by MINFER_MMQ_Q6K_F16") for n in q6)
    assert all(r[n][0] == "mmq-wide-kd4" for n in q4 if not n.endswith("attn_v.weight"))
    assert f"q6_K: f16 by MINFER_MMQ_Q6K_F16 {len(q6)}" in summarize_routes(tiny, r)
    assert GemmConfig.resolve({"MINFER_MMQ": "1", "MINFER_MMQ_SB": "1",
                               "MINFER_MMQ_Q6K_F16": "1"}).label() == "mmq-wgmma-kd4-sb-q6kf16"
    assert gemm_config(mmq=True, mmq_q6k_f16=True, env={}) == cfg
    assert gemm_config(mmq_q6k_f16=False, env={"MINFER_MMQ_Q6K_F16": "1"}) == GemmConfig()
    assert GemmConfig.parse_ab("MINFER_MMQ=1 MINFER_MMQ_Q6K_F16=1", env={}) == cfg
    # MINFER_MMQ_SB_GLU: on by default; off shows in the label, the flag mirrors it
    assert GemmConfig().sb_glu
    off = GemmConfig.resolve({"MINFER_MMQ": "1", "MINFER_MMQ_SB": "1", "MINFER_MMQ_SB_GLU": "0"})
    assert not off.sb_glu and off.label() == "mmq-wgmma-kd4-sb-noglu"
    assert gemm_config(mmq=True, mmq_sb=True, mmq_sb_glu=False, env={}) == off


def _fuses_qkv(model, v_name: str) -> bool:
    """attn_v shares q's and k's type (all MMQ types here): it may join them in one GEMM."""
    p = v_name[: -len("attn_v.weight")]
    return len({model.tensor(p + f"attn_{x}.weight").qtype for x in "qkv"}) == 1


def test_fusion_plan_f16_and_mmq(tiny):
    """q|k|v and gate|up fuse when every member shares the route (and, on MMQ, the type); on
    MMQ a layer whose attn_v has another type keeps it on f16 and fuses q|k as attn_qk."""
    from minfer.cuda.routes import plan_fusion

    c = tiny.config
    f16 = plan_fusion(tiny, plan_routes(tiny, GemmConfig()))
    assert len(f16) == 5 * c.n_layers   # q, k, v, gate, up of every layer
    assert f16["blk.0.attn_k.weight"] == ("blk.0.attn_qkv.weight", c.n_heads * c.head_dim,
                                          c.n_kv_heads * c.head_dim)
    assert f16["blk.0.ffn_up.weight"] == ("blk.0.ffn_gate_up.weight", c.d_ff, c.d_ff)
    r = plan_routes(tiny, GemmConfig(mmq=True))
    mmq = plan_fusion(tiny, r)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        q, k = tiny.tensor(p + "attn_q.weight"), tiny.tensor(p + "attn_k.weight")
        if _fuses_qkv(tiny, p + "attn_v.weight"):   # attn_v on MMQ, in the q|k|v GEMM
            assert r[p + "attn_v.weight"][0] != "f16"
            assert mmq[p + "attn_v.weight"][0] == p + "attn_qkv.weight"
            continue
        assert p + "attn_v.weight" not in mmq and r[p + "attn_v.weight"][0] == "f16"
        qk = r[p + "attn_q.weight"][0] == r[p + "attn_k.weight"][0] and q.qtype == k.qtype
        assert (p + "attn_q.weight" in mmq) == qk
        if qk:
            qd = c.n_heads * c.head_dim
            assert mmq[p + "attn_k.weight"] == (p + "attn_qk.weight", qd,
                                                c.n_kv_heads * c.head_dim)
        g, u = tiny.tensor(p + "ffn_gate.weight"), tiny.tensor(p + "ffn_up.weight")
        same = r[p + "ffn_gate.weight"][0] == r[p + "ffn_up.weight"][0] and g.qtype == u.qtype
        assert (p + "ffn_gate.weight" in mmq) == same
        if same:
            assert mmq[p + "ffn_up.weight"] == (p + "ffn_gate_up.weight", c.d_ff, c.d_ff)
    assert any(n.endswith("ffn_gate.weight") for n in mmq)   # the tiny model has such layers
    assert any(n.endswith("attn_q.weight") for n in mmq)


def test_routes_smem_guard_reaches_backend(tiny):
    class Rt:
        smem_optin = 100_000  # KD=8 needs 190,464 B (q4_K)

    r = plan_routes(tiny, GemmConfig(mmq=True, kd=8), Rt())
    assert {p for p, _ in r.values()} == {"f16", "mmq-narrow"}


def test_gemm_flags_win_over_env():
    from minfer.commands.gemm_flags import gemm_config, gemm_overrides

    env = {"MINFER_MMQ": "1", "MINFER_MMQ_RAW_KD": "8"}
    assert gemm_config(env=env) == GemmConfig(mmq=True, kd=8)
    assert gemm_config(mmq=False, env=env) == GemmConfig(mmq=False, kd=8)
    assert gemm_config(mmq_kd="4", mmq_wide=False, env=env) == GemmConfig(mmq=True, kd=4,
                                                                         wide=False)
    assert gemm_config(mmq=True, mmq_raw=False, env={}).label() == "mmq-r1"
    assert gemm_overrides() == {}
    assert gemm_overrides(mmq=True, mmq_kd="8") == {"MINFER_MMQ": "1", "MINFER_MMQ_RAW_KD": "8"}


def test_bench_flags_parse():
    from click.testing import CliRunner

    from minfer.cli import cli

    out = CliRunner().invoke(cli, ["bench", "--help"])
    assert out.exit_code == 0
    for flag in ("--mmq / --no-mmq", "--mmq-raw / --no-mmq-raw", "--mmq-wide / --no-mmq-wide",
                 "--mmq-kd"):
        assert flag in out.output
    bad = CliRunner().invoke(cli, ["bench", "-m", "x.gguf", "--mmq-kd", "5"])
    assert bad.exit_code != 0 and "5" in bad.output


def _res(greedy, last, margins):
    from minfer.engine import RunResult

    return RunResult([1, 2], list(greedy), np.asarray(last, np.float32), 1.0, 1.0,
                     list(margins))


def test_identity_verdict_tie_aware():
    from minfer.commands.check import identity_verdict

    ref = _res([5, 6, 7, 8], [0.0, 1.0, 2.0], [3.0, 2.0, 0.01, 1.0])
    same = _res([5, 6, 7, 8], [0.0, 1.0, 2.1], [0] * 4)
    v, diff = identity_verdict(ref, same)
    assert v.ok and v.exact == 4 and diff == pytest.approx(0.1, abs=1e-6)
    assert v.tau == pytest.approx(0.2, abs=1e-6)
    # diverges at step 3 where the reference margin 0.01 < tau 0.2: a near-tie, passes
    tie = _res([5, 6, 9, 9], [0.0, 1.0, 2.1], [0] * 4)
    v, _ = identity_verdict(ref, tie)
    assert v.ok and v.exact == 2 and "near-tie" in v.describe()
    # diverges at step 2 where the margin 2.0 >= tau: a bug
    bug = _res([5, 9, 7, 8], [0.0, 1.0, 2.1], [0] * 4)
    v, _ = identity_verdict(ref, bug)
    assert not v.ok and "DIVERGENCE" in v.describe()


def test_sample_rows_covers_edges():
    from minfer.commands.check import sample_rows

    rng = np.random.default_rng(0)
    s = sample_rows(rng, 1000, 50)
    assert np.all(np.diff(s) > 0) and s[0] == 0 and s[-1] == 999
    assert set(range(8)) <= set(s) and set(range(992, 1000)) <= set(s)
    assert list(sample_rows(rng, 5, 256)) == [0, 1, 2, 3, 4]
