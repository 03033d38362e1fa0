"""olmo2 (src/models/olmo2.cpp, llama_model_olmo2): OLMo 2, a post-norm llama. No norm before
attention or the FFN: q, k, v and gate|up read the residual itself; q and k are RMS-normalized
over the whole projection (attn_q_norm [H D], attn_k_norm [Hkv D], before the per-head
reshape) and then NEOX-roped; the attention output and the FFN output are RMS-normalized
(post_attention_norm, post_ffw_norm) before their residual adds; an untied LM head. OLMo 3's
sliding-window layers (attention.sliding_window) are refused (not implemented)."""

from __future__ import annotations

from minfer.families.schema import Family, layer_schema


class Olmo2(Family):
    def hparams(self, r, a, dims):
        return super().hparams(r, a, dims) | {
            "pre_norms": False,
            "qk_norm": True,
            "qk_norm_full": True,
            "post_norms": True,
        }

    def layer(self, a, bias):
        return layer_schema(bias=bias, qk_norm="full", post_norms=True, pre_norms=False)

    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        # convert_hf_to_gguf.py's Olmo2Model (a TextModel): no rope.dimension_count, no
        # vocab_size; key/value length only where the config has head_dim
        return common | (kv if shape.head_dim else {}) | rope


FAMILY = Olmo2("olmo2", ("olmo2",), rope_neox=True)
