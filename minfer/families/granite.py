"""granite (src/models/granite.cpp, llama_model_granite::load_arch_hparams): IBM Granite 3.x,
llama's graph with four scalars (HF's *_multiplier, written by convert_hf_to_gguf.py's
GraniteModel as *_scale, each only when non-zero):
- embedding_scale: the gathered embeddings times it (build_inp_embd, when != 0);
- attention.scale: the softmax scale of q.k (kq_scale; 0 or absent: 1/sqrt(head_dim));
- residual_scale: the attention and the FFN outputs times it before their residual adds;
- logit_scale (required): the logits times 1/logit_scale (ggml_scale(cur, 1.0f / s)).
rope.scaling.finetuned (default true) switches RoPE: false runs every layer without it
(hparams.rope_pattern). Tensors: llama's, tied or not; the optional attn_output / FFN biases of
llama_model_granite are refused (no Granite 3.x file has them)."""

from __future__ import annotations

import numpy as np

from minfer.errors import BadModel
from minfer.families.schema import Family


def _opt(r, key: str) -> float:
    """An optional scale: 0 or absent means none (llama.cpp's `if (hparams.f_...)`)."""
    v = r.metadata.get(key, 0.0)
    return 0.0 if v == 0.0 and not isinstance(v, bool) else r.float_key(key, 0.0)


class Granite(Family):
    def hparams(self, r, a, dims):
        f32 = np.float32
        out = super().hparams(r, a, dims)
        emb, kq, res = (
            _opt(r, f"{a}.{k}") for k in ("embedding_scale", "attention.scale", "residual_scale")
        )
        logit = r.float_key(f"{a}.logit_scale", None)  # required, as llama.cpp's get_key
        out |= {"logit_mul": float(f32(1.0) / f32(logit))}
        if emb:
            out["embed_scale"] = float(f32(emb))
        if kq:
            out["kq_scale"] = float(f32(kq))
        if res:
            out["residual_scale"] = float(f32(res))
        kf = f"{a}.rope.scaling.finetuned"
        ft = r.metadata.get(kf, True)
        if not isinstance(ft, bool):
            raise BadModel(f"{r.path}: metadata key {kf!r} = {ft!r} must be a bool")
        if not ft:  # Granite's switch for RoPE: no rotation on any layer
            out["rope_layers"] = (False,) * dims["n_layers"]
        return out

    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        a = shape.arch
        return super().synth_metadata(shape, common, kv, rope, u32, f32) | {
            f"{a}.attention.scale": f32(shape.kq_scale),
            f"{a}.embedding_scale": f32(shape.embed_scale),
            f"{a}.residual_scale": f32(shape.residual_scale),
            f"{a}.logit_scale": f32(shape.logit_scale),
        }


_KEYS = (
    "{a}.embedding_scale",
    "{a}.attention.scale",
    "{a}.residual_scale",
    "{a}.logit_scale",
    "{a}.rope.scaling.finetuned",
)
FAMILY = Granite(
    "granite",
    ("granite",),
    keys={"granite": _KEYS},
    extra_tensors={"granite": {"rope_freqs.weight": "the llama3 RoPE frequency factors"}},
)
