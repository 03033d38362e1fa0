"""CPU: the memory decision (minfer.cuda.plan.memory, plan.plan_tiers) with fake free memory:
which tier auto runs, the printed plan line, the --json numbers, and the refusal of a forced
path that does not fit (before anything is allocated)."""

from __future__ import annotations

import pytest
from synth_data import tiny_model

from minfer.cuda.plan.config import GemmChoice
from minfer.cuda.plan.memory import MARGIN, choose_tier, gb
from minfer.cuda.plan.plan import make_plan

G = 10**9
NEED = {
    "f16": 141_200_000_000,
    "blk": 73_400_000_000,
    "mix-int8": 60_000_000_000,
    "int8": 40_100_000_000,
}


@pytest.mark.parametrize(
    "free,chosen",
    [
        (NEED["f16"] + MARGIN, "f16"),  # fits exactly with the margin
        (NEED["f16"] + MARGIN - 1, "blk"),  # one byte short: the block int8 tier
        (NEED["blk"] + MARGIN - 1, "mix-int8"),  # the mixed tier
        (NEED["mix-int8"] + MARGIN - 1, "int8"),
        (NEED["int8"] + MARGIN, "int8"),
        (1 * G, "int8"),  # nothing fits: the smallest
        (None, "f16"),  # free memory unknown: the fastest
    ],
)
def test_choose_tier_arithmetic(free, chosen):
    p = choose_tier(NEED, free)
    assert p.chosen == chosen and p.need == NEED[chosen]
    assert p.fits == (free is None or NEED[chosen] + MARGIN <= free)


def test_choose_tier_smallest_when_none_fits_even_out_of_order():
    p = choose_tier({"a": 5 * G, "b": 3 * G, "c": 4 * G}, 1 * G)
    assert p.chosen == "b" and not p.fits and "smallest" in p.reason()


def test_plan_lines():
    assert gb(141_234_000_000) == "141.2 GB" and gb(MARGIN) == "0.25 GB"
    assert gb(5_234_000) == "0.00523 GB"
    p = choose_tier(NEED, 145 * G)
    assert p.line() == "f16 plan 141.2 GB of 145.0 GB free"
    p = choose_tier(NEED, 138_900_000_000)
    assert p.line() == ("f16 would need 141.2 GB, 138.9 GB free -> blk, 73.4 GB (margin 0.25 GB)")
    p = choose_tier(NEED, 70 * G)
    assert p.line() == (
        "f16 would need 141.2 GB, blk 73.4 GB, 70.0 GB free -> mix-int8, 60.0 GB (margin 0.25 GB)"
    )
    f = choose_tier({"narrow": 10_800_000_000}, 139 * G, forced="narrow")
    assert f.fits and f.line() == "narrow plan 10.8 GB of 139.0 GB free (--gemm narrow)"
    j = p.as_json()
    assert j["tiers"] == NEED and j["free"] == 70 * G and j["margin"] == MARGIN
    assert (j["chosen"], j["forced"], j["reason"]) == (
        "mix-int8",
        None,
        "the fastest tier that fits",
    )


def test_forced_refusal_names_the_paths_that_fit():
    f = choose_tier({"f16": NEED["f16"]}, 138_900_000_000, forced="f16", alt=NEED)
    assert not f.fits
    # mixed tiers are auto's only: the suggestions are the forceable paths and auto
    assert f.refusal() == (
        "--gemm f16 needs 141.2 GB of GPU memory, 138.9 GB free: "
        "--gemm blk (73.4 GB), --gemm wide-kd4 (40.1 GB) or --gemm auto fits"
    )
    f = choose_tier({"narrow": 92 * G}, 50 * G, forced="narrow", alt=NEED)
    assert f.refusal() == (
        "--gemm narrow needs 92.0 GB of GPU memory, 50.0 GB free: "
        "--gemm wide-kd4 (40.1 GB) or --gemm auto fits"
    )
    f = choose_tier({"narrow": 92 * G}, 1 * G, forced="narrow", alt=NEED)
    assert f.fitting() == []  # nothing fits: the backend's memory check names the parts


# -- on a model: plan_tiers, and the backend's refusal before any allocation ---------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("memplan"), seed=3))


