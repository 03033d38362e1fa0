"""The per-weight path plan of the CUDA backend: which GEMM runs each linear weight, and
which weights of a layer are fused into one GEMM.

- `plan_routes`: weight name -> (path, why) for every linear weight (attn_q/k/v/output,
  ffn_gate/up/down of each layer, W: [N, K]) and the LM head (M = 1). path is pick_gemm's
  answer ("f16" or "mmq-*"), except that a bias-free model's attn_v stays on "f16" on MMQ
  unless it can join q and k in one fused q|k|v GEMM (same path and type): alone, its N = Hkv *
  D is a fraction of a wave on the MMQ kernels (8B at M = 512: 65 us on either wgmma kernel,
  24 us on f16), while fused it rides in the q|k GEMM's last wave; why: a short reason for f16.
- `summarize_routes`: the one-line "MMQ (...): n GEMMs (q4_K a, q6_K b), f16: m GEMMs (...)"
  that bench, check and prefill print.
- `plan_fusion`: when q, k, v (resp. gate, up) of a layer all run on f16 and share K, they
  become row ranges of one f16 weight [Nq + 2 Nkv, K] (resp. [2 d_ff, K]) run as one GEMM.
- `plan_glu`: the fused gate|up groups whose GEMM applies the swiglu in its epilogue (q4_K on
  the SB kernel; their rows are interleaved at load, mmq_sb_ref.glu_rows).
"""

from __future__ import annotations

from minfer.cuda.config import GemmConfig
from minfer.cuda.dispatch import pick_gemm

_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

_QNAMES = {12: "q4_K", 14: "q6_K"}


def _qname(qtype: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(int(qtype)).name.lower().replace("_k", "_K")
    except (ImportError, ValueError):
        return _QNAMES.get(int(qtype), f"type {qtype}")


def plan_routes(model, cfg: GemmConfig, rt=None, ubatch: int = 512) -> dict[str, tuple[str, str]]:
    """weight name -> (path, why) for every linear weight and the LM head. path: pick_gemm's
    answer, except "f16" where the consumer needs f16 output; why: a short reason for f16."""
    c = model.config
    names = [f"blk.{i}.{n}.weight" for i in range(c.n_layers) for n in _LINEAR]
    names.append(model.output_name)
    routes: dict[str, tuple[str, str]] = {}
    for n in names:
        t = model.tensor(n)
        N, K = t.shape
        M = 1 if n == model.output_name else ubatch
        path = pick_gemm(t.qtype, M, N, K, cfg, rt)
        why = ""
        if path == "f16":
            from minfer.cuda.mmq import has_mmq

            why = ("MMQ off" if not cfg.mmq else
                   f"{_qname(t.qtype)}: no MMQ kernel" if not has_mmq(t.qtype) else
                   f"K={K} not a multiple of 256" if K % 256 else
                   "q6_K: f16 by MINFER_MMQ_Q6K_F16")
        routes[n] = (path, why)
    if not c.qkv_bias:
        for i in range(c.n_layers):
            q, k, v = (f"blk.{i}.attn_{x}.weight" for x in "qkv")
            if routes[v][0] != "f16" and not (
                    routes[q][0] == routes[k][0] == routes[v][0]
                    and model.tensor(q).qtype == model.tensor(k).qtype == model.tensor(v).qtype):
                routes[v] = ("f16", "attn_v alone: faster on f16")
    return routes


def summarize_routes(model, routes: dict[str, tuple[str, str]]) -> str:
    """'MMQ (mmq-wide-kd4): 49 GEMMs (q4_K 33, q6_K 16); f16: 9 (attn_v alone: faster on f16 8,
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


def plan_glu(model, cfg: GemmConfig, routes: dict[str, tuple[str, str]],
             fused: dict[str, tuple[str, int, int]]) -> set[str]:
    """The fused gate|up group names whose GEMM writes the swiglu from its epilogue (their
    rows interleaved per 16 at load, gemm.glu_rows): q4_K on the SB kernel with cfg.sb_glu
    (MINFER_MMQ_SB_GLU, mmq_sb_linear), or on the f16 path with cfg.f16_glu (MINFER_F16_GLU,
    gemm_f16_nt's glu mode); d_ff % 8 == 0."""
    from minfer.cuda.mmq import Q4_K

    out = set()
    if model.config.d_ff % 8:
        return out
    for i in range(model.config.n_layers):
        gate = f"blk.{i}.ffn_gate.weight"
        if gate not in fused:
            continue
        path = routes[gate][0]
        if (path == "f16" and cfg.f16_glu) or (path == "mmq-sb" and cfg.sb_glu and
                                              int(model.tensor(gate).qtype) == Q4_K):
            out.add(fused[gate][0])
    return out


def plan_rope(model, cfg: GemmConfig, routes: dict[str, tuple[str, str]],
              fused: dict[str, tuple[str, int, int]]) -> set[str]:
    """The fused q|k|v group names whose GEMM writes roped q and the K/V cache rows from its
    epilogue (gemm_f16_nt's rope mode, minfer.cuda.layers.QkvRope): on the f16 path with
    cfg.f16_rope (MINFER_F16_ROPE), llama-order rope (a neox pair spans threads) and no q/k/v
    bias (added to the f32 product before the rope launch)."""
    c = model.config
    if not cfg.f16_rope or c.rope_neox or c.qkv_bias or c.head_dim % 2:
        return set()
    out = set()
    for i in range(c.n_layers):
        q = f"blk.{i}.attn_q.weight"
        group = fused.get(q, ("",))[0]
        if group.endswith(".attn_qkv.weight") and routes[q][0] == "f16":
            out.add(group)
    return out
