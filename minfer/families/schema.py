"""A family's layer schema: the tensors of one layer (file order), their shapes, their roles,
and which of them a GPU GEMM may fuse; plus the Family record each family module fills.

Shapes are symbolic (numpy order [rows, cols]) over the config's dimensions, so the loader's
shape check, the synthetic writer and the GPU upload read one list:
  d = d_model, ff = d_ff, q = n_heads * head_dim, kv = n_kv_heads * head_dim, hd = head_dim,
  e = n_expert, fe = an expert's feed-forward width (mixture-of-experts layers; 0: ff),
  fs = the shared expert's width (qwen2moe's expert_shared_feed_forward_length).
Roles: "linear" (a GEMM weight [N, K]), "norm" (an f32 vector), "bias" (an f32 vector),
"router" (ffn_gate_inp [e, d]), "experts" (a stacked expert weight [e, N, K]: GGUF's 3-D
ffn_{gate,up,down}_exps, ne = [K, N, e]), "shexp_gate" (qwen2moe's ffn_gate_inp_shexp [d]:
the shared expert's one-row sigmoid gate), "shexp" (its dense SwiGLU weights [N, K]: held and
run with the experts by minfer.cuda.load.moe, so not among the "linear" weights the routes plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# which metadata keys fix each symbolic dimension (named when a tensor disagrees); {a}: arch
DIM_KEYS = {
    "d": "{a}.embedding_length",
    "ff": "{a}.feed_forward_length",
    "q": "{a}.attention.head_count x head_dim",
    "kv": "{a}.attention.head_count_kv x head_dim",
    "hd": "{a}.attention.key_length",
    "e": "{a}.expert_count",
    "fe": "{a}.expert_feed_forward_length (or feed_forward_length)",
    "fs": "{a}.expert_shared_feed_forward_length (or feed_forward_length)",
}


def dim(cfg, sym: str) -> int:
    """The size of symbolic dimension sym for a config (ModelConfig or synth's SynthShape: both
    carry d_model, d_ff, n_heads, n_kv_heads and head_dim / hd)."""
    hd = getattr(cfg, "head_dim", None) or cfg.hd
    sizes = {
        "d": cfg.d_model,
        "ff": cfg.d_ff,
        "q": cfg.n_heads * hd,
        "kv": cfg.n_kv_heads * hd,
        "hd": hd,
        "e": getattr(cfg, "n_expert", 0),
        "fe": getattr(cfg, "d_ff_exp", 0) or cfg.d_ff,
        "fs": getattr(cfg, "d_ff_shexp", 0) or cfg.d_ff,
    }
    return sum(sizes[s] for s in sym.split("+"))  # "q+kv+kv": a fused tensor's rows


@dataclass(frozen=True)
class TensorSpec:
    name: str  # within the layer: "attn_q.weight" (blk.{i}. in front)
    shape: tuple[str, ...]  # symbolic, numpy order
    role: str  # "linear", "norm" or "bias"

    def full(self, il: int) -> str:
        return f"blk.{il}.{self.name}"


@dataclass(frozen=True)
class FusedSpec:
    """A tensor the file holds fused, which the loader splits into row views of the schema's
    members (phi3: attn_qkv, the 2-ff ffn_up), in the members' order."""

    name: str  # in the file: "attn_qkv.weight"
    members: tuple[str, ...]  # schema names, row ranges one after another


@dataclass(frozen=True)
class LayerSchema:
    tensors: tuple[TensorSpec, ...]  # the graph's tensors of one layer, in file order
    file_fused: tuple[FusedSpec, ...] = ()
    # GEMMs a GPU may run as one (same K): group name -> members (minfer.cuda.plan.fusion)
    gemm_groups: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("attn_qkv", ("attn_q", "attn_k", "attn_v")),
        ("attn_qk", ("attn_q", "attn_k")),
        ("ffn_gate_up", ("ffn_gate", "ffn_up")),
    )

    def names(self, il: int, role: str | None = None) -> list[str]:
        return [t.full(il) for t in self.tensors if role is None or t.role == role]

    def has(self, name: str) -> bool:
        """name: layer-relative ("post_ffw_norm.weight")."""
        return any(t.name == name for t in self.tensors)

    def shape(self, spec: TensorSpec, cfg) -> tuple[int, ...]:
        return tuple(dim(cfg, s) for s in spec.shape)

    def with_experts(self, shared: bool = False) -> LayerSchema:
        """The layer with a mixture-of-experts FFN (llama.cpp's build_moe_ffn): the dense
        ffn_gate / ffn_up / ffn_down replaced, in place, by the router and the stacked experts
        (the tensors llama.cpp's llama and qwen3moe loaders create). shared: qwen2moe's
        sigmoid-gated shared expert after them (its gate vector, then a dense SwiGLU of width
        fs), in gguf-py's MODEL_TENSORS order for QWEN2MOE."""
        dense = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
        out = []
        for t in self.tensors:
            if t.name == dense[0]:
                out += [
                    _t("ffn_gate_inp.weight", ["e", "d"], "router"),
                    _t("ffn_gate_exps.weight", ["e", "fe", "d"], "experts"),
                    _t("ffn_up_exps.weight", ["e", "fe", "d"], "experts"),
                    _t("ffn_down_exps.weight", ["e", "d", "fe"], "experts"),
                ]
                if shared:
                    out += [
                        _t("ffn_gate_inp_shexp.weight", ["d"], "shexp_gate"),
                        _t("ffn_gate_shexp.weight", ["fs", "d"], "shexp"),
                        _t("ffn_down_shexp.weight", ["d", "fs"], "shexp"),
                        _t("ffn_up_shexp.weight", ["fs", "d"], "shexp"),
                    ]
            elif t.name not in dense:
                out.append(t)
        groups = tuple(g for g in self.gemm_groups if g[0] != "ffn_gate_up")
        return LayerSchema(tuple(out), self.file_fused, groups)

    def file_tensors(self) -> tuple[TensorSpec, ...]:
        """The layer as the file holds it: fused tensors in place of their first member (rows
        summed), the other members gone (synth writes this)."""
        out, skip = [], set()
        for t in self.tensors:
            if t.name in skip:
                continue
            f = next((f for f in self.file_fused if f.members[0] == t.name.split(".")[0]), None)
            if f is None:
                out.append(t)
                continue
            members = [m for m in self.tensors if m.name.split(".")[0] in f.members]
            skip |= {m.name for m in members}
            rows = "+".join(m.shape[0] for m in members)
            out.append(TensorSpec(f.name, (rows, t.shape[1]), t.role))
        return tuple(out)


