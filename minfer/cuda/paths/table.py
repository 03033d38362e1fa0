"""The GEMM path table and its chooser: the one place a GEMM path is chosen (docs/paths.md).

TABLE lists the path family objects (f16.py, q8_1.py, blk.py: each owns its support, weight
preparation, operand, launches, twin, kernels and tuning variants). `choose_path` picks a path
per weight from (type, arch, shape, user choice, smem cap, memory tier, weight class), as
llama.cpp's should_use_mmq does. `auto` plans the memory tiers of `TIERS` in order
(`auto_tiers`) and runs the first that fits the free device memory
(minfer.cuda.plan.memory.choose_tier). Pure Python, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.cuda.paths.base import Q4_K, GemmPath
from minfer.cuda.paths.blk import BLK
from minfer.cuda.paths.blk.split_path import BLK_SPLIT
from minfer.cuda.paths.f16 import F16
from minfer.cuda.paths.q8_1 import NARROW, R1, WIDE_KD4, WIDE_KD8

# blk-split: opt-in only (no tier names it: slower than blk on the H100, docs/blk.md)
TABLE: dict[str, GemmPath] = {
    p.name: p for p in (F16, BLK, WIDE_KD4, WIDE_KD8, NARROW, R1, BLK_SPLIT)
}
INT8_PATHS = tuple(p for p in TABLE.values() if p.int8)


@dataclass(frozen=True)
class Tier:
    """A memory tier of `auto`: `path` for the weights of `classes` (routes.weight_class: attn,
    ffn, head; None: all) and of `qtypes` (None: all), f16 for the rest; exact=False: the path
    takes even the kinds it leaves to f16 for accuracy (GemmPath.f16_kinds)."""

    name: str
    path: str
    classes: frozenset | None = None
    qtypes: frozenset | None = None
    exact: bool = True

    def takes(self, cls: str, qtype: int) -> bool:
        return (self.classes is None or cls in self.classes) and (
            self.qtypes is None or int(qtype) in self.qtypes
        )


_FFN_Q4K = dict(classes=frozenset({"ffn"}), qtypes=frozenset({Q4_K}))
# what `auto` tries, fastest first (auto_tiers keeps those whose path runs on the GPU): blk on
# sm_90 (1.03 B per weight, ffn_down on f16; docs/paths.md), blk-all (ffn_down too), then the
# mixed tier keeping attention, q6_K and the LM head on f16 and the ffn's q4_K on the wide
# kernel, then every q4_K / q6_K on it
TIERS: dict[str, Tier] = {
    t.name: t
    for t in (
        Tier("f16", "f16"),
        Tier("blk", "blk"),
        Tier("blk-all", "blk", exact=False),
        Tier("mix-int8", "wide-kd4", **_FFN_Q4K),
        Tier("int8", "wide-kd4"),
    )
}
# a tuning variant names a feature a path may turn off; auto takes any of them
VARIANTS = tuple(sorted({v for p in TABLE.values() for v in p.variants}))
CHOICES = ("auto", "mmq", *TABLE)  # --gemm / MINFER_GEMM; mmq: the seeds' config, wide-kd4
# `minfer perplexity --emulate` grids: label -> (the path whose routes decide the weights, its
# Emulation), the first path of the table declaring a label (q8_1: wide-kd4)
EMULATIONS: dict = {}
for _p in TABLE.values():
    for _k, _e in _p.emulations.items():
        EMULATIONS.setdefault(_k, (_p, _e))


@dataclass(frozen=True)
class Route:
    """choose_path's answer: the path, why a weight fell back to f16 ('' when f16 was asked
    for or won), and a notice to print once (the smem guard's fallback)."""

    path: GemmPath
    why: str = ""
    notice: str = ""


# the model width from which `auto` runs blk ahead of f16 on sm_90: at the 8B shape (d 4096,
# H200) blk is 1.25x f16 sustained and passes gate 6 (docs/perf.md); narrower models keep the
# exact f16 path, where blk's operand launches weigh more against small GEMMs
BLK_AUTO_WIDTH = 4096


def auto_tiers(arch, width: int = 0) -> tuple[str, ...]:
    """The memory tiers `auto` tries on `arch` for a model of `width` (d_model), fastest first
    (TIERS' order, those whose path runs there): f16; on sm_90 blk (1.03 B per weight against
    f16's 2, ffn_down on f16) and blk-all (ffn_down too); mix-int8 (ffn q4_K on the wide kernel)
    and int8 (the raw GGUF bytes). From BLK_AUTO_WIDTH on sm_90 blk goes first and f16 is not
    tried (it needs more memory than blk: where blk does not fit, neither does f16)."""
    tiers = tuple(
        n for n, t in TIERS.items() if TABLE[t.path].archs is None or arch in TABLE[t.path].archs
    )
    if "blk" in tiers and width >= BLK_AUTO_WIDTH:
        return tuple(t for t in tiers if t != "f16")
    return tiers


def choose_path(
    qtype: int,
    arch,
    shape: tuple[int, int, int],
    choice: str = "auto",
    smem_optin: int | None = None,
    tier: str = "f16",
    alone: bool = False,
    cls: str = "",
    kind: str = "",
    exact: bool = True,
) -> Route:
    """The path of y[M, N] = x[M, K] @ W[N, K].T with W of GGUF type `qtype` on `arch`
    ("sm_90"; None: unknown). choice: "auto" or a TABLE name (the seeds' "mmq" is resolved
    before, GemmChoice); tier: auto's memory tier (a TIERS name), whose path runs the weight
    when it takes the weight's class `cls` (attn, ffn, head) and type; smem_optin: the device's
    opt-in shared memory (None: unbounded), a wide kernel over it runs the narrow kernel (the
    smem guard, with a notice); alone: the weight runs as its own GEMM of a fraction of a wave
    (a bias-free attn_v that cannot join q|k: 65 us on the int8 kernels, 24 us on f16 at the 8B
    shape, M = 512), which int8 paths leave to f16; kind: the weight's kind (ffn_down, ...),
    which a path may leave to f16 for accuracy (GemmPath.f16_kinds) unless not `exact` (the
    tuning variant no-exact-down) or auto's tier says so."""
    M, N, K = shape
    name = choice
    if choice == "auto":
        t = TIERS[tier]
        if not t.takes(cls, qtype):
            return Route(F16, f"{t.name} tier")
        name, exact = t.path, exact and t.exact
    if name not in TABLE:
        raise ValueError(f"unknown GEMM path {name!r} (known: {', '.join(TABLE)})")
    p = TABLE[name]
    if not p.int8:
        return Route(F16)
    why = p.unsupported(qtype, arch, K)
    if why:
        return Route(F16, why)
    if alone:
        return Route(F16, "attn_v alone: faster on f16")
    if exact and kind in p.f16_kinds:
        return Route(F16, f"{kind}: f16 for accuracy")
    if p.gemv_f16 and M == 1:
        return Route(F16, "M = 1: the f16 GEMV")
    if smem_optin is not None and (p.smem(qtype) or 0) > smem_optin:
        need = p.smem(qtype)
        if p.kd:
            return Route(
                NARROW,
                notice=(
                    f"MMQ wide KD={p.kd} needs {need} B of shared memory, over this GPU's opt-in "
                    f"cap of {smem_optin} B: using the narrow MMQ kernel instead"
                ),
            )
        return Route(F16, f"{p.name} needs {need} B of shared memory, over the cap {smem_optin}")
    return Route(p)
