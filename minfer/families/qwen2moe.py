"""qwen2moe (src/models/qwen2moe.cpp): Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B. qwen2's attention (q/k/v
biases, NEOX RoPE) with a mixture-of-experts FFN in every layer: the router ffn_gate_inp [e, d],
softmax, the top expert_used_count experts with their raw softmax probs as weights (build_moe_ffn
is called with norm_w false: no renormalization), each expert a SwiGLU of width
expert_feed_forward_length (else feed_forward_length / expert_used_count); plus a shared expert
every token runs: a dense SwiGLU ffn_{gate,up,down}_shexp of width
expert_shared_feed_forward_length (else feed_forward_length), times sigmoid(h . g) with g the
one-row ffn_gate_inp_shexp [d] (llama.cpp writes the sigmoid as silu(x) / x), added to the
routed experts' sum. output.weight is required (llama.cpp's loader has no tied fallback here).
Other keys: expert_weights_scale / _norm / gating_func are inert (llama.cpp's qwen2moe reads
none of them; its graph asks for softmax, no norm, hparams' scale 0)."""

from __future__ import annotations

from minfer.errors import BadModel
from minfer.families.moe import EXPERT_KEYS, INERT_EXPERT_KEYS, expert_hparams, expert_metadata
from minfer.families.schema import Family

SHARED_KEY = "{a}.expert_shared_feed_forward_length"


class Qwen2Moe(Family):
    def hparams(self, r, a, dims):
        if "output.weight" not in r.tensors:
            raise BadModel(
                f"{r.path}: tensor 'output.weight' missing (llama.cpp's qwen2moe loader "
                "requires it: no tied embeddings)"
            )
        moe = expert_hparams(r, a, required=True, own_width=True) | {"moe_norm_w": False}
        shared = r.int_key(SHARED_KEY.format(a=a), 0, lo=0) or r.int_key(f"{a}.feed_forward_length")
        return super().hparams(r, a, dims) | moe | {"d_ff_shexp": shared}

    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        out = super().synth_metadata(shape, common, kv, rope, u32, f32)
        shared = {SHARED_KEY.format(a=shape.arch): u32(shape.d_ff_shexp)}
        return out | expert_metadata(shape, u32) | shared


FAMILY = Qwen2Moe(
    "qwen2moe",
    ("qwen2moe",),
    rope_neox=True,
    keys={"qwen2moe": EXPERT_KEYS + ("{a}.expert_feed_forward_length", SHARED_KEY)},
    inert_keys={"qwen2moe": INERT_EXPERT_KEYS},
    gpu=True,  # minfer.cuda.load.moe: the routed experts and the shared expert
)
