"""The mixture-of-experts part of the CUDA plan (pure arithmetic on the model): which path holds
and runs the experts (`moe_path`: the plan's own, chosen once with the routes), the device bytes
of the routers and experts as minfer.cuda.load.moe.MoeLayers holds them on that path, its
buffers for ubatch tokens, and the refusal naming the bytes when the plan does not fit
(`check_fits`). The MoE FFN itself: minfer.cuda.load.moe; its kernels: kernels/moe.cu
(minfer.cuda.ops.moe) and, on blk, kernels/mmq_blk.cu's moe_blk_* (minfer.cuda.ops.moe_blk)."""

from __future__ import annotations

import numpy as np

from minfer.errors import GPUError

EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
PATHS = ("f16", "blk")  # the experts' paths: f16 (moe.cu), blk int8 (mmq_blk.cu's moe_blk_*)


def is_moe(c) -> bool:
    return bool(getattr(c, "n_expert", 0))


def moe_path(routes) -> str:
    """The experts' path of a plan: "blk" when any of its linear weights runs on blk (--gemm blk,
    auto's blk tiers: the engine's GEMM path, so a memory tier that needs blk's bytes takes the
    experts along), else "f16"."""
    return "blk" if any(p == "blk" for p, _ in routes.values()) else "f16"


def _stack_bytes(shape, path: str) -> int:
    from minfer.cuda.ops.moe_blk import experts_bytes

    E, N, K = (int(s) for s in shape)
    return experts_bytes(E, N, K) if path == "blk" else E * N * K * 2


def weight_bytes(model, path: str = "f16") -> int:
    """Device bytes of every layer's router (f16) and experts as MoeLayers holds them: f16
    (2 B a weight), or blk (each expert's [N, K] as a blk weight operand: ~1.03 B a weight,
    rows padded to 128; gate|up one stack of 2F rows)."""
    c = model.config
    if not is_moe(c):
        return 0
    n = 0
    for il in range(c.n_layers):
        t = lambda s: tuple(model.tensor(f"blk.{il}.{s}.weight").shape)  # noqa: E731
        n += int(np.prod(t("ffn_gate_inp"), dtype=np.int64)) * 2
        E, F, K = t("ffn_gate_exps")
        n += _stack_bytes((E, 2 * F, K), path) + _stack_bytes(t("ffn_down_exps"), path)
    return n


def staging_bytes(model, path: str = "f16") -> int:
    """blk: one layer's f16 expert stacks, alive while they are requantized (MoeLayers._upload);
    f16: 0 (the stacks are the weights)."""
    c = model.config
    if not is_moe(c) or path != "blk":
        return 0
    return c.n_expert * 3 * c.d_ff_exp * c.d_model * 2


def act_bytes(c, ubatch: int, path: str = "f16") -> int:
    """Device bytes of the MoE buffers for ubatch tokens (MoeLayers.__init__'s; blk: + the
    grouped GEMMs' token operand)."""
    if not is_moe(c):
        return 0
    T, E, k = ubatch, c.n_expert, c.n_expert_used
    P = T * k
    n = T * E * 4 + P * (4 + 4 + 4 + 4) + P * c.d_ff_exp * 2 + P * c.d_model * 4 + 8 * (E + 1)
    if path == "blk":
        from minfer.cuda.ops.moe_blk import operand_bytes

        n += max(operand_bytes(P, E, c.d_model), operand_bytes(P, E, c.d_ff_exp))
    return n


def check_fits(model, plan: dict[str, int], free: int, margin: int, path: str = "f16") -> None:
    """GPUError naming the bytes when the plan (experts included) does not fit `free`: the
    expert weights on `path`, the rest, what is free, and what would hold less."""
    from minfer.cuda.plan.memory import gb

    if not is_moe(model.config):
        return
    need = sum(plan.values())
    if need + margin <= free:
        return
    ew = plan.get("expert weights", 0)
    held = "as f16" if path == "f16" else "as blk int8"
    hint = (
        "the blk int8 expert path (--gemm blk, sm_90: ~1.03 B a weight) holds them in about "
        f"half ({gb(weight_bytes(model, 'blk'))}); "
        if path == "f16"
        else ""
    )
    raise GPUError(
        f"GPU out of memory for this mixture-of-experts model: its experts {held} take "
        f"{gb(ew)} ({model.config.n_layers} layers x {model.config.n_expert} experts), the rest "
        f"of the plan {gb(need - ew)}, plus the {gb(margin)} margin; {gb(free)} free. "
        f"{hint}otherwise use a GPU with more memory, a smaller model, or --backend cpu"
    )
