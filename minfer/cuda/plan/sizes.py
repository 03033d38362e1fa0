"""How much device memory a plan takes, part by part, and the check against what is free.

- `plan_memory` / `memory_need` / `check_memory`: bytes per part (each path's weights and
  scratch, GemmPath.memory; quantized embedding, KV cache for max_tokens, activations for ubatch
  tokens, upload staging), checked against the device's free memory before anything is allocated
  (GPUError naming what was asked and what is free, in GB); memory_need is what the memory
  tiers are compared by (minfer.cuda.plan.plan) and what the backend checks.
- `upload_slot`: one staging slot of the weight upload (minfer.cuda.load.weights).
Pure arithmetic on the model and the routes; the upload and the buffers are minfer.cuda.load's.
"""

from __future__ import annotations

from minfer.cuda.paths import TABLE
from minfer.errors import GPUError


def plan_memory(
    model,
    routes: dict[str, tuple[str, str]],
    max_tokens: int,
    ubatch: int,
    sms: int = 0,
    glu_all: bool = False,
    chunk: int | None = None,
    fused=None,
    experts=None,
) -> dict[str, int]:
    """part -> bytes the backend will allocate (the keys name the parts in GPUError messages);
    experts: a MoE model's expert GEMMs (the plan's; None: plan.moe.moe_experts(routes));
    sms: the GPU's SM count (a path's per-SM workspace, GemmPath.memory); glu_all:
    every layer's gate|up GEMM writes the swiglu itself (fusion.glu_all), so the f32 gate|up
    buffer is not allocated; chunk: the upload's chunk bytes (two device staging slots of
    upload_slot; None: upload.DEFAULT_CHUNK); fused: plan_fusion's answer (None: computed)."""
    c = model.config
    m = model
    from minfer.cuda.plan.fusion import plan_fusion
    from minfer.cuda.runtime.upload import DEFAULT_CHUNK

    fused = plan_fusion(model, routes) if fused is None else fused  # a group uploads as one
    T = ubatch
    units: dict[str, dict[str, list]] = {}  # path -> weight or fused group -> its unit
    for n, (path, _) in routes.items():
        t = m.tensor(n)
        N, K = (int(s) for s in t.shape)
        g = fused[n][0] if n in fused else n
        u = units.setdefault(path, {}).setdefault(g, [0, K, 0, n == "token_embd.weight"])
        u[0] += N
        u[2] += int(t.data.nbytes)
    # each path's own parts (GemmPath.memory): weights add up, a scratch part takes the largest
    weights = {k: 0 for p in TABLE.values() for k in p.weight_parts}
    for n, (path, _) in routes.items():  # what a weight holds beside its unit (weight_extra)
        for k, v in TABLE[path].weight_extra(n, *(int(s) for s in m.tensor(n).shape)).items():
            weights[k] += v
    scratch = {k: 0 for p in TABLE.values() for k in p.scratch_parts}
    for path, us in units.items():
        w_parts, s_parts = TABLE[path].memory([tuple(u) for u in us.values()], T, sms)
        for k, v in w_parts.items():
            weights[k] += v
        for k, v in s_parts.items():
            scratch[k] = max(scratch[k], v)
    emb = int(m.tensor("token_embd.weight").data.nbytes)
    kv = 2 * c.n_layers * max_tokens * c.n_kv_heads * c.head_dim * 2
    qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    act = T * (
        c.d_model * (4 + 2)
        + qd * (4 + 2 + 2)
        + kd * 4 * 2
        + c.d_ff * ((0 if glu_all else 4 + 4) + 2)
    )
    from minfer.cuda.ops.layers import local_rope

    tables = (
        2 if local_rope(c) else 1  # gemma's local layers: their own base
    ) + (not all(c.has_rope(il) for il in range(c.n_layers)))  # smollm3: identity
    act += c.vocab_size * 4 + tables * (min(max_tokens, c.n_ctx) * c.rope_dim) * 4  # rope
    act += T * c.d_model * 4 if c.post_norms or c.residual_scale != 1.0 else 0  # post32
    from minfer.reference.ops import TOP_MAX

    act += T * TOP_MAX * (4 + 4)  # packed(top=k)'s ids and log-probs (buffers.top_ids, top_lp)
    return {
        **weights,
        "quantized embedding": emb,
        "KV cache": kv,
        "activations": act,
        "upload staging": 2 * upload_slot(m, routes, chunk or DEFAULT_CHUNK),
        **scratch,
        # not among the routes' linear weights: routers and experts as the plan's expert GEMMs
        # hold them (minfer.cuda.load.moe; plan.moe.moe_experts)
        **moe_parts(m, routes, ubatch, experts),
    }


