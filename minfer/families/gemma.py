"""gemma3 (src/models/gemma3.cpp) and gemma2 (gemma2.cpp): embeddings times sqrt(d_model),
post-attention and post-FFN norms, GeGLU, q pre-scaled, sliding-window layers with their own
RoPE base, final logit soft-cap; gemma3 adds per-head q/k norms, gemma2 attention soft-capping
and every other layer local (docs/families.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer.errors import BadInput, BadModel
from minfer.families.schema import Family, layer_schema


def _show(v: Any) -> str:
    from minfer.errors import show

    return show(v, 60)


class Gemma(Family):
    def hparams(self, r, a: str, dims: dict[str, Any]) -> dict[str, Any]:
        """The gemma ModelConfig fields, read as llama.cpp's load_arch_hparams does:
        llama_model_gemma3's for gemma3, llama_model_gemma2's for gemma2."""
        f32 = np.float32
        g2 = a == "gemma2"
        n_layers, d_model, n_heads, head_dim = (
            dims[k] for k in ("n_layers", "d_model", "n_heads", "head_dim")
        )
        # gemma_pytorch: query_pre_attn_scalar; llama.cpp by model type: the 27B (gemma3: 62
        # layers, gemma2: 46) 1/sqrt(n_embd / n_head) (integer division), else 1/sqrt(head_dim),
        # in float
        big = n_layers == (46 if g2 else 62)
        out: dict[str, Any] = super().hparams(r, a, dims) | {
            "qk_norm": not g2,
            "embed_scale": float(np.sqrt(f32(d_model))),  # sqrtf(n_embd)
            "ffn_gelu": True,
            "post_norms": True,
            "attn_scale": float(f32(1.0) / np.sqrt(f32(d_model // n_heads if big else head_dim))),
        }
        kw = f"{a}.attention.sliding_window"
        if g2:  # always LLAMA_SWA_TYPE_STANDARD, n_swa 4096 unless the file says (0 would mask
            # every key of a local layer: refused)
            n_swa = r.int_key(kw, 4096, lo=1)
        else:  # the window only with a key > 0 (else LLAMA_SWA_TYPE_NONE)
            n_swa = r.int_key(kw, lo=0) if kw in r.metadata else 0
        if n_swa > 0:  # load_swa_pattern(ml, 6 / 2), dense_first false
            kp = f"{a}.attention.sliding_window_pattern"
            n_pat = 2 if g2 else 6
            pat = r.metadata.get(kp, n_pat)
            if isinstance(pat, list):  # per-layer flags (bool or integer; missing: global)
                if not all(isinstance(x, int) for x in pat) or len(pat) > 512:
                    raise BadModel(
                        f"{r.path}: metadata key {kp!r} = {_show(pat)} must be "
                        "an integer or an array of at most 512 bools/integers"
                    )
                flags = tuple(bool(pat[i]) if i < len(pat) else False for i in range(n_layers))
            else:
                n = r.int_key(kp, lo=0) if kp in r.metadata else n_pat
                flags = tuple(n == 0 or i % n < n - 1 for i in range(n_layers))
            # gemma3: the local base defaults to 10000, the local freq scale is 1; gemma2: both
            # default to the global ones (rope_freq_base_train_swa = rope_freq_base_train)
            base_swa = r.float_key(f"{a}.rope.freq_base", 10000.0) if g2 else 10000.0
            out |= {
                "sliding_window": n_swa,
                "swa_layers": flags,
                "swa_rope_scaled": g2,
                "rope_base_swa": r.float_key(f"{a}.rope.freq_base_swa", base_swa),
            }
        kc = f"{a}.final_logit_softcapping"
        if g2:  # both caps always on (llama_hparams' defaults 30 and 50 when absent); 0 would
            # divide by zero in llama.cpp's graph: refused by float_key
            out["logit_softcap"] = float(f32(r.float_key(kc, 30.0)))
            out["attn_softcap"] = float(f32(r.float_key(f"{a}.attn_logit_softcapping", 50.0)))
            return out
        cap = r.metadata.get(kc, 0.0)
        if cap != 0.0:  # 0 (or absent): no soft-cap, as llama.cpp's `if (f_final_...)`
            cap = r.float_key(kc, 0.0)
        out["logit_softcap"] = float(f32(cap))
        return out

    def layer(self, a, bias):
        return layer_schema(bias=bias, qk_norm="" if a == "gemma2" else "head", post_norms=True)

    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        a = shape.arch
        if a == "gemma3":
            # convert_hf_to_gguf.py's Gemma3Model: key/value length always, the window; no
            # rope.dimension_count nor vocab_size (llama.cpp takes head_dim and the table's
            # rows). Norm weights are stored as HF's (1 + w) already: the generator's ~1 fit.
            if shape.sliding_window:
                kv = kv | {f"{a}.attention.sliding_window": u32(shape.sliding_window)}
            return common | kv | rope
        # convert_hf_to_gguf.py's Gemma2Model: no rope.freq_base (llama.cpp's 10000), nor
        # rope.dimension_count, nor vocab_size; key/value length, both soft caps, the window
        common = dict(common)
        del common[f"{a}.rope.freq_base"]
        if shape.rope_base != 10000.0:
            raise BadInput(
                f"gemma2: the converter writes no rope.freq_base, so the RoPE base "
                f"is 10000, not {shape.rope_base:g}"
            )
        return (
            common
            | kv
            | rope
            | {
                f"{a}.attn_logit_softcapping": f32(shape.attn_softcap),
                f"{a}.final_logit_softcapping": f32(shape.final_softcap),
                f"{a}.attention.sliding_window": u32(shape.sliding_window),
            }
        )


_SWA = (
    "{a}.attention.sliding_window",
    "{a}.attention.sliding_window_pattern",
    "{a}.rope.freq_base_swa",
)
FAMILY = Gemma(
    "gemma",
    ("gemma2", "gemma3"),
    rope_neox=True,
    keys={
        "gemma2": _SWA + ("{a}.attn_logit_softcapping", "{a}.final_logit_softcapping"),
        "gemma3": _SWA + ("{a}.final_logit_softcapping",),
    },
)
