"""The per-weight path plan of the CUDA backend: which GEMM path runs each linear weight
(minfer.cuda.paths.choose_path decides; this module only asks it per weight), and which
weights of a layer are fused into one GEMM.

- `plan_routes`: weight name -> (path name, why) for every linear weight (attn_q/k/v/output,
  ffn_gate/up/down of each layer, W: [N, K]) and the LM head (M = 1); why: a short reason for
  f16 where another path was asked for (or where auto's memory tier keeps the weight's class
  on f16). `auto` plans the first memory tier whose plan fits the free device memory.
- `weight_class`: attn, ffn or head, what a mixed tier (paths.TIERS) splits by.
- `summarize_routes`: the one-line "MMQ (...): n GEMMs (q4_K a, q6_K b), f16: m GEMMs (...)"
  that bench, check and prefill print.
Fusion (`plan_fusion`, `plan_glu`, `plan_rope`) is minfer.cuda.plan.fusion's.
"""

from __future__ import annotations

import sys

from minfer.cuda.paths import TABLE, auto_tiers, choose_path, qname
from minfer.cuda.plan.config import GemmChoice

_WARNED: set = set()
_qname = qname


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        print(f"minfer: {msg}", file=sys.stderr)


def linear_names(model) -> list[str]:
    """Every GEMM weight: each layer's linear tensors (the family's layer schema), the LM head."""
    from minfer.families import schema_of

    c = model.config
    sch = schema_of(c)
    return [n for i in range(c.n_layers) for n in sch.names(i, "linear")] + [model.output_name]


def weight_kind(name: str) -> str:
    """A layer weight's kind from its name: "ffn_down" of "blk.3.ffn_down.weight"."""
    return name.split(".")[-2]


def weight_class(model, name: str) -> str:
    """'head' (the LM head), 'attn' (attn_q/k/v/output) or 'ffn' (ffn_gate/up/down)."""
    if name == model.output_name:
        return "head"
    return "attn" if ".attn_" in name else "ffn"


def plan_routes(
    model, choice: GemmChoice | None = None, rt=None, ubatch: int = 512, tier: str | None = None
) -> dict[str, tuple[str, str]]:
    """weight name -> (path name, why) for every linear weight and the LM head. rt: the
    runtime (arch, smem_optin; None: an unknown GPU); tier: auto's memory tier (paths.TIERS;
    None: the first; the one that fits the free memory is plan.make_plan's choice)."""
    choice = choice or GemmChoice()
    arch = getattr(rt, "arch", None)
    if choice.path == "auto" and tier is None:  # (the tier that fits: plan.make_plan)
        tier = auto_tiers(arch, model.config.d_model)[0]
    smem = getattr(rt, "smem_optin", None)
    routes: dict[str, tuple[str, str]] = {}

    def route(n: str, alone: bool = False) -> tuple[str, str]:
        t = model.tensor(n)
        N, K = (int(s) for s in t.shape)
        M = 1 if n == model.output_name else ubatch
        r = choose_path(
            t.qtype,
            arch,
            (M, N, K),
            choice.path,
            smem,
            tier or "f16",
            alone,
            weight_class(model, n),
            weight_kind(n),
            choice.on("exact-down"),
        )
        if r.notice:
            _warn_once(r.notice)
        return r.path.name, r.why

    for n in linear_names(model):
        routes[n] = route(n)
    if not model.config.qkv_bias:
        for i in range(model.config.n_layers):
            q, k, v = (f"blk.{i}.attn_{x}.weight" for x in "qkv")
            same_type = (
                TABLE[routes[v][0]].via_f16
                or model.tensor(q).qtype == model.tensor(k).qtype == model.tensor(v).qtype
            )
            if TABLE[routes[v][0]].int8 and not (
                routes[q][0] == routes[k][0] == routes[v][0] and same_type
            ):
                routes[v] = route(v, alone=True)
    return routes


def summarize_routes(model, routes: dict[str, tuple[str, str]]) -> str:
    """'MMQ (wide-kd4): 49 GEMMs (q4_K 33, q6_K 16); f16: 9 (attn_v alone: faster on f16 8,
    ...)' counting each weight once (a tied LM head counts once)."""
    mmq: dict[str, int] = {}
    f16: dict[str, int] = {}
    paths = set()
    for n, (path, why) in routes.items():
        if not TABLE[path].int8:
            f16[why] = f16.get(why, 0) + 1
        else:
            paths.add(path)
            q = _qname(model.tensor(n).qtype)
            mmq[q] = mmq.get(q, 0) + 1
    nm, nf = sum(mmq.values()), sum(f16.values())
    head = f"MMQ ({', '.join(sorted(paths))})" if paths else "MMQ"
    mm = ", ".join(f"{k} {v}" for k, v in sorted(mmq.items()))
    # a reason per f16 weight the user's path could not take; "" is f16 by choice
    ff = ", ".join(f"{k or 'chosen'} {v}" for k, v in sorted(f16.items(), key=lambda kv: -kv[1]))
    f16_part = f"f16: {nf} GEMMs" + (f" ({ff})" if any(f16) else "")
    return f"{head}: {nm} GEMMs ({mm}), {f16_part}" if nm else f16_part
