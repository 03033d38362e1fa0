"""CPU: the GEMM path table, its chooser (choose_path, the memory tiers, the smem guard) and the user
choice (--gemm, MINFER_GEMM, bench's tuning variants)."""

import pytest

from minfer.cuda.paths import (
    BLK_AUTO_WIDTH,
    CHOICES,
    TABLE,
    TIERS,
    VARIANTS,
    GemmPath,
    auto_tiers,
    choose_path,
)
from minfer.cuda.paths.q8_1.launch import wide_smem
from minfer.cuda.plan.config import GemmChoice
from minfer.errors import BadInput

SHAPE = (512, 4096, 4096)


def test_table_records():
    assert list(TABLE) == ["f16", "blk", "wide-kd4", "wide-kd8", "narrow", "r1", "blk-split"]
    for p in TABLE.values():
        # every path is a family object of the one calling convention (paths/base.py)
        assert isinstance(p, GemmPath) and type(p).route is not GemmPath.route
        assert type(p).upload is not GemmPath.upload and type(p).twin is not GemmPath.twin
        assert all(v in VARIANTS for v in p.variants)
        r = p.route(12, GemmChoice(p.name), "blk.0.attn_q.weight")
        assert r.path is p and (r.operand is None) == (not p.int8)
    assert TABLE["f16"].weight_bytes(12) == 2.0 and TABLE["f16"].weight_bytes(8) == 2.0
    assert TABLE["wide-kd4"].weight_bytes(12) == 0.5625
    assert TABLE["wide-kd8"].weight_bytes(14) == 210 / 256
    assert TABLE["blk"].weight_bytes(8) == TABLE["blk"].weight_bytes(14) == 1.03125
    # the seeds' kernels stay in the table by name
    assert {TABLE[n].kernel for n in ("r1", "narrow", "wide-kd4", "wide-kd8")} == {
        "mmq_nt_kernel",
        "mmq_raw_nt_kernel",
        "mmq_raw_wide_nt_kernel",
    }
    assert set(CHOICES) == {"auto", "mmq", *TABLE}


def test_choose_path_explicit():
    assert choose_path(12, "sm_90", SHAPE, "f16").path.name == "f16"
    for n in ("wide-kd4", "wide-kd8", "narrow", "r1"):
        assert choose_path(12, "sm_80", SHAPE, n).path.name == n
        assert choose_path(14, None, SHAPE, n).path.name == n
    r = choose_path(8, "sm_90", SHAPE, "wide-kd4")  # q8_0: no int8 kernel
    assert r.path.name == "f16" and "no wide-kd4 kernel" in r.why
    r = choose_path(12, "sm_90", (512, 576, 576), "narrow")
    assert r.path.name == "f16" and "K=576 not a multiple of 256" == r.why
    # blk: any type, sm_90; the LM head at M = 1 keeps f16's GEMV
    for q in (8, 12, 14, 3):
        assert choose_path(q, "sm_90", SHAPE, "blk").path.name == "blk"
    r = choose_path(12, "sm_80", SHAPE, "blk")
    assert r.path.name == "f16" and "sm_90" in r.why
    r = choose_path(12, "sm_90", (1, 4096, 4096), "blk")
    assert r.path.name == "f16" and "GEMV" in r.why
    assert choose_path(12, "sm_90", (512, 576, 576), "blk").path.name == "blk"
    assert (
        choose_path(12, "sm_90", SHAPE, "wide-kd4", alone=True).why == "attn_v alone: faster on f16"
    )
    assert choose_path(12, "sm_90", SHAPE, "f16", alone=True).why == ""
    for gone in ("wgmma", "sb"):  # unknown, or a retired path
        with pytest.raises(ValueError):
            choose_path(12, "sm_90", SHAPE, gone)


