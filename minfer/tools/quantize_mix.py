"""llama.cpp's tensor type mix (llama-quant.cpp: llama_tensor_get_type) for minfer's file types.

Given a file type (q4_K_M, q6_K, ...) and a model's tensors, decide each tensor's type exactly as
`llama_model_quantize` does without an imatrix and without overrides:
  * tensors that are not 2-D+ `*weight`, or are norms, keep their type (copied as they are);
  * the output head (and token_embd when the embedding is tied) gets q6_K, or q8_0 where its row
    length is not a multiple of the k-quant block (256);
  * attn_v and ffn_down get more bits in some layers (q4_K_M / q5_K_M: `use_more_bits`; q4_K_S:
    q5_K in the first layers);
  * a k-quant whose block does not divide the row length falls back: q4_K -> q5_0,
    q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K -> q4_0, then f16 if even that does not fit.
Counters run over the tensors in llama.cpp's order (`llama_order`), as its loop does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minfer.errors import Unsupported

GGML_QNT_VERSION = 2

# file type name -> (llama_ftype value written to general.file_type, default tensor type)
FTYPES: dict[str, tuple[int, str]] = {
    "f32": (0, "F32"),
    "f16": (1, "F16"),
    "q4_0": (2, "Q4_0"),
    "q4_1": (3, "Q4_1"),
    "q8_0": (7, "Q8_0"),
    "q5_0": (8, "Q5_0"),
    "q5_1": (9, "Q5_1"),
    "q4_K_S": (14, "Q4_K"),
    "q4_K_M": (15, "Q4_K"),
    "q5_K_S": (16, "Q5_K"),
    "q5_K_M": (17, "Q5_K"),
    "q6_K": (18, "Q6_K"),
}
_QUANTIZED = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
_BLOCK = {
    "F32": 1,
    "F16": 1,
    "BF16": 1,
    "Q4_0": 32,
    "Q4_1": 32,
    "Q5_0": 32,
    "Q5_1": 32,
    "Q8_0": 32,
    "Q2_K": 256,
    "Q3_K": 256,
    "Q4_K": 256,
    "Q5_K": 256,
    "Q6_K": 256,
}
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def ftype_key(name: str) -> str:
    """Canonical file type name for a user's spelling (case-insensitive): 'Q4_K_M' -> 'q4_K_M'."""
    for k in FTYPES:
        if k.lower() == name.lower():
            return k
    raise Unsupported(f"unknown quantization type {name!r} (known: {', '.join(FTYPES)})")


@dataclass(frozen=True)
class MixModel:
    """What llama_tensor_get_type reads from the model besides tensor names and shapes."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def is_70b(self) -> bool:  # llama.cpp's LLM_TYPE_70B: llama, 80 layers, GQA
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv


@dataclass(frozen=True)
class TensorDesc:
    name: str
    shape: tuple[int, ...]  # numpy order: [rows, cols]; cols (ne[0]) is the row length
    type: str  # current ggml type name


_LAYER = re.compile(r"^blk\.(\d+)\.")


def llama_order(names):
    """llama.cpp's weights_map order: by layer number (non-layer tensors first), then by name."""

    def key(n):
        m = _LAYER.match(n)
        return (int(m.group(1)) if m else -1, n)

    return sorted(names, key=key)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for frag, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if frag in name:
            return cat
    return "other"


