"""Which weights of a layer run as one GEMM, and which fused GEMMs apply the swiglu or the rope in
their epilogue, from the routes (routes.plan_routes: weight name -> (path name, why)).

- `plan_fusion`: q, k, v (resp. gate, up) of a layer on one path and type, sharing K, become row
  ranges of one weight [Nq + 2 Nkv, K] (resp. [2 d_ff, K]) run as one GEMM.
- `plan_glu` / `plan_rope`: the fused groups whose GEMM applies the swiglu / rope in its
  epilogue (on by default where they win; tuning variants no-glu / no-rope turn them off).
- `glu_all`: every layer's gate|up GEMM writes the swiglu / geglu (no f32 gate|up buffer needed).
- `plan_groups`: a layer's q|k|v or gate|up GEMMs in output order (the forward's loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.cuda.paths import TABLE
from minfer.cuda.plan.config import GemmChoice  # noqa: F401  (annotations)


def plan_fusion(model, routes: dict[str, tuple[str, str]]) -> dict[str, tuple[str, int, int]]:
    """weight name -> (fused group name, first row, rows) for q/k/v and gate/up of a layer
    when every member runs on the same path and they share K (the group's GEMM is one launch):
    f16, or one MMQ path with one tensor type (the raw rows concatenate: [sum N, K/256 blocks]).
    When q|k|v cannot fuse (on MMQ a bias-free model's attn_v of another type than q|k stays on
    f16, see plan_routes), q|k still may: the group attn_qk (bias-free models only; its output
    is [T, qd + kd], v runs alone).
    One launch instead of two also fills the GPU better (gate|up at M = 512: 1,792 blocks of
    the wide kernel, 6.8 waves on 132 SMs, instead of two launches of 3.4 waves each; attn_k
    alone at N = 1024 is 32 blocks of the wgmma kernel on 132 SMs)."""
    from minfer.families import schema_of

    out: dict[str, tuple[str, int, int]] = {}
    groups = schema_of(model.config).gemm_groups  # what the family's layer may fuse
    for i in range(model.config.n_layers):
        for group, members in groups:
            names = [f"blk.{i}.{n}.weight" for n in members]
            if any(n in out for n in names):
                continue  # already in the q|k|v group
            if group == "attn_qk" and model.config.qkv_bias:
                continue
            paths = {routes[n][0] for n in names}
            if len(paths) != 1:
                continue
            if (
                not TABLE[next(iter(paths))].via_f16
                and len({model.tensor(n).qtype for n in names}) != 1
            ):
                continue
            shapes = [model.tensor(n).shape for n in names]
            if len({k for _, k in shapes}) != 1:
                continue
            row = 0
            for n, (N, _) in zip(names, shapes):
                out[n] = (f"blk.{i}.{group}.weight", row, int(N))
                row += int(N)
    return out


def plan_glu(
    model,
    choice: GemmChoice,
    routes: dict[str, tuple[str, str]],
    fused: dict[str, tuple[str, int, int]],
) -> set[str]:
    """The fused gate|up group names whose GEMM writes the swiglu (gemma: the geglu) from its
    epilogue (their rows interleaved per 16 at load, glu_rows): any type on the block path
    (mmq_blk_linear) or on the f16 path (gemm_f16_nt's glu modes), unless the tuning variant
    no-glu; d_ff % 8 == 0."""
    out = set()
    if not choice.on("glu"):
        return out
    if model.config.d_ff % 8:
        return out
    for i in range(model.config.n_layers):
        gate = f"blk.{i}.ffn_gate.weight"
        if gate not in fused:
            continue
        if TABLE[routes[gate][0]].glu:
            out.add(fused[gate][0])
    return out


def glu_all(model, routes: dict[str, tuple[str, str]], glu: set[str]) -> bool:
    """Every layer's gate|up GEMM writes the swiglu (glu: plan_glu's groups), so the f32 gate|up
    buffer is not allocated: on the int8 blk kernel (an f16 glu GEMM at M == 1 still goes
    through it)."""
    n = model.config.n_layers
    return len(glu) == n and all(
        TABLE[routes[f"blk.{i}.ffn_gate.weight"][0]].int8 for i in range(n)
    )


def plan_rope(
    model,
    choice: GemmChoice,
    routes: dict[str, tuple[str, str]],
    fused: dict[str, tuple[str, int, int]],
) -> set[str]:
    """The fused q|k|v group names whose GEMM writes roped q and the K/V cache rows from its
    epilogue (gemm_f16_nt's rope mode, minfer.cuda.ops.layers.QkvRope): on the f16 path unless the
    tuning variant no-rope, llama-order rope (a neox pair spans threads), no q/k/v
    bias (added to the f32 product before the rope launch), no q/k norms (qwen3) and one RoPE
    table for every layer (not gemma's local base)."""
    c = model.config
    if (
        not choice.on("rope")
        or c.rope_neox
        or c.qkv_bias
        or c.qk_norm
        or c.head_dim % 2
        or any(c.layer_rope(i) != c.layer_rope(0) for i in range(c.n_layers))
    ):
        return set()
    out = set()
    for i in range(c.n_layers):
        q = f"blk.{i}.attn_q.weight"
        group = fused.get(q, ("",))[0]
        if not c.has_rope(i):  # smollm3's layers without RoPE: rope_qkv on the identity table
            continue
        if group.endswith(".attn_qkv.weight") and TABLE[routes[q][0]].rope:
            out.add(group)
    return out


@dataclass(frozen=True)
class GemmGroup:
    """One GEMM of a layer's q|k|v (or gate|up) input: the weight it runs (a fused group or one
    member), the member whose route it takes, its label, its output width and where each of
    its parts ("q", "k", "v" / "gate", "up") starts in its output columns."""

    weight: str
    member: str
    label: str
    width: int
    parts: tuple


def plan_groups(
    model, fused: dict[str, tuple[str, int, int]], i: int, kind: str
) -> tuple[GemmGroup, ...]:
    """Layer i's GEMMs for `kind` "attn" (q, k, v) or "ffn" (gate, up), in output order: the
    fused groups of plan_fusion, the other members alone (their outputs one after another in
    the layer's f32 buffer)."""
    names = ("attn_q", "attn_k", "attn_v") if kind == "attn" else ("ffn_gate", "ffn_up")
    if kind == "ffn" and getattr(model.config, "n_expert", 0):
        return ()  # a mixture-of-experts FFN: no dense gate|up (minfer.cuda.load.moe runs it)
    out: list[GemmGroup] = []
    seen: set[str] = set()
    for n in names:
        w = f"blk.{i}.{n}.weight"
        if w in seen:
            continue
        if w in fused:
            g = fused[w][0]
            members = [m for m in names if fused.get(f"blk.{i}.{m}.weight", ("",))[0] == g]
            parts = tuple((m.split("_")[1], fused[f"blk.{i}.{m}.weight"][1]) for m in members)
            width = sum(fused[f"blk.{i}.{m}.weight"][2] for m in members)
            seen |= {f"blk.{i}.{m}.weight" for m in members}
            out.append(GemmGroup(g, w, g.split(".")[2], width, parts))
        else:
            seen.add(w)
            out.append(GemmGroup(w, w, n, int(model.tensor(w).shape[0]), ((n.split("_")[1], 0),)))
    return tuple(out)