def test_choose_path_auto_tiers():
    assert auto_tiers("sm_90") == ("f16", "blk", "blk-all", "mix-int8", "int8")
    assert auto_tiers("sm_86") == ("f16", "mix-int8", "int8")
    # from BLK_AUTO_WIDTH (the 8B shape) blk goes first on sm_90 (f16 needs more memory)
    assert auto_tiers("sm_90", BLK_AUTO_WIDTH) == ("blk", "blk-all", "mix-int8", "int8")
    assert auto_tiers("sm_90", BLK_AUTO_WIDTH - 1)[0] == "f16"
    assert auto_tiers("sm_86", 8192) == ("f16", "mix-int8", "int8")
    assert {t.path for t in TIERS.values()} <= set(TABLE)
    assert choose_path(12, "sm_90", SHAPE).path.name == "f16"
    for q in (12, 14, 8):  # the blk tier takes every type
        assert choose_path(q, "sm_90", SHAPE, tier="blk").path.name == "blk"
    assert choose_path(12, "sm_90", (1, 4096, 4096), tier="blk").path.name == "f16"  # LM head
    assert choose_path(14, "sm_90", SHAPE, tier="int8").path.name == "wide-kd4"
    assert choose_path(8, "sm_90", SHAPE, tier="int8").path.name == "f16"


def test_blk_leaves_ffn_down_to_f16():
    """blk runs ffn_down on f16 (its int8 grid costs most of the path's KL divergence) unless
    the tuning variant no-exact-down or auto's memory tier blk-all says otherwise."""
    r = choose_path(12, "sm_90", SHAPE, "blk", kind="ffn_down")
    assert (r.path.name, r.why) == ("f16", "ffn_down: f16 for accuracy")
    assert choose_path(12, "sm_90", SHAPE, "blk", kind="ffn_gate").path.name == "blk"
    assert choose_path(12, "sm_90", SHAPE, "blk", kind="ffn_down", exact=False).path.name == "blk"
    assert choose_path(12, "sm_90", SHAPE, tier="blk", kind="ffn_down").path.name == "f16"
    assert choose_path(12, "sm_90", SHAPE, tier="blk-all", kind="ffn_down").path.name == "blk"
    assert choose_path(12, "sm_90", SHAPE, "wide-kd4", kind="ffn_down").path.name == "wide-kd4"


@pytest.mark.parametrize("tier,path", [("mix-int8", "wide-kd4")])
def test_mixed_tiers_split_by_weight_class(tier, path):
    """A mixed tier runs the ffn's q4_K on its int8 path; attention, the LM head and q6_K stay
    f16, saying which tier kept them there."""
    assert choose_path(12, "sm_90", SHAPE, tier=tier, cls="ffn").path.name == path
    for qtype, cls in ((12, "attn"), (12, "head"), (14, "ffn"), (14, "attn")):
        r = choose_path(qtype, "sm_90", SHAPE, tier=tier, cls=cls)
        assert (r.path.name, r.why) == ("f16", f"{tier} tier"), (qtype, cls)
    # a forced path ignores the class: --gemm blk runs the attention on blk too
    assert choose_path(12, "sm_90", SHAPE, "blk", cls="attn").path.name == "blk"


def test_smem_guard():
    assert wide_smem(4) == 100352 and wide_smem(8) == 190464
    assert wide_smem(4, 14) == 82944 and wide_smem(8, 14) == 156672
    r = choose_path(12, "sm_90", (1, 1, 256), "wide-kd8", 101376)
    assert r.path.name == "narrow" and "190464" in r.notice and "narrow" in r.notice
    assert choose_path(12, "sm_90", (1, 1, 256), "wide-kd8", 232448).path.name == "wide-kd8"
    assert choose_path(14, "sm_90", (1, 1, 256), "wide-kd4", 90000).path.name == "wide-kd4"
    assert choose_path(12, "sm_90", (1, 1, 256), "wide-kd4", 65536).path.name == "narrow"
    r = choose_path(12, "sm_90", SHAPE, "blk", 100_000)  # blk over the cap: f16, said why
    assert r.path.name == "f16" and "shared memory" in r.why


def test_wide_smem_matches_kernel():
    """The launcher's byte counts are the kernels' (pinned by static_assert in each header)."""
    import re
    from pathlib import Path

    kdir = Path(__file__).parents[1] / "kernels"
    for header, struct, qtype in (
        ("mmq_wide_async.cuh", "WideAsyncSmem", 12),
        ("mmq_wide_sync.cuh", "WideSyncSmem", 14),
    ):
        src = (kdir / header).read_text()
        pinned = dict(re.findall(rf"static_assert\({struct}<(\d)>::BYTES == (\d+)", src))
        assert set(pinned) == {"4", "8"}, header
        assert all(wide_smem(int(kd), qtype) == int(b) for kd, b in pinned.items()), header