class _Rt:
    def __init__(self, free, arch="sm_90"):
        self.arch, self.smem_optin, self.sm_count, self.free = arch, 232448, 1, free

    def mem_info(self):
        return self.free, 1 << 40


def test_plan_tiers_on_a_model(tiny):
    """Each tier's need is the backend's whole plan for its routes; the tiers shrink as more
    weights leave f16; auto picks by the free memory, and the routes follow the tier."""
    from minfer.cuda.plan.plan import plan_tiers

    p = plan_tiers(tiny, GemmChoice(), _Rt(None), 64, 64)
    assert list(p.tiers) == ["f16", "blk", "blk-all", "mix-int8", "int8"] and p.chosen == "f16"
    t = p.tiers
    assert t["f16"] > t["blk"] and t["f16"] > t["mix-int8"] > t["int8"]
    for tier in t:
        free = t[tier] + MARGIN
        q = plan_tiers(tiny, GemmChoice(), _Rt(free), 64, 64)
        first = next(x for x in t if t[x] + MARGIN <= free)
        assert q.chosen == first and q.fits
        r = dict(make_plan(tiny, GemmChoice(), _Rt(free), 64, 64).routes)
        on = {tiny.tensor(n).qtype for n, (path, _) in r.items() if path != "f16"}
        if first == "mix-int8":  # ffn q4_K only
            assert on == {12} and all(".ffn_" in n for n, (path, _) in r.items() if path != "f16")
    forced = plan_tiers(tiny, GemmChoice("f16"), _Rt(t["blk"] + MARGIN), 64, 64)
    assert not forced.fits and forced.alt == {k: v for k, v in t.items()}
    assert "--gemm blk" in forced.refusal() and "--gemm auto fits" in forced.refusal()


def test_backend_refuses_a_forced_path_before_allocating(tiny, monkeypatch):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.plan import plan_tiers
    from minfer.errors import GPUError

    t = plan_tiers(tiny, GemmChoice(), _Rt(None), 64, 64).tiers

    class Rt(_Rt):
        cfg = type("C", (), {"debug": False, "poison": False})()

        def alloc(self, *a, **kw):
            raise AssertionError("allocated before the refusal")

    with pytest.raises(GPUError) as e:
        CudaBackend(
            tiny,
            GemmChoice("f16"),
            rt=Rt(t["blk"] + MARGIN),
            max_tokens=64,
            ubatch=64,
            warmup=False,
        )
    msg = str(e.value)
    assert msg.startswith(
        f"--gemm f16 needs {gb(t['f16'])} of GPU memory, "
        f"{gb(t['blk'] + MARGIN)} free: --gemm blk ({gb(t['blk'])})"
    ), msg
    assert e.value.exit_code == 3


def test_prefill_prints_the_memory_line_and_upload_rate(tmp_path, monkeypatch, capsys):
    """`minfer prefill` with a backend that carries a memory plan and upload numbers (the CUDA
    backend's attributes): the `memory` line, `load ... (X GB at Y GB/s)`, and both in --json."""
    import json
    import re

    from minfer.cli import main
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.prefill import one as cmd

    plan = choose_tier(NEED, 80 * G)

    class Planned(ReferenceBackend):
        memory, upload_bytes, upload_s = plan, 40_100_000_000, 7.5

        def route_summary(self):
            return "f16: 1 GEMMs"

    monkeypatch.setattr(cmd, "make_backend", lambda kind, model, *a: Planned(model, max_tokens=64))
    path = tiny_model(tmp_path, seed=7)
    args = ["prefill", "-m", str(path), "--backend", "cpu", "-p", "abc", "--greedy", "1"]
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert f"memory   {plan.line()}\n" in out
    assert re.search(r"^load +\d+\.\d\d s \(read .*: 40\.1 GB at 5\.3 GB/s\)", out, re.M), out
    with pytest.raises(SystemExit):
        main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["memory"] == json.loads(json.dumps(plan.as_json()))
    assert d["memory"]["chosen"] == "blk" and d["memory"]["tiers"]["f16"] == NEED["f16"]
    assert d["upload_bytes"] == 40_100_000_000 and d["upload_gb_s"] == pytest.approx(5.3467, 1e-3)
