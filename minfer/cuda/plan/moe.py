"""The mixture-of-experts part of the CUDA plan (pure arithmetic on the model): which expert
GEMMs hold and run the experts (`moe_experts`: a path's GemmPath.experts, chosen once with the
routes), the device bytes of the routers and experts as minfer.cuda.load.moe.MoeLayers holds
them, its buffers for ubatch tokens, and the refusal naming the bytes when the plan does not fit
(`check_fits`). The MoE FFN itself: minfer.cuda.load.moe; the expert GEMMs: kernels/moe.cu
(minfer.cuda.paths.f16.moe) and kernels/mmq_blk.cu's moe_blk_* (minfer.cuda.paths.blk.moe)."""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError

EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def is_moe(c) -> bool:
    return bool(getattr(c, "n_expert", 0))


def _all_experts():
    from minfer.cuda.paths import TABLE

    return [p.experts for p in TABLE.values() if p.experts is not None]


def _f16():
    from minfer.cuda.paths.f16.moe import F16_EXPERTS

    return F16_EXPERTS


def moe_experts(routes, auto: bool = False):
    """The expert GEMMs of a plan (GemmPath.experts): the most compact that the paths of its
    linear weights bring (blk's when any weight runs on blk: --gemm blk), else f16's. auto
    (the plan chosen by `--gemm auto`): f16's, exact. blk's experts are taken only when asked
    for: on the H100 their forward stays 0.04-0.05 (relative) from the CPU reference that
    rounds as they do, where the dense blk path stays within 0.03, and the KL-divergence gate
    has not been measured on a MoE model (docs/families.md)."""
    from minfer.cuda.paths import TABLE

    if auto:
        return _f16()
    have = {TABLE[p].experts for p, _ in routes.values()} - {None}
    return min(have, key=lambda e: e.bytes_per_weight) if have else _f16()


def weight_bytes(model, experts=None) -> int:
    """Device bytes of every layer's router (f16) and experts as MoeLayers holds them with
    `experts` (f16's by default: 2 B a weight; blk's ~1.03 B, rows padded to 128 per expert;
    gate|up one stack of 2F rows), qwen2moe's shared expert (f16 on either) included."""
    c = model.config
    if not is_moe(c):
        return 0
    ex = experts or _f16()
    n = 0
    for il in range(c.n_layers):
        t = lambda s: tuple(model.tensor(f"blk.{il}.{s}.weight").shape)  # noqa: E731
        n += int(np.prod(t("ffn_gate_inp"), dtype=np.int64)) * 2
        E, F, K = t("ffn_gate_exps")
        n += ex.stack_bytes(E, 2 * F, K) + ex.stack_bytes(*t("ffn_down_exps"))
        if getattr(c, "d_ff_shexp", 0):  # qwen2moe's shared expert: f16 always, + its gate
            n += 2 * (3 * c.d_ff_shexp * c.d_model + c.d_model)
    return n


def staging_bytes(model, experts=None) -> int:
    """One layer's f16 expert stacks, alive while they are turned into the held form
    (MoeLayers._upload; 0 where the stacks are the weights)."""
    c = model.config
    return (experts or _f16()).staging_bytes(c) if is_moe(c) else 0


def act_bytes(c, ubatch: int, experts=None) -> int:
    """Device bytes of the MoE buffers for ubatch tokens (MoeLayers.__init__'s, the expert
    GEMMs' activation operand included)."""
    if not is_moe(c):
        return 0
    T, E, k = ubatch, c.n_expert, c.n_expert_used
    P = T * k
    n = T * E * 4 + P * (4 + 4 + 4 + 4) + P * c.d_ff_exp * 2 + P * c.d_model * 4 + 8 * (E + 1)
    fs = getattr(c, "d_ff_shexp", 0)
    if fs:  # the shared expert's gate logits, activations and output
        n += T * 4 + T * fs * 2 + T * c.d_model * 4
    return n + (experts or _f16()).operand_bytes(P, E, c)


def check_fits(model, plan: dict[str, int], free: int, margin: int, experts=None) -> None:
    """GPUError naming the bytes when the plan (experts included) does not fit `free`: the
    expert weights as `experts` holds them, the rest, what is free, and what would hold less."""
    from minfer.cuda.plan.memory import gb

    if not is_moe(model.config):
        return
    need = sum(plan.values())
    if need + margin <= free:
        return
    ew = plan.get("expert weights", 0)
    ex = experts or _f16()
    best = min(_all_experts(), key=lambda e: e.bytes_per_weight)
    held = weight_bytes(model, best)  # (the rest of the plan as it is: a lower bound)
    hint = (
        f"The {best.label} expert GEMMs (--gemm {best.name}, {best.note or 'any GPU'}: "
        f"~{best.bytes_per_weight:.2f} B a weight) hold them in {gb(held)}; otherwise use"
        if best.bytes_per_weight < ex.bytes_per_weight and need - ew + held + margin <= free
        else "Use"
    )
    raise GPUError(
        f"GPU out of memory for this mixture-of-experts model: its experts as {ex.label} take "
        f"{gb(ew)} ({model.config.n_layers} layers x {model.config.n_expert} experts), the rest "
        f"of the plan {gb(need - ew)}, plus the {gb(margin)} margin; {gb(free)} free. "
        f"{hint} a GPU with more memory, a smaller model, or --backend cpu"
    )
