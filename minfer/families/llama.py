"""llama (llama.cpp src/models/llama.cpp): the base graph. RoPE factors (rope_freqs.weight) and
linear / YaRN scaling are read for every family by the loader (RopeScaling); what llama adds is
Mistral 7B v0.1's attention.sliding_window on every layer (docs/families.md), and Mixtral's
experts: with expert_count > 0 every layer's FFN is build_moe_ffn over ffn_{gate,up,down}_exps
of width feed_forward_length (minfer.families.moe)."""

from __future__ import annotations

from typing import Any

from minfer.errors import Unsupported
from minfer.families.moe import EXPERT_KEYS, INERT_EXPERT_KEYS, expert_hparams, expert_metadata
from minfer.families.schema import Family


def rope_plain(r, a: str) -> bool:
    """No RoPE scaling key and no frequency factors in the file."""
    return "rope_freqs.weight" not in r.tensors and not any(
        k.startswith(f"{a}.rope.scaling.") and k != f"{a}.rope.scaling.finetuned"
        for k in r.metadata
    )


class Llama(Family):
    def synth_metadata(self, shape, common, kv, rope, u32, f32):
        out = super().synth_metadata(shape, common, kv, rope, u32, f32)
        if not getattr(shape, "n_expert", 0):
            return out
        return out | expert_metadata(shape, u32, width=False)  # Mixtral: the two counts

    def hparams(self, r, a: str, dims: dict[str, Any]) -> dict[str, Any]:
        """A llama file's attention.sliding_window (Mistral 7B v0.1: 4096): every layer local,
        on the model's own RoPE, as HF's MistralAttention applies it. llama.cpp's llama graph
        ignores the key (full attention): the two agree up to the window's width, past it
        minfer follows the model (docs/families.md)."""
        out = super().hparams(r, a, dims) | expert_hparams(r, a, required=False, own_width=False)
        kw = f"{a}.attention.sliding_window"
        if kw not in r.metadata:
            return out
        n_swa = r.int_key(kw, lo=0)
        if n_swa == 0:
            return out
        if not rope_plain(r, a):
            raise Unsupported(
                f"{r.path}: metadata key {kw!r} = {n_swa} with RoPE scaling: "
                "a sliding window over scaled RoPE is not implemented"
            )
        return out | {
            "sliding_window": n_swa,
            "swa_layers": (True,) * dims["n_layers"],
            "rope_base_swa": r.float_key(f"{a}.rope.freq_base", 10000.0),
        }


FAMILY = Llama(
    "llama",
    ("llama",),
    keys={"llama": ("{a}.attention.sliding_window",) + EXPERT_KEYS},  # Mistral, Mixtral
    inert_keys={"llama": INERT_EXPERT_KEYS},
    extra_tensors={"llama": {"rope_freqs.weight": "the llama3 RoPE frequency factors"}},
)
