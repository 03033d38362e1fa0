"""qwen2 (src/models/qwen2.cpp): llama with q/k/v biases and NEOX RoPE; qwen3 (qwen3.cpp): no
biases, a per-head RMSNorm of q and k before RoPE (attn_q_norm / attn_k_norm [head_dim]), the
head size from key_length."""

from __future__ import annotations

from minfer.families.schema import Family, layer_schema


class Qwen(Family):
    def hparams(self, r, a, dims):
        return super().hparams(r, a, dims) | {"qk_norm": a == "qwen3"}

    def layer(self, a, bias):
        return layer_schema(bias=bias, qk_norm="head" if a == "qwen3" else "")


FAMILY = Qwen("qwen", ("qwen2", "qwen3"), rope_neox=True)
