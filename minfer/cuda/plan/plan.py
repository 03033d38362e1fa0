"""The plan of a CUDA backend, computed once: pure functions from (model, GPU, free memory, the
user's choice) to one frozen `Plan`, which the memory estimate, the memory line, the upload,
the buffers and the Forward all read (nothing recomputes a route, a fusion or a size later).

`make_plan`: every candidate plan (auto: one per memory tier, paths.auto_tiers; a forced path:
its own, and auto's tiers only as the suggestions when it does not fit), each complete
(routes with reasons, fusion, the glu and rope epilogues, the layer groups, the bytes of every
part), then memory.choose_tier picks the fastest that fits the free memory. The GPU is read
through `rt` only for what it is (arch, SM count, opt-in shared memory, free memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType as frozen
from typing import Mapping

from minfer.cuda.paths import auto_tiers
from minfer.cuda.plan.config import GemmChoice
from minfer.cuda.plan.fusion import (
    GemmGroup,
    glu_all,
    plan_fusion,
    plan_glu,
    plan_groups,
    plan_rope,
)
from minfer.cuda.plan.memory import MemoryPlan, choose_tier
from minfer.cuda.plan.moe import moe_experts


@dataclass(frozen=True)
class Plan:
    choice: GemmChoice
    tier: str | None  # auto's memory tier (None: a forced path)
    routes: Mapping[str, tuple[str, str]]  # linear weight -> (path name, why f16)
    fused: Mapping[str, tuple[str, int, int]]  # member -> (group, first row, rows)
    glu: frozenset  # gate|up groups whose GEMM writes the swiglu
    rope: frozenset  # q|k|v groups whose GEMM ropes (f16 epilogue)
    groups: tuple  # per layer {"attn": (GemmGroup, ...), "ffn": (...)}
    parts: Mapping[str, int]  # memory part -> bytes (sizes.plan_memory)
    glu_all: bool  # every gate|up GEMM writes the swiglu: no f32 buffer
    max_tokens: int
    ubatch: int
    chunk: int | None  # the upload's chunk bytes
    memory: MemoryPlan | None = None  # the decision among the candidates (the memory line)
    moe: object = None  # a MoE model's expert GEMMs (GemmPath.experts: plan.moe.moe_experts)

    @property
    def need(self) -> int:
        return sum(self.parts.values())


def plan_for(
    model,
    choice: GemmChoice,
    rt=None,
    max_tokens: int = 4096,
    ubatch: int = 512,
    chunk: int | None = None,
    tier: str | None = None,
) -> Plan:
    """One complete candidate: choice's routes (on auto's `tier`), their fusion, epilogues,
    layer groups and the bytes of every part."""
    from minfer.cuda.plan.routes import plan_routes
    from minfer.cuda.plan.sizes import plan_memory

    routes = plan_routes(model, choice, rt, ubatch, tier=tier or "f16")
    experts = moe_experts(routes, auto=choice.path == "auto")
    fused = plan_fusion(model, routes)
    glu = plan_glu(model, choice, routes, fused)
    every_glu = glu_all(model, routes, glu)
    parts = plan_memory(
        model,
        routes,
        max_tokens,
        ubatch,
        getattr(rt, "sm_count", 0),
        every_glu,
        chunk,
        fused,
        experts,
    )
    groups = tuple(
        {k: plan_groups(model, fused, i, k) for k in ("attn", "ffn")}
        for i in range(model.config.n_layers)
    )
    return Plan(
        choice,
        tier if choice.path == "auto" else None,
        frozen(routes),
        frozen(fused),
        frozenset(glu),
        frozenset(plan_rope(model, choice, routes, fused)),
        groups,
        frozen(parts),
        every_glu,
        max_tokens,
        ubatch,
        chunk,
        moe=experts,
    )


def make_plan(
    model,
    choice: GemmChoice | None = None,
    rt=None,
    max_tokens: int = 4096,
    ubatch: int = 512,
    chunk: int | None = None,
) -> Plan:
    """The plan the backend runs: auto's fastest tier that fits the free memory (rt.mem_info;
    unknown without it: the first), or the forced path's plan, its memory decision attached
    (a forced plan that does not fit carries auto's tiers as the suggestions)."""
    choice = choice or GemmChoice()
    free = rt.mem_info()[0] if hasattr(rt, "mem_info") else None
    auto = replace(choice, path="auto")

    def tiers() -> dict[str, Plan]:
        return {
            t: plan_for(model, auto, rt, max_tokens, ubatch, chunk, t)
            for t in auto_tiers(getattr(rt, "arch", None), model.config.d_model)
        }

    if choice.path == "auto":
        cands = tiers()
        memory = choose_tier({t: p.need for t, p in cands.items()}, free)
        return replace(cands[memory.chosen], memory=memory)
    plan = plan_for(model, choice, rt, max_tokens, ubatch, chunk)
    memory = choose_tier({choice.path: plan.need}, free, forced=choice.path)
    if not memory.fits:
        memory = replace(memory, alt={t: p.need for t, p in tiers().items()})
    return replace(plan, memory=memory)


def kv_slot_bytes(c) -> int:
    """Bytes of one KV cache slot over every layer (f16 K and V)."""
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2


def fit_kv_slots(
    model,
    choice: GemmChoice | None,
    rt,
    ubatch: int,
    want: int,
    chunk: int | None = None,
    align: int = 128,
    extra: int = 0,
) -> int:
    """The most KV slots, at most `want` and a multiple of `align`, that the free memory holds
    beside the rest of the plan (its fastest tier that fits with `align` slots) plus `extra`
    bytes allocated outside the plan, 5 % of the rest kept back: a batch's KV cache, sized
    so its waves never run out of memory. 0 when not even `align` slots fit."""
    from minfer.cuda.plan.memory import MARGIN

    plan = make_plan(model, choice, rt, align, ubatch, chunk)
    free = rt.mem_info()[0]
    per = kv_slot_bytes(model.config)
    rest = plan.need - align * per
    avail = int((free - MARGIN - rest - extra) * 0.95)
    return max(0, min(int(want), avail // per) // align * align)


def plan_tiers(
    model,
    choice: GemmChoice | None = None,
    rt=None,
    ubatch: int = 512,
    max_tokens: int = 4096,
    chunk: int | None = None,
) -> MemoryPlan:
    """make_plan's memory decision alone (memory.MemoryPlan: each tier's need, the choice)."""
    return make_plan(model, choice, rt, max_tokens, ubatch, chunk).memory


__all__ = [
    "Plan",
    "plan_for",
    "make_plan",
    "plan_tiers",
    "GemmGroup",
    "fit_kv_slots",
    "kv_slot_bytes",
]