def _t(name, shape, role="linear"):
    return TensorSpec(name, tuple(shape), role)


def layer_schema(
    *,
    bias: bool = False,
    qk_norm: str = "",
    post_norms: bool = False,
    pre_norms: bool = True,
    fused: tuple[FusedSpec, ...] = (),
) -> LayerSchema:
    """The llama layer and its variations, in the order llama.cpp's converters write them:
    attn_norm, q, k, v, q/k norms, q/k/v biases, attn_output, post_attention_norm, ffn_norm,
    gate, up, down, post_ffw_norm. qk_norm: "" none, "head" per head [hd] (qwen3, gemma3),
    "full" over the whole projection [q] / [kv] (olmo2)."""
    ts = [_t("attn_norm.weight", ["d"], "norm")] if pre_norms else []
    ts += [
        _t("attn_q.weight", ["q", "d"]),
        _t("attn_k.weight", ["kv", "d"]),
        _t("attn_v.weight", ["kv", "d"]),
    ]
    if qk_norm:
        q, k = (("hd",), ("hd",)) if qk_norm == "head" else (("q",), ("kv",))
        ts += [_t("attn_q_norm.weight", q, "norm"), _t("attn_k_norm.weight", k, "norm")]
    if bias:
        ts += [
            _t("attn_q.bias", ["q"], "bias"),
            _t("attn_k.bias", ["kv"], "bias"),
            _t("attn_v.bias", ["kv"], "bias"),
        ]
    ts.append(_t("attn_output.weight", ["d", "q"]))
    if post_norms:
        ts.append(_t("post_attention_norm.weight", ["d"], "norm"))
    if pre_norms:
        ts.append(_t("ffn_norm.weight", ["d"], "norm"))
    ts += [
        _t("ffn_gate.weight", ["ff", "d"]),
        _t("ffn_up.weight", ["ff", "d"]),
        _t("ffn_down.weight", ["d", "ff"]),
    ]
    if post_norms:
        ts.append(_t("post_ffw_norm.weight", ["d"], "norm"))
    return LayerSchema(tuple(ts), fused)


@dataclass(frozen=True)
class Family:
    """One model family: its GGUF architecture names and everything minfer knows of them.

    keys: per arch, the namespaced keys its reader reads beyond the common llama set
    (arch_keys.USED); inert_keys: keys llama.cpp reads and then ignores for it; extra_tensors:
    non-layer tensors it may carry (name -> what); gpu: the CUDA backend runs it."""

    name: str
    archs: tuple[str, ...]
    rope_neox: bool = False
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    inert_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    extra_tensors: dict[str, dict[str, str]] = field(default_factory=dict)
    gpu: bool = True

    def hparams(self, r, a: str, dims: dict[str, Any]) -> dict[str, Any]:
        """The ModelConfig fields this family sets beyond the common ones, read from the file
        through r (the loader's reader: r.int_key, r.float_key, r.metadata, r.tensors, r.path);
        dims: n_layers, d_model, n_heads, head_dim, rope_dim."""
        return {"rope_neox": self.rope_neox}

    def layer(self, a: str, bias: bool) -> LayerSchema:
        """The layer schema of arch a (bias: the file has q/k/v biases)."""
        return layer_schema(bias=bias)

    def synth_metadata(self, shape, common: dict, kv: dict, rope: dict, u32, f32) -> dict:
        """The hyperparameter keys convert_hf_to_gguf.py writes for this family (synth):
        common (block_count .. layer_norm_rms_epsilon, rope.freq_base), kv (key/value length),
        rope (the scaling keys); LlamaModel's: rope.dimension_count and vocab_size too."""
        a = shape.arch
        window = (
            {f"{a}.attention.sliding_window": u32(shape.sliding_window)}
            if shape.sliding_window
            else {}
        )
        return (
            common
            | {f"{a}.rope.dimension_count": u32(shape.hd), f"{a}.vocab_size": u32(shape.vocab)}
            | rope
            | (kv if shape.head_dim else {})
            | window
        )
