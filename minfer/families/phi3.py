"""phi3 (src/models/phi3.cpp): llama's graph on fused weights. The file holds attn_qkv
[(H + 2 Hkv) D, d] and ffn_up [2 ff, d] (the gate half first, LLM_FFN_SEQ), which the loader
reads as row views of the llama set (no copy); NEOX RoPE; the long-context RoPE factors
(rope_factors_long / _short.weight, GGUFModel._longrope); attention.sliding_window read and
disabled, as llama.cpp disables SWA for phi3 (ggml-org/llama.cpp#13676)."""

from __future__ import annotations

from minfer.families.schema import Family, FusedSpec, layer_schema

FUSED = (
    FusedSpec("attn_qkv.weight", ("attn_q", "attn_k", "attn_v")),
    FusedSpec("ffn_up.weight", ("ffn_gate", "ffn_up")),
)


class Phi3(Family):
    def layer(self, a, bias):
        return layer_schema(bias=bias, fused=FUSED)


FAMILY = Phi3(
    "phi3",
    ("phi3",),
    rope_neox=True,
    inert_keys={"phi3": ("{a}.attention.sliding_window",)},
    extra_tensors={
        "phi3": {
            "rope_factors_long.weight": "the long-context RoPE factors (Phi-3 128k, 3.5)",
            "rope_factors_short.weight": "the short-context RoPE factors (Phi-3 128k, 3.5)",
        }
    },
)