def moe_parts(model, routes, ubatch: int, experts=None) -> dict[str, int]:
    """The MoE parts of a plan: expert weights, their requant staging and buffers, as
    `experts` (the plan's; None: what plan.moe.moe_experts gives the routes) holds them."""
    from minfer.cuda.plan import moe

    ex = experts or moe.moe_experts(routes)
    return {
        "expert weights": moe.weight_bytes(model, ex),
        "MoE requant staging": moe.staging_bytes(model, ex),
        "MoE activations": moe.act_bytes(model.config, ubatch, ex),
    }


def operand_bytes(plan: dict[str, int]) -> dict[str, int]:
    """Operand.scratch -> bytes of that scratch buffer (DeviceBuffers.operands): the plan part
    its paths' operands name."""
    return {p.operand.scratch: plan[p.operand.part] for p in TABLE.values() if p.operand}


def expert_bytes(model) -> int:
    """File bytes of the mixture-of-experts weights (the routers and the stacked experts): the
    GPU would hold them as they are; 0 for a dense model."""
    return sum(
        int(t.data.nbytes)
        for n, t in model.tensors.items()
        if n.endswith(("_exps.weight", "ffn_gate_inp.weight"))
    )


def weight_bytes(model) -> int:
    """File bytes of every tensor (what a GPU holding the model must at least hold)."""
    return sum(int(t.data.nbytes) for t in model.tensors.values())


def memory_need(
    model,
    choice,
    routes: dict[str, tuple[str, str]],
    max_tokens: int,
    ubatch: int,
    sms: int = 0,
    chunk: int | None = None,
) -> dict[str, int]:
    """plan_memory of `routes` as the backend builds them (fusion, the glu epilogues of
    `choice`): what the memory tiers are compared by and what check_memory checks."""
    from minfer.cuda.plan.fusion import glu_all, plan_fusion, plan_glu

    g = plan_glu(model, choice, routes, plan_fusion(model, routes))
    return plan_memory(model, routes, max_tokens, ubatch, sms, glu_all(model, routes, g), chunk)


def check_memory(rt, plan: dict[str, int], max_tokens: int, ubatch: int) -> None:
    """GPUError before any allocation when the plan (weights, KV cache for max_tokens,
    activations for ubatch tokens, scratch) does not fit the device's free memory."""
    from minfer.cuda.plan.memory import MARGIN, gb

    need = sum(plan.values())
    free, total = rt.mem_info()
    if need + MARGIN > free:
        parts = ", ".join(f"{k} {gb(v)}" for k, v in plan.items() if v)
        raise GPUError(
            f"GPU out of memory for this model: needs {gb(need)} of GPU memory "
            f"({parts}) plus the {gb(MARGIN)} margin, {gb(free)} free of "
            f"{gb(total)} (KV cache for {max_tokens} tokens, activations "
            f"for {ubatch}: try a shorter prompt, fewer --greedy tokens or "
            f"a smaller --ubatch)"
        )


def upload_slot(model, names, chunk: int) -> int:
    """Bytes of one staging slot: the largest chunk split_rows cuts from the tensors `names`
    (and the embedding) for `chunk` bytes per chunk."""
    from minfer.cuda.runtime.upload import rows_per_chunk

    slot = 1
    for n in (*names, "token_embd.weight"):
        t = model.tensor(n)
        N = int(t.shape[0])
        rb = int(t.data.nbytes) // N
        slot = max(slot, min(N, rows_per_chunk(rb, chunk)) * rb)
    return slot