@pytest.mark.parametrize(
    "env,path",
    [
        ({}, "auto"),
        ({"MINFER_GEMM": "f16"}, "f16"),
        ({"MINFER_GEMM": "mmq"}, "wide-kd4"),  # the seeds' config
        ({"MINFER_GEMM": "wide-kd8"}, "wide-kd8"),
        ({"MINFER_GEMM": "narrow"}, "narrow"),
        ({"MINFER_GEMM": "r1"}, "r1"),
        ({"MINFER_GEMM": "blk", "MINFER_MMQ": "1"}, "blk"),  # the seeds' variables are not read
    ],
)
def test_choice_from_env(env, path):
    assert GemmChoice.resolve(env) == GemmChoice(path)


def test_a_retired_mmq_variable_alone_is_refused_not_ignored():
    with pytest.raises(BadInput, match="MINFER_MMQ is no longer read.*MINFER_MMQ=0 -> f16"):
        GemmChoice.resolve({"MINFER_MMQ": "0"})
    assert GemmChoice.resolve({"MINFER_MMQ": "0"}, "f16").path == "f16"  # a --gemm decides


def test_choice_flag_wins_and_errors():
    env = {"MINFER_GEMM": "wide-kd8"}
    assert GemmChoice.resolve(env, "f16").path == "f16"
    assert GemmChoice.resolve(env, "mmq").path == "wide-kd4"
    for bad in (
        {"MINFER_GEMM": "wgmma"},
        {"MINFER_GEMM": "sb"},
    ):
        with pytest.raises(BadInput):
            GemmChoice.resolve(bad)
    with pytest.raises(BadInput, match="bench --ab"):
        GemmChoice.resolve({}, "f16:no-rope")  # tuning variants are not a user choice


def test_tuning_variants():
    c = GemmChoice.parse_ab("f16:no-rope", env={})
    assert c == GemmChoice("f16", frozenset({"rope"})) and not c.on("rope") and c.on("glu")
    assert c.label() == "f16:no-rope"
    c = GemmChoice.parse_ab("blk:no-glu:no-stream-k", env={})
    assert c.off == {"glu", "stream-k"} and c.label() == "blk:no-glu:no-stream-k"
    assert GemmChoice.parse_ab("auto:no-stream-k", env={}).off == {"stream-k"}
    assert GemmChoice.parse_ab("blk:no-fused-prepass", env={}).off == {"fused-prepass"}
    assert GemmChoice.parse_ab("MINFER_GEMM=wide-kd8", env={}).path == "wide-kd8"
    assert GemmChoice.parse_ab("MINFER_GEMM=mmq", env={"MINFER_GEMM": "f16"}).path == "wide-kd4"
    assert GemmChoice.parse_ab("", env={"MINFER_GEMM": "narrow"}).path == "narrow"
    for bad in (
        "f16:no-stream-k",
        "wide-kd4:no-glu",
        "f16:rope",
        "f16 blk",
        "MINFER_FOO=1",
        "MINFER_MMQ_SB=1",
        "MINFER_MMQ=1",
        "sb",
        "f16:no-fused-prepass",
    ):
        with pytest.raises(BadInput):
            GemmChoice.parse_ab(bad, env={})


def test_cuda_debug_sub_values():
    """MINFER_CUDA_DEBUG carries the debug switches (no MINFER_CUDA_POISON / _GRAPHS)."""
    from minfer.cuda.runtime.runtime import debug_flags

    assert debug_flags({}) == set() and debug_flags({"MINFER_CUDA_DEBUG": "0"}) == set()
    assert debug_flags({"MINFER_CUDA_DEBUG": "1"}) == {"sync", "poison", "nographs"}
    assert debug_flags({"MINFER_CUDA_DEBUG": "poison"}) == {"poison"}
    assert debug_flags({"MINFER_CUDA_DEBUG": "nographs, poison"}) == {"nographs", "poison"}
    with pytest.raises(BadInput, match="MINFER_CUDA_DEBUG"):
        debug_flags({"MINFER_CUDA_DEBUG": "verbose"})
