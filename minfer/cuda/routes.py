"""The per-weight path plan of the CUDA backend: which GEMM path runs each linear weight
(minfer.cuda.paths.choose_path decides; this module only asks it per weight), and which
weights of a layer are fused into one GEMM.

- `plan_routes`: weight name -> (path name, why) for every linear weight (attn_q/k/v/output,
  ffn_gate/up/down of each layer, W: [N, K]) and the LM head (M = 1); why: a short reason for
  f16 where another path was asked for. `auto` plans the first memory tier whose plan fits the
  free device memory (paths.choose_tier over weights.plan_memory).
- `summarize_routes`: the one-line "MMQ (...): n GEMMs (q4_K a, q6_K b), f16: m GEMMs (...)"
  that bench, check and prefill print.
- `plan_fusion`: when q, k, v (resp. gate, up) of a layer all run on f16 and share K, they
  become row ranges of one f16 weight [Nq + 2 Nkv, K] (resp. [2 d_ff, K]) run as one GEMM.
- `plan_glu` / `plan_rope`: the fused groups whose GEMM applies the swiglu / rope in its
  epilogue.
"""

from __future__ import annotations

import sys

from minfer.cuda.config import GemmChoice
from minfer.cuda.paths import Q4_K, auto_tiers, choose_path, choose_tier, qname

_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_WARNED: set = set()
_qname = qname


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        print(f"minfer: {msg}", file=sys.stderr)


def linear_names(model) -> list[str]:
    c = model.config
    return [f"blk.{i}.{n}.weight" for i in range(c.n_layers) for n in _LINEAR] + \
        [model.output_name]


def plan_routes(model, choice: GemmChoice | None = None, rt=None, ubatch: int = 512,
                max_tokens: int | None = None, tier: str | None = None
                ) -> dict[str, tuple[str, str]]:
    """weight name -> (path name, why) for every linear weight and the LM head. rt: the
    runtime (arch, smem_optin, mem_info; None: an unknown GPU with unbounded memory); tier:
    auto's memory tier, else chosen from rt.mem_info() for max_tokens (weights.plan_memory)."""
    choice = choice or GemmChoice()
    arch = getattr(rt, "arch", None)
    if choice.path == "auto" and tier is None:
        tiers = auto_tiers(arch)
        free = None
        if max_tokens is not None and hasattr(rt, "mem_info"):
            free = rt.mem_info()[0]
        if free is None:
            tier = tiers[0]
        else:
            from minfer.cuda.weights import plan_memory

            need = {t: sum(plan_memory(model, plan_routes(model, choice, rt, ubatch, tier=t),
                                       max_tokens, ubatch, getattr(rt, "sm_count", 0)).values())
                    for t in tiers}
            tier = choose_tier(need, free)
    smem = getattr(rt, "smem_optin", None)
    routes: dict[str, tuple[str, str]] = {}

    def route(n: str, alone: bool = False) -> tuple[str, str]:
        t = model.tensor(n)
        N, K = (int(s) for s in t.shape)
        M = 1 if n == model.output_name else ubatch
        r = choose_path(t.qtype, arch, (M, N, K), choice.path, smem, tier or "f16", alone)
        if r.notice:
            _warn_once(r.notice)
        return r.path.name, r.why

    for n in linear_names(model):
        routes[n] = route(n)
    if not model.config.qkv_bias:
        for i in range(model.config.n_layers):
            q, k, v = (f"blk.{i}.attn_{x}.weight" for x in "qkv")
            if routes[v][0] != "f16" and not (
                    routes[q][0] == routes[k][0] == routes[v][0]
                    and model.tensor(q).qtype == model.tensor(k).qtype == model.tensor(v).qtype):
                routes[v] = route(v, alone=True)
    return routes


def summarize_routes(model, routes: dict[str, tuple[str, str]]) -> str:
    """'MMQ (wide-kd4): 49 GEMMs (q4_K 33, q6_K 16); f16: 9 (attn_v alone: faster on f16 8,
    ...)' counting each weight once (a tied LM head counts once)."""
    mmq: dict[str, int] = {}
    f16: dict[str, int] = {}
    paths = set()
    for n, (path, why) in routes.items():
        if path == "f16":
            f16[why] = f16.get(why, 0) + 1
        else:
            paths.add(path)
            q = _qname(model.tensor(n).qtype)
            mmq[q] = mmq.get(q, 0) + 1
    nm, nf = sum(mmq.values()), sum(f16.values())
    head = f"MMQ ({', '.join(sorted(paths))})" if paths else "MMQ"
    mm = ", ".join(f"{k} {v}" for k, v in sorted(mmq.items()))
    ff = ", ".join(f"{k} {v}" for k, v in sorted(f16.items(), key=lambda kv: -kv[1]))
    return (f"{head}: {nm} GEMMs" + (f" ({mm})" if mm else "") + f", f16: {nf} GEMMs"
            + (f" ({ff})" if ff else ""))


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
    out: dict[str, tuple[str, int, int]] = {}
    for i in range(model.config.n_layers):
        for group, members in (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
                               ("attn_qk", ("attn_q", "attn_k")),
                               ("ffn_gate_up", ("ffn_gate", "ffn_up"))):
            names = [f"blk.{i}.{n}.weight" for n in members]
            if any(n in out for n in names):
                continue   # already in the q|k|v group
            if group == "attn_qk" and model.config.qkv_bias:
                continue
            paths = {routes[n][0] for n in names}
            if len(paths) != 1:
                continue
            if paths != {"f16"} and len({model.tensor(n).qtype for n in names}) != 1:
                continue
            shapes = [model.tensor(n).shape for n in names]
            if len({k for _, k in shapes}) != 1:
                continue
            row = 0
            for n, (N, _) in zip(names, shapes):
                out[n] = (f"blk.{i}.{group}.weight", row, int(N))
                row += int(N)
    return out


def plan_glu(model, choice: GemmChoice, routes: dict[str, tuple[str, str]],
             fused: dict[str, tuple[str, int, int]]) -> set[str]:
    """The fused gate|up group names whose GEMM writes the swiglu from its epilogue (their
    rows interleaved per 16 at load, glu_rows): q4_K on the SB kernel (mmq_sb_linear) or on the
    f16 path (gemm_f16_nt's glu mode), unless the tuning variant no-glu; d_ff % 8 == 0."""
    out = set()
    if not choice.on("glu"):
        return out
    if model.config.d_ff % 8:
        return out
    for i in range(model.config.n_layers):
        gate = f"blk.{i}.ffn_gate.weight"
        if gate not in fused:
            continue
        path = routes[gate][0]
        if path == "f16" or (path == "sb" and int(model.tensor(gate).qtype) == Q4_K):
            out.add(fused[gate][0])
    return out


def plan_rope(model, choice: GemmChoice, routes: dict[str, tuple[str, str]],
              fused: dict[str, tuple[str, int, int]]) -> set[str]:
    """The fused q|k|v group names whose GEMM writes roped q and the K/V cache rows from its
    epilogue (gemm_f16_nt's rope mode, minfer.cuda.layers.QkvRope): on the f16 path unless the
    tuning variant no-rope, llama-order rope (a neox pair spans threads) and no q/k/v
    bias (added to the f32 product before the rope launch)."""
    c = model.config
    if not choice.on("rope") or c.rope_neox or c.qkv_bias or c.head_dim % 2:
        return set()
    out = set()
    for i in range(c.n_layers):
        q = f"blk.{i}.attn_q.weight"
        group = fused.get(q, ("",))[0]
        if group.endswith(".attn_qkv.weight") and routes[q][0] == "f16":
            out.add(group)
    return out
