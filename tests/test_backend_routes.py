"""CPU: the CUDA backend's GEMM routing (plan_routes, summary line), the GEMM CLI flags, and
check's tie-aware identity verdict and row sampling (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest
from synth_data import tiny_model

from minfer.cuda.backend import plan_routes, summarize_routes
from minfer.cuda.plan.config import GemmChoice
from minfer.cuda.plan.plan import make_plan


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("routes"), seed=3))


def test_routes_f16(tiny):
    for choice in (GemmChoice("f16"), GemmChoice(), None):  # auto with unknown memory: f16
        r = plan_routes(tiny, choice)
        n = tiny.config.n_layers * 7 + 1
        assert len(r) == n and all(p == "f16" and why == "" for p, why in r.values())
        assert summarize_routes(tiny, r) == f"f16: {n} GEMMs"


@pytest.mark.parametrize("path", ["wide-kd4", "wide-kd8", "narrow", "r1"])
def test_routes_int8(tiny, path):
    r = plan_routes(tiny, GemmChoice(path))
    lone_v = 0
    for name, (p, why) in r.items():
        t = tiny.tensor(name)
        if name.endswith("attn_v.weight") and not _fuses_qkv(tiny, name):
            assert p == "f16" and why == "attn_v alone: faster on f16"  # a fraction of a wave
            lone_v += 1
        elif t.qtype in (12, 14):
            assert p == path, name
        else:
            assert p == "f16" and f"no {path} kernel" in why
    line = summarize_routes(tiny, r)
    n_mmq = sum(p != "f16" for p, _ in r.values())
    q4 = sum(p != "f16" and tiny.tensor(n).qtype == 12 for n, (p, _) in r.items())
    assert f"MMQ ({path}): {n_mmq} GEMMs (q4_K {q4}, q6_K {n_mmq - q4})" in line
    assert f"f16: {len(r) - n_mmq} GEMMs" in line and n_mmq > 0
    assert 0 < lone_v < tiny.config.n_layers  # the mix has attn_v of both kinds
    assert f"attn_v alone: faster on f16 {lone_v}" in line


class _Rt:
    def __init__(self, arch="sm_90", smem=232448, free=None, sms=132):
        self.arch, self.smem_optin, self.sm_count, self.free = arch, smem, sms, free

    def mem_info(self):
        return self.free, 1 << 40


def test_routes_auto_memory_tiers(tiny):
    """auto: f16 when its plan fits the free memory with the margin, else blk (sm_90; ffn_down
    on f16), blk-all (ffn_down too), the mixed wide tier, the wide int8 kernels; each tier's
    need is the backend's whole plan for its routes (tests/test_memory_plan.py checks the
    arithmetic)."""
    from minfer.cuda.plan.memory import MARGIN
    from minfer.cuda.plan.plan import plan_tiers

    need = plan_tiers(tiny, GemmChoice(), _Rt(sms=1), 64, 64).tiers
    assert list(need) == ["f16", "blk", "blk-all", "mix-int8", "int8"]
    assert need["blk-all"] < need["blk"] < need["f16"]
    for free, want, down in (
        (need["f16"] + MARGIN, set(), "f16"),
        (need["blk"] + MARGIN, {"blk"}, "f16"),
        (need["blk-all"] + MARGIN, {"blk"}, "blk"),
        (need["int8"] + MARGIN, {"wide-kd4"}, "wide-kd4"),
        (0, {"wide-kd4"}, "wide-kd4"),
    ):
        r = dict(make_plan(tiny, GemmChoice(), _Rt(free=free, sms=1), 64, 64).routes)
        assert {p for p, _ in r.values()} - {"f16"} == want, (free, want)
        assert r["blk.0.ffn_down.weight"][0] == down, (free, down)
    # off sm_90 there is no blk tier: the mixed wide tier is next to f16
    off = plan_tiers(tiny, GemmChoice(), _Rt("sm_86", sms=1), 64, 64).tiers
    assert list(off) == ["f16", "mix-int8", "int8"]
    r = dict(
        make_plan(
            tiny, GemmChoice(), _Rt("sm_86", free=off["mix-int8"] + MARGIN, sms=1), 64, 64
        ).routes
    )
    assert {p for p, _ in r.values()} == {"f16", "wide-kd4"}
    assert all(".ffn_" in n for n, (p, _) in r.items() if p != "f16")


def test_routes_auto_runs_blk_first_on_wide_models(tiny, monkeypatch):
    """From paths.BLK_AUTO_WIDTH (the 8B width) auto runs blk on sm_90 when it fits (ffn_down
    and the LM head on f16), blk-all when only that fits; off sm_90 f16 as before."""
    from dataclasses import replace as dc_replace

    from minfer.cuda.paths import BLK_AUTO_WIDTH
    from minfer.cuda.plan.memory import MARGIN
    from minfer.cuda.plan.plan import plan_tiers

    monkeypatch.setattr(tiny, "config", dc_replace(tiny.config, d_model=BLK_AUTO_WIDTH))
    need = plan_tiers(tiny, GemmChoice(), _Rt(sms=1), 64, 64).tiers
    assert list(need) == ["blk", "blk-all", "mix-int8", "int8"]
    r = dict(make_plan(tiny, GemmChoice(), _Rt(sms=1), 64, 64).routes)
    assert r["blk.0.ffn_gate.weight"][0] == "blk" and r["blk.0.ffn_down.weight"][0] == "f16"
    r = dict(
        make_plan(tiny, GemmChoice(), _Rt(free=need["blk-all"] + MARGIN, sms=1), 64, 64).routes
    )
    assert r["blk.0.ffn_down.weight"][0] == "blk"
    r = dict(make_plan(tiny, GemmChoice(), _Rt("sm_86", sms=1), 64, 64).routes)
    assert {p for p, _ in r.values()} == {"f16"}


def _fuses_qkv(model, v_name: str) -> bool:
    """attn_v shares q's and k's type (all MMQ types here): it may join them in one GEMM."""
    p = v_name[: -len("attn_v.weight")]
    return len({model.tensor(p + f"attn_{x}.weight").qtype for x in "qkv"}) == 1


def test_fusion_plan_f16_and_mmq(tiny):
    """q|k|v and gate|up fuse when every member shares the route (and, on MMQ, the type); on
    MMQ a layer whose attn_v has another type keeps it on f16 and fuses q|k as attn_qk."""
    from minfer.cuda.plan.fusion import plan_fusion

    c = tiny.config
    f16 = plan_fusion(tiny, plan_routes(tiny, GemmChoice("f16")))
    assert len(f16) == 5 * c.n_layers  # q, k, v, gate, up of every layer
    assert f16["blk.0.attn_k.weight"] == (
        "blk.0.attn_qkv.weight",
        c.n_heads * c.head_dim,
        c.n_kv_heads * c.head_dim,
    )
    assert f16["blk.0.ffn_up.weight"] == ("blk.0.ffn_gate_up.weight", c.d_ff, c.d_ff)
    r = plan_routes(tiny, GemmChoice("wide-kd4"))
    mmq = plan_fusion(tiny, r)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        q, k = tiny.tensor(p + "attn_q.weight"), tiny.tensor(p + "attn_k.weight")
        if _fuses_qkv(tiny, p + "attn_v.weight"):  # attn_v on MMQ, in the q|k|v GEMM
            assert r[p + "attn_v.weight"][0] != "f16"
            assert mmq[p + "attn_v.weight"][0] == p + "attn_qkv.weight"
            continue
        assert p + "attn_v.weight" not in mmq and r[p + "attn_v.weight"][0] == "f16"
        qk = r[p + "attn_q.weight"][0] == r[p + "attn_k.weight"][0] and q.qtype == k.qtype
        assert (p + "attn_q.weight" in mmq) == qk
        if qk:
            qd = c.n_heads * c.head_dim
            assert mmq[p + "attn_k.weight"] == (p + "attn_qk.weight", qd, c.n_kv_heads * c.head_dim)
        g, u = tiny.tensor(p + "ffn_gate.weight"), tiny.tensor(p + "ffn_up.weight")
        same = r[p + "ffn_gate.weight"][0] == r[p + "ffn_up.weight"][0] and g.qtype == u.qtype
        assert (p + "ffn_gate.weight" in mmq) == same
        if same:
            assert mmq[p + "ffn_up.weight"] == (p + "ffn_gate_up.weight", c.d_ff, c.d_ff)
    assert any(n.endswith("ffn_gate.weight") for n in mmq)  # the tiny model has such layers
    assert any(n.endswith("attn_q.weight") for n in mmq)


def test_routes_smem_guard_reaches_backend(tiny, capsys):
    r = plan_routes(tiny, GemmChoice("wide-kd8"), _Rt(smem=100_000))  # KD=8 needs 190,464 B
    assert {p for p, _ in r.values()} == {"f16", "narrow"}
    capsys.readouterr()
    plan_routes(tiny, GemmChoice("wide-kd8"), _Rt(smem=100_001))
    assert "190464 B" in capsys.readouterr().err  # the guard says so (new cap, new notice)
    plan_routes(tiny, GemmChoice("wide-kd8"), _Rt(smem=100_001))
    assert capsys.readouterr().err == ""  # once per notice, not per plan


def test_gemm_flag_wins_over_env():
    from minfer.commands.gemm_flags import gemm_choice

    env = {"MINFER_GEMM": "wide-kd8"}
    assert gemm_choice(env=env) == GemmChoice("wide-kd8")
    assert gemm_choice("f16", env=env) == GemmChoice("f16")
    assert gemm_choice("mmq", env={}) == GemmChoice("wide-kd4")
    # bench: --gemm over the environment, an --ab config over both
    assert gemm_choice("blk", "", env=env) == GemmChoice("blk")
    assert gemm_choice("blk", "f16:no-rope", env=env) == GemmChoice("f16", frozenset({"rope"}))
    assert gemm_choice("blk", "MINFER_GEMM=mmq", env={}) == GemmChoice("wide-kd4")


@pytest.mark.parametrize("cmd", ["bench", "prefill", "check"])
def test_gemm_flag_parse(cmd):
    from click.testing import CliRunner

    from minfer.cli import cli

    out = CliRunner().invoke(cli, [cmd, "--help"])
    assert out.exit_code == 0 and "--gemm" in out.output
    assert "--mmq" not in out.output and "--f16-" not in out.output  # one user choice
    for gone in ("wgmma", "sb"):  # unknown, or a retired path: the usual usage error
        bad = CliRunner().invoke(cli, [cmd, "-m", "x.gguf", "--gemm", gone])
        assert bad.exit_code == 2 and f"'{gone}' is not one of" in bad.output


def _res(greedy, last, margins):
    from minfer.batch.single import RunResult

    return RunResult([1, 2], list(greedy), np.asarray(last, np.float32), 1.0, 1.0, list(margins))


def test_identity_verdict_tie_aware():
    from minfer.tools.check import identity_verdict

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
    from minfer.cuda.paths.parity import sample_rows

    rng = np.random.default_rng(0)
    s = sample_rows(rng, 1000, 50)
    assert np.all(np.diff(s) > 0) and s[0] == 0 and s[-1] == 999
    assert set(range(8)) <= set(s) and set(range(992, 1000)) <= set(s)
    assert list(sample_rows(rng, 5, 256)) == [0, 1, 2, 3, 4]


def test_plan_groups_cover_each_part_once(tiny):
    """A layer's q|k|v (gate|up) GEMMs in output order: every part exactly once, at its
    column in its GEMM's output; fused groups as one GEMM, the rest alone."""
    from minfer.cuda.plan.fusion import plan_fusion, plan_groups

    c = tiny.config
    qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    for choice in (GemmChoice("f16"), GemmChoice("wide-kd4")):
        fused = plan_fusion(tiny, plan_routes(tiny, choice))
        shapes = set()
        for i in range(c.n_layers):
            att = plan_groups(tiny, fused, i, "attn")
            parts = [p for g in att for p, _ in g.parts]
            assert sorted(parts) == ["k", "q", "v"] and sum(g.width for g in att) == qd + 2 * kd
            ffn = plan_groups(tiny, fused, i, "ffn")
            assert sorted(p for g in ffn for p, _ in g.parts) == ["gate", "up"]
            for g in att + ffn:
                assert (g.weight in {f[0] for f in fused.values()}) == (len(g.parts) > 1)
                assert g.member in tiny.tensors or g.member.endswith(".weight")
            shapes.add(tuple(len(g.parts) for g in att))
        if choice.path == "f16":
            assert shapes == {(3,)}  # one q|k|v GEMM per layer
        else:
            assert (2, 1) in shapes  # q|k fused and v alone where attn_v has another type
