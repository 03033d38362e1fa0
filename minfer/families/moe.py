"""Mixture-of-experts hyperparameters, as llama.cpp reads them (llama_model::load_hparams reads
expert_count / expert_used_count for every arch; each arch's loader its expert width) and the
routing each family's graph asks build_moe_ffn for (ModelConfig.moe_*).

Routing (src/llama-graph.cpp build_moe_ffn), per token: router logits = h @ ffn_gate_inp.T
[e]; probs = softmax(logits) ("softmax" gating); the k = expert_used_count largest probs
(ggml_argsort_top_k); their weights = those probs, divided by their sum (clamped to 6.1e-5)
when norm_w, times w_scale when it is neither 0 nor 1; the FFN output = sum over the k slots, in
rank order, of weight * down(silu(gate(h)) * up(h)) of that expert. Mixtral (llama + experts)
and qwen3moe call it with softmax, norm_w true and hparams.expert_weights_scale, which neither
loader reads (it stays 0: no scale); so expert_weights_scale / _norm / gating_func are inert
for them (llama.cpp ignores them), as arch_keys lists."""

from __future__ import annotations

from typing import Any

from minfer.errors import BadModel

MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS

# the keys a MoE family reads, and those llama.cpp's graph for it never reads
EXPERT_KEYS = ("{a}.expert_count", "{a}.expert_used_count")
INERT_EXPERT_KEYS = (
    "{a}.expert_weights_scale",
    "{a}.expert_weights_norm",
    "{a}.expert_gating_func",
)


def expert_hparams(r, a: str, required: bool, own_width: bool) -> dict[str, Any]:
    """{n_expert, n_expert_used, d_ff_exp} of a file ({} for a dense one). required: the arch
    has no dense form (qwen3moe). own_width: the expert width is expert_feed_forward_length,
    else feed_forward_length / expert_used_count (qwen3moe); otherwise feed_forward_length
    itself (llama: Mixtral's experts are n_ff wide)."""
    ke, ku = f"{a}.expert_count", f"{a}.expert_used_count"
    n = r.int_key(ke, 0, lo=0, hi=MAX_EXPERTS)
    used = r.int_key(ku, 0, lo=0, hi=max(n, 0))
    if n == 0:
        if required:
            raise BadModel(
                f"{r.path}: metadata key {ke!r} missing or 0 ({a} is a "
                "mixture-of-experts architecture: llama.cpp requires n_expert > 0)"
            )
        if used:
            raise BadModel(f"{r.path}: metadata key {ku!r} = {used} without {ke!r}")
        return {}
    if used == 0:
        raise BadModel(
            f"{r.path}: metadata key {ku!r} missing or 0 with {ke!r} = {n} "
            "(llama.cpp requires n_expert_used > 0)"
        )
    ff = r.int_key(f"{a}.feed_forward_length")
    width = ff
    if own_width:
        width = r.int_key(f"{a}.expert_feed_forward_length", 0, lo=0) or ff // used
    return {
        "n_expert": n,
        "n_expert_used": used,
        "d_ff_exp": width,
        "moe_gating": "softmax",
        "moe_norm_w": True,
        "moe_w_scale": 0.0,
    }


def expert_metadata(shape, u32, width: bool = True) -> dict[str, Any]:
    """A synth file's expert keys as llama.cpp's converter writes them: the two counts, and the
    expert width where the arch has its own key (qwen3moe, qwen2moe; Mixtral's llama has none)."""
    a = shape.arch
    out = {
        f"{a}.expert_count": u32(shape.n_expert),
        f"{a}.expert_used_count": u32(shape.n_expert_used),
    }
    if width:
        out[f"{a}.expert_feed_forward_length"] = u32(shape.d_ff_exp)
    return out