def _allows_quantization(t: TensorDesc) -> bool:
    n = t.name
    if len(t.shape) < 2 or not n.endswith("weight"):
        return False
    return not any(
        s in n
        for s in (
            "_norm.weight",
            "ffn_gate_inp.weight",
            "position_embd",
            "token_types",
            "ssm_conv1d",
            "attn_rel_b.weight",
        )
    )


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def plan_types(tensors: list[TensorDesc], ftype: str, model: MixModel) -> dict[str, str]:
    """Target ggml type name per tensor, as llama_model_quantize picks it (no imatrix)."""
    ftype = ftype_key(ftype)
    default = FTYPES[ftype][1]
    by_name = {t.name: t for t in tensors}
    order = llama_order(by_name)
    cats = {n: _category(n) for n in order}
    tied = "output" not in cats.values()
    n_attn_v = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats.values())
    i_attn_v = i_ffn_down = 0
    out: dict[str, str] = {}
    for name in order:
        t = by_name[name]
        cat = cats[name]
        if not _allows_quantization(t):
            out[name] = t.type
            continue
        new = default
        if default not in _QUANTIZED:  # f16 / f32 files: every quantizable tensor, no rules
            out[name] = new
            continue
        ncols = t.shape[-1]
        if cat == "output" or (tied and cat == "token_embd"):
            if model.arch == "falcon" or ncols % _BLOCK[new]:
                new = "Q8_0"
            elif new != "Q8_0":
                new = "Q6_K"
        elif cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            if ftype in ("q4_K_M", "q5_K_M") and use_more_bits(i_attn_v, n_attn_v):
                new = "Q6_K"
            elif ftype == "q4_K_S" and i_attn_v < 4:
                new = "Q5_K"
            if model.is_70b and new in ("Q3_K", "Q4_K"):
                new = "Q5_K"
            if model.n_expert == 8:  # llama.cpp: "for the 8-expert model, bumping this to Q8_0"
                new = "Q8_0"
            i_attn_v += 1  # (llama.cpp's own attn_qkv rule is unreachable: qkv is attn_v-like)
        elif cat == "attn_k" and model.n_expert == 8:  # Mixtral: attn_k to Q8_0 as well
            new = "Q8_0"
        elif (
            cat == "attn_output"
            and model.n_expert == 8
            and ftype in ("q2_K", "q3_K_S", "q3_K_M", "q4_K_S", "q4_K_M")
        ):
            new = "Q5_K"
        elif cat == "ffn_down":
            # experts: the layer parsed from the name (llama.cpp's layer_info), as the counter
            i_layer, n_layer = i_ffn_down, model.n_layer
            m = _LAYER.match(name) if model.n_expert > 1 else None
            i_layer = int(m.group(1)) if m else i_layer
            if ftype == "q4_K_M":
                if model.arch == "falcon":
                    new = (
                        "Q6_K"
                        if i_layer < n_layer // 16
                        else "Q5_K"
                        if use_more_bits(i_layer, n_layer)
                        else "Q4_K"
                    )
                elif use_more_bits(i_layer, n_layer):
                    new = "Q6_K"
            elif ftype == "q5_K_M" and use_more_bits(i_layer, n_layer):
                new = "Q6_K"
            elif ftype == "q4_K_S" and model.arch != "falcon" and i_layer < n_layer // 8:
                new = "Q5_K"
            i_ffn_down += 1
        # incompatible row length: fall back (llama.cpp's tensor_type_fallback)
        if ncols % _BLOCK[new]:
            if new not in _FALLBACK:
                raise Unsupported(
                    f"quantize: {name}: row length {ncols} is not a multiple of "
                    f"{_BLOCK[new]} (needed by {new}) and {new} has no fallback"
                )
            new = _FALLBACK[new]
            if ncols % _BLOCK[new]:
                new = "F16"
        out[name] = new
    return out


def describe(types: dict[str, str]) -> str:
    """A compact table: tensor kind -> types per layer (for reports and tests)."""
    kinds: dict[str, dict[int, str]] = {}
    lines = []
    for name, ty in types.items():
        m = _LAYER.match(name)
        if m:
            kind = name[m.end() :]
            kinds.setdefault(kind, {})[int(m.group(1))] = ty
        else:
            lines.append(f"{name:28s} {ty}")
    for kind, per in kinds.items():
        distinct = sorted(set(per.values()))
        if len(distinct) == 1:
            lines.append(f"{kind:28s} {distinct[0]} (all {len(per)})")
        else:
            parts = " ".join(f"{i}:{per[i]}" for i in sorted(per))
            lines.append(f"{kind:28s} {parts}")
    return "\n".join(lines)
