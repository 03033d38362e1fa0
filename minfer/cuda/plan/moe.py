"""The mixture-of-experts part of the CUDA plan (pure arithmetic on the model): the device bytes
of the routers and experts as minfer.cuda.load.moe.MoeLayers holds them (f16), its buffers for
ubatch tokens, and the refusal naming the bytes when the plan does not fit (`check_fits`). The
MoE FFN itself: minfer.cuda.load.moe; its kernels: kernels/moe.cu (minfer.cuda.ops.moe)."""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError

EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def is_moe(c) -> bool:
    return bool(getattr(c, "n_expert", 0))


def weight_bytes(model) -> int:
    """Device bytes of every layer's router and experts as MoeLayers holds them (f16)."""
    c = model.config
    if not is_moe(c):
        return 0
    n = 0
    for il in range(c.n_layers):
        for s in (*EXPERTS, "ffn_gate_inp"):
            n += int(np.prod(model.tensor(f"blk.{il}.{s}.weight").shape, dtype=np.int64)) * 2
    return n


def act_bytes(c, ubatch: int) -> int:
    """Device bytes of the MoE buffers for ubatch tokens (MoeLayers.__init__'s)."""
    if not is_moe(c):
        return 0
    T, E, k = ubatch, c.n_expert, c.n_expert_used
    P = T * k
    return T * E * 4 + P * (4 + 4 + 4 + 4) + P * c.d_ff_exp * 2 + P * c.d_model * 4 + 8 * (E + 1)


def check_fits(model, plan: dict[str, int], free: int, margin: int) -> None:
    """GPUError naming the bytes when the plan (experts included) does not fit `free`: the
    expert weights, the rest, what is free, and why (f16 experts; no int8 expert path yet)."""
    from minfer.cuda.plan.memory import gb

    if not is_moe(model.config):
        return
    need = sum(plan.values())
    if need + margin <= free:
        return
    ew = plan.get("expert weights", 0)
    raise GPUError(
        f"GPU out of memory for this mixture-of-experts model: its experts as f16 take "
        f"{gb(ew)} ({model.config.n_layers} layers x {model.config.n_expert} experts), the rest "
        f"of the plan {gb(need - ew)}, plus the {gb(margin)} margin; {gb(free)} free. The CUDA "
        "backend holds experts as f16 (an int8 expert path is not built): use a GPU with "
        "more memory, a smaller model, or --backend cpu"
    )
