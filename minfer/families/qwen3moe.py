"""qwen3moe (src/models/qwen3moe.cpp): Qwen3-30B-A3B / 235B-A22B. qwen3's attention (per-head
q/k RMSNorm before NEOX RoPE, head_dim from key_length) with a mixture-of-experts FFN in every
layer: the router ffn_gate_inp [e, d], softmax, the top expert_used_count experts, their
weights renormalized to sum 1 (build_moe_ffn's norm_w), each expert a SwiGLU of width
expert_feed_forward_length (else feed_forward_length / expert_used_count). No shared expert.
On the GPU through minfer.cuda.load.moe (the routed experts' grouped GEMMs)."""

from __future__ import annotations

from minfer.families.moe import EXPERT_KEYS, INERT_EXPERT_KEYS, expert_hparams, expert_metadata
from minfer.families.schema import Family, layer_schema


class Qwen3Moe(Family):
    def hparams(self, r, a, dims):
        return (
            super().hparams(r, a, dims)
            | {"qk_norm": True}
            | expert_hparams(r, a, required=True, own_width=True)
        )

    def layer(self, a, bias):
        return layer_schema(bias=bias, qk_norm="head")

    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        out = super().synth_metadata(shape, common, kv, rope, u32, f32)
        return out | expert_metadata(shape, u32)


FAMILY = Qwen3Moe(
    "qwen3moe",
    ("qwen3moe",),
    rope_neox=True,
    keys={"qwen3moe": EXPERT_KEYS + ("{a}.expert_feed_forward_length",)},
    inert_keys={"qwen3moe": INERT_EXPERT_KEYS},
    gpu=True,
)
