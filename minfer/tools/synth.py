"""Synthetic GGUF models at production shape (Llama-3-8B, Llama-2-7B, Qwen2-7B, Gemma-3-12B, ...).

`make_synthetic_model(out, SynthOptions(preset="llama3-8b", qtype="q4_K_M", seed=0))` writes a
valid GGUF that minfer, llama.cpp and gguf's reader all load: the metadata llama.cpp's converter
writes for the architecture, the tensor names and shapes of the real model, the tensor-type mix
llama.cpp's quantizer would choose, and random weights written directly as well-formed quantized
blocks (minfer.tools.synth_blocks).

Why the values do not matter for benchmarks: the work of a quantized GEMM (bytes loaded,
dequant / integer-dot instructions, mma count) depends on the shapes and types only. No kernel
branches on values, and tensor-core mma does not skip zeros; the one data-dependent effect
would be whole zero blocks (d = 0), which the generator never writes. Attention, norms and
SwiGLU are likewise value-independent once activations are finite.

Why the values are still chosen with care: parity and greedy-identity tests run on these
models, so activations must stay finite and well scaled through every layer. Each linear weight
[N, K] has dequantized std ~1/sqrt(K) and mean ~0, so y = x @ W.T keeps the rms of x; norm
weights are ~1 (uniform 0.9..1.1), biases small (std 0.02). The residual stream then grows
only like sqrt(layers), and logits (final norm, then an std-1/sqrt(d) head) have std ~1.

Tokenizer: the model gets the tokenizer metadata (tokenizer.*) of a real GGUF, by default the
default model (SmolLM2, GPT-2 BPE, vocab 49152) when it is on disk, so every tool, tokenizer
included, can run it; the vocab size is then that tokenizer's. Without one (or with a --vocab
that differs from it), a byte-level BPE vocab of exactly that size is generated: the 256
GPT-2 byte tokens, then two-byte tokens each with its merge, then <|endoftext|> / <|im_start|>.
Real Llama-3 has vocab 128256; the default here is 49152, so the LM head is 2.6x smaller than
Llama-3's (docs/design.md quotes its baselines at vocab 49152 too).

Generation is parallel across processes (one task per tensor, seeded by (seed, tensor index),
so the file is the same for any worker count) and streamed: tensors are produced in order a
bounded window ahead of the writer.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import BadInput


@dataclass(frozen=True)
class SynthShape:
    arch: str  # GGUF general.architecture: one of minfer.families.ARCHS
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab: int = 49152
    qkv_bias: bool = False
    tied: bool = False  # no output.weight: token_embd is the LM head
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    n_ctx: int = 8192
    # RoPE scaling as converters write it: "llama3" (rope_freqs.weight from HF's llama3 rule,
    # low/high frequency factors 1 and 4), "linear" or "yarn" (rope.scaling.* keys); factor and
    # the original context it stretches; "longrope" (phi3: Phi-3-mini-128k / Phi-3.5-mini's
    # rope_factors_long / _short.weight and rope.scaling.attn_factor from n_ctx over the
    # original context, no scaling type: longrope_factors, model_metadata)
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_orig_ctx: int = 8192
    head_dim: int = 0  # 0: d_model / n_heads; else written as attention.key_length
    # gemma3: attention.sliding_window (0: none); the local/global pattern is llama.cpp's
    # default (every 6th layer global; gemma2: every other), as the converter writes no
    # sliding_window_pattern
    sliding_window: int = 0
    # gemma2: attn_logit_softcapping and final_logit_softcapping (the converter writes both)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # granite: attention.scale, embedding_scale, residual_scale, logit_scale (HF's
    # attention_multiplier, embedding_multiplier, residual_multiplier, logits_scaling)
    kq_scale: float = 0.0
    embed_scale: float = 0.0
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    # mixture of experts (qwen3moe; llama: Mixtral): experts per layer, used per token, one
    # expert's width (qwen3moe's expert_feed_forward_length; 0: d_ff, Mixtral's)
    n_expert: int = 0
    n_expert_used: int = 0
    d_ff_exp: int = 0
    # qwen2moe: the sigmoid-gated shared expert's width (expert_shared_feed_forward_length;
    # 0: none)
    d_ff_shexp: int = 0

    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


PRESETS: dict[str, SynthShape] = {
    "llama3-8b": SynthShape("llama", 4096, 14336, 32, 32, 8, rope_base=500000.0),
    # 69 B weights: 129 GiB at f16, nearly all of one H200 (the memory-aware chooser's case)
    "llama3-70b": SynthShape("llama", 8192, 28672, 80, 64, 8, rope_base=500000.0),
    "llama2-7b": SynthShape("llama", 4096, 11008, 32, 32, 32, n_ctx=4096),
    "qwen2-7b-like": SynthShape(
        "qwen2", 3584, 18944, 28, 28, 4, qkv_bias=True, rope_base=1000000.0, rms_eps=1e-6
    ),
    # Llama 3.1 / 3.3: the llama3 RoPE factors, 128k context
    "llama3.1-8b": SynthShape(
        "llama",
        4096,
        14336,
        32,
        32,
        8,
        rope_base=500000.0,
        n_ctx=131072,
        rope_scaling="llama3",
        rope_factor=8.0,
    ),
    # Qwen2.5's long-context recipe: YaRN x4 over 32k
    "qwen2-7b-yarn": SynthShape(
        "qwen2",
        3584,
        18944,
        28,
        28,
        4,
        qkv_bias=True,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=131072,
        rope_scaling="yarn",
        rope_factor=4.0,
        rope_orig_ctx=32768,
    ),
    # Qwen3-8B: per-head q/k RMSNorm, NEOX RoPE, no biases, head_dim 128
    "qwen3-8b": SynthShape(
        "qwen3", 4096, 12288, 36, 32, 8, rope_base=1000000.0, rms_eps=1e-6, n_ctx=40960
    ),
    # Gemma 3 12B's shape: GeGLU, post norms, q/k norms, 5 local layers (window 1024, RoPE base
    # 10000) per global one (base 1e6, linear RoPE x8), head_dim 256 over d_model 3840, tied
    "gemma3-12b": SynthShape(
        "gemma3",
        3840,
        15360,
        48,
        16,
        8,
        tied=True,
        head_dim=256,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=131072,
        rope_scaling="linear",
        rope_factor=8.0,
        sliding_window=1024,
    ),
    # Gemma 3 27B's shape: gemma3-12b's graph at head_dim 128 (the one Gemma size the wgmma
    # attention takes), 32:16 heads over d_model 5376 (`--layers 18`: ~8B of weights)
    "gemma3-27b": SynthShape(
        "gemma3",
        5376,
        21504,
        62,
        32,
        16,
        tied=True,
        head_dim=128,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=131072,
        rope_scaling="linear",
        rope_factor=8.0,
        sliding_window=1024,
    ),
    # Phi-3-mini-4k: fused q|k|v and gate|up, MHA, head_dim 96, a window llama.cpp disables
    "phi3-mini": SynthShape(
        "phi3", 3072, 8192, 32, 32, 32, vocab=32064, n_ctx=4096, sliding_window=2047
    ),
    # Gemma 2 9B's shape: GeGLU, post norms, no q/k norms, every other layer local (window
    # 4096), one RoPE base (10000: the converter writes none), attention soft-cap 50, final 30,
    # head_dim 256 over d_model 3584, tied
    "gemma2-9b": SynthShape(
        "gemma2",
        3584,
        14336,
        42,
        16,
        8,
        tied=True,
        head_dim=256,
        rms_eps=1e-6,
        n_ctx=8192,
        sliding_window=4096,
        attn_softcap=50.0,
        final_softcap=30.0,
    ),
    # IBM Granite 3.x (HF config.json: attention_multiplier, embedding_multiplier,
    # residual_multiplier, logits_scaling -> granite.attention.scale, .embedding_scale,
    # .residual_scale, .logit_scale), tied, 128k context
    "granite-3-8b": SynthShape(
        "granite",
        4096,
        12800,
        40,
        32,
        8,
        vocab=49155,
        tied=True,
        rope_base=10000000.0,
        n_ctx=131072,
        kq_scale=0.0078125,
        embed_scale=12.0,
        residual_scale=0.22,
        logit_scale=16.0,
    ),
    "granite-3-2b": SynthShape(
        "granite",
        2048,
        8192,
        40,
        32,
        8,
        vocab=49155,
        tied=True,
        rope_base=5000000.0,
        n_ctx=131072,
        kq_scale=0.015625,
        embed_scale=12.0,
        residual_scale=0.22,
        logit_scale=8.0,
    ),
    # OLMo-2-1124-7B: post norms, q/k norms over the whole projection, MHA, untied
    "olmo2-7b": SynthShape(
        "olmo2", 4096, 11008, 32, 32, 32, vocab=100352, rope_base=500000.0, rms_eps=1e-6, n_ctx=4096
    ),
    # SmolLM3-3B: no RoPE on layers 3, 7, 11, ... (llama.cpp's n_no_rope_layer_step 4), tied
    "smollm3-3b": SynthShape(
        "smollm3",
        2048,
        11008,
        36,
        16,
        4,
        vocab=128256,
        tied=True,
        rope_base=5000000.0,
        rms_eps=1e-6,
        n_ctx=65536,
    ),
    # Qwen3-30B-A3B: qwen3's attention (32:4 heads of 128 over d 2048), 128 experts of width
    # 768, 8 per token, in each of 48 layers (~30.5 B weights, 3.3 B active)
    "qwen3-30b-a3b": SynthShape(
        "qwen3moe",
        2048,
        6144,
        48,
        32,
        4,
        vocab=151936,
        head_dim=128,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=40960,
        n_expert=128,
        n_expert_used=8,
        d_ff_exp=768,
    ),
    # Qwen3-235B-A22B: 94 layers, 64:4 heads over d 4096, 128 experts of width 1536 (no single
    # GPU holds it: the memory planner's refusal)
    "qwen3-235b-a22b": SynthShape(
        "qwen3moe",
        4096,
        12288,
        94,
        64,
        4,
        vocab=151936,
        head_dim=128,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=40960,
        n_expert=128,
        n_expert_used=8,
        d_ff_exp=1536,
    ),
    # Mixtral-8x7B: llama with 8 experts of width 14336 (its feed_forward_length), 2 per token
    "mixtral-8x7b": SynthShape(
        "llama",
        4096,
        14336,
        32,
        32,
        8,
        vocab=32000,
        rope_base=1000000.0,
        n_ctx=32768,
        n_expert=8,
        n_expert_used=2,
    ),
    # Qwen1.5-MoE-A2.7B: qwen2's attention (16 heads of 128, q/k/v biases) over d 2048, 60
    # experts of width 1408, 4 per token, and a shared expert of 5632 in each of 24 layers
    # (~14.3 B weights, 2.7 B active); untied, as llama.cpp's qwen2moe loader requires
    "qwen1.5-moe-a2.7b": SynthShape(
        "qwen2moe",
        2048,
        5632,
        24,
        16,
        16,
        vocab=151936,
        qkv_bias=True,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_expert=60,
        n_expert_used=4,
        d_ff_exp=1408,
        d_ff_shexp=5632,
    ),
    "tiny": SynthShape("llama", 256, 512, 2, 4, 2, tied=True),
    # qwen3moe: 8 experts of width 256, 4 per token (renormalized weights matter), head_dim 128
    "tiny-qwen3moe": SynthShape(
        "qwen3moe",
        256,
        512,
        2,
        4,
        2,
        head_dim=128,
        n_ctx=4096,
        rms_eps=1e-6,
        n_expert=8,
        n_expert_used=4,
        d_ff_exp=256,
    ),
    # qwen2moe: qkv biases, 8 experts of width 256, 4 per token with their raw softmax
    # weights, a shared expert of width 384 (its own key, not d_ff 512) behind a sigmoid gate
    "tiny-qwen2moe": SynthShape(
        "qwen2moe",
        256,
        512,
        2,
        4,
        2,
        qkv_bias=True,
        n_ctx=4096,
        rms_eps=1e-6,
        n_expert=8,
        n_expert_used=4,
        d_ff_exp=256,
        d_ff_shexp=384,
    ),
    # Mixtral's form: llama, 8 experts of width d_ff 512, 2 per token
    "tiny-mixtral": SynthShape("llama", 256, 512, 2, 4, 2, n_ctx=4096, n_expert=8, n_expert_used=2),
    "tiny-phi3": SynthShape("phi3", 256, 512, 2, 4, 4, n_ctx=4096, sliding_window=32),
    # head_dim 128 over d_model 256 (as Qwen3-0.6B: 16 heads x 128 over 1024)
    "tiny-qwen3": SynthShape(
        "qwen3", 256, 512, 2, 4, 2, tied=True, head_dim=128, n_ctx=4096, rms_eps=1e-6
    ),
    # tiny files whose RoPE scaling moves the logits within a few hundred positions (an
    # original context of 256 / 64): the llama.cpp oracle tests (tests/golden/families)
    "tiny-llama3": SynthShape(
        "llama",
        256,
        512,
        2,
        4,
        2,
        n_ctx=4096,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_orig_ctx=256,
    ),
    "tiny-linear": SynthShape(
        "llama", 256, 512, 2, 4, 2, n_ctx=4096, rope_scaling="linear", rope_factor=4.0
    ),
    "tiny-qwen2-yarn": SynthShape(
        "qwen2",
        256,
        512,
        2,
        4,
        2,
        qkv_bias=True,
        n_ctx=4096,
        rope_scaling="yarn",
        rope_factor=4.0,
        rope_orig_ctx=64,
    ),
    # phi3 with Phi-3-mini-128k's long-context RoPE (what convert_hf_to_gguf.py's Phi3MiniModel
    # writes): rope_factors_long / _short.weight, an original context of 512 in a context of
    # 4096 (attn_factor sqrt(1 + ln 8 / ln 512)); llama.cpp takes the long factors for a
    # context past 512 (minfer's default: the model's 4096), the short ones up to 512
    "tiny-phi3-long": SynthShape(
        "phi3",
        256,
        512,
        2,
        4,
        4,
        n_ctx=4096,
        sliding_window=32,
        rope_scaling="longrope",
        rope_orig_ctx=512,
    ),
    # gemma3 with a window of 32 (a few hundred prompt tokens cross it many times), 6 layers
    # (0-4 local, 5 global: the default pattern), 1 KV head as Gemma 3 270M, head_dim 128 (its
    # 1/sqrt(128) q scale is not a power of two), linear RoPE x8 on the global layer only
    "tiny-gemma3": SynthShape(
        "gemma3",
        256,
        512,
        6,
        4,
        1,
        tied=True,
        head_dim=128,
        rope_base=1000000.0,
        rms_eps=1e-6,
        n_ctx=4096,
        rope_scaling="linear",
        rope_factor=8.0,
        sliding_window=32,
    ),
    # gemma2 with a window of 32 on layers 0 and 2 (llama.cpp's default pattern: every other
    # layer local), 2 KV heads, head_dim 128 over d_model 256 (q x 1/sqrt(128)); soft caps small
    # enough to bend this model's attention scores (std ~1) and logits, where Gemma 2's 50 / 30
    # would not
    "tiny-gemma2": SynthShape(
        "gemma2",
        256,
        512,
        4,
        4,
        2,
        tied=True,
        head_dim=128,
        rms_eps=1e-6,
        n_ctx=4096,
        sliding_window=32,
        attn_softcap=2.0,
        final_softcap=10.0,
    ),
    # granite with Granite 3's embedding multiplier (12), an attention scale of 1/head_dim (as
    # Granite 3's 1/128 at head_dim 128), a residual multiplier of 0.5 (Granite 3's 0.22 damps
    # this model's attention so much that its scale would hardly show) and a logit scale of 2
    "tiny-granite": SynthShape(
        "granite",
        256,
        512,
        4,
        4,
        2,
        tied=True,
        n_ctx=4096,
        kq_scale=1.0 / 64,
        embed_scale=12.0,
        residual_scale=0.5,
        logit_scale=2.0,
    ),
    # olmo2: post norms only, q/k norms over [H D] / [Hkv D], NEOX RoPE, GQA 4:2, untied
    "tiny-olmo2": SynthShape(
        "olmo2", 256, 512, 4, 4, 2, rope_base=500000.0, rms_eps=1e-6, n_ctx=4096
    ),
    # smollm3: 8 layers, layers 3 and 7 without RoPE; base 10000 (SmolLM3's 5e6 hardly turns
    # this model's pairs within a few hundred positions)
    "tiny-smollm3": SynthShape("smollm3", 256, 512, 8, 4, 2, tied=True, rms_eps=1e-6, n_ctx=4096),
}
ROPE_SCALINGS = ("none", "llama3", "linear", "yarn", "longrope")

# the --type choices: file types whose mix uses only types minfer.tools.synth_blocks can write
# (Q4_K, Q6_K, Q5_0, Q8_0, F16); file_type values from minfer.tools.quantize_mix.FTYPES
FTYPES = ("q4_K_M", "q6_K", "q8_0", "f16")


@dataclass(frozen=True)
class SynthOptions:
    preset: str = "llama3-8b"
    layers: int | None = None  # override the preset's layer count
    n_ctx: int | None = None  # override the preset's context length
    qtype: str = "q4_K_M"  # a key of FTYPES
    seed: int = 0
    vocab: int | None = None  # None: the tokenizer source's, else the preset's
    tokenizer_from: str | os.PathLike | None = "default"  # a GGUF, "default", or None
    workers: int | None = None  # processes; None: os.cpu_count()
    as_llama: bool = False  # the preset's dimensions as a plain llama (llama_twin)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    qtype: str  # ggml type name
    shape: tuple[int, ...]  # numpy order [rows, cols]
    kind: str  # "weight" (std 1/sqrt(cols)), "norm" (~1), "bias" (std 0.02)


# ---- type mix: llama.cpp's rules (minfer.tools.quantize_mix) ---------------------------------
def _plan_types(shape: SynthShape, ftype: str, items) -> dict[str, str]:
    from minfer.tools.quantize_mix import MixModel, TensorDesc, plan_types

    model = MixModel(shape.arch, shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.n_expert)
    # every tensor starts as F32: norms and biases keep it, weights get the mix's type
    return plan_types([TensorDesc(n, sh, "F32") for n, sh, _ in items], ftype, model)


def tensor_plan(shape: SynthShape, ftype: str) -> list[TensorPlan]:
    """Every tensor of the model, in file order, with its type and role."""
    if ftype not in FTYPES:
        raise BadInput(f"unknown --type {ftype!r} (choose from {', '.join(FTYPES)})")
    s = shape
    hd = s.hd
    items: list[tuple[str, tuple[int, ...], str]] = []
    if s.rope_scaling == "longrope":  # the converter's generate_extra_tensors: first
        items += [
            ("rope_factors_long.weight", (hd // 2,), "rope_long"),
            ("rope_factors_short.weight", (hd // 2,), "rope_short"),
        ]
    items.append(("token_embd.weight", (s.vocab, s.d_model), "weight"))
    from minfer.families import family

    sch = family(s.arch).layer(s.arch, s.qkv_bias)
    if s.n_expert:  # the router and the stacked experts [e, N, K] in place of the dense FFN
        sch = sch.with_experts(shared=bool(s.d_ff_shexp))  # (+ qwen2moe's shared expert)
    for i in range(s.n_layers):  # the family's layer as its converter writes it
        for t in sch.file_tensors():
            items.append(
                (
                    t.full(i),
                    sch.shape(t, s),
                    "weight"
                    if t.role in ("linear", "router", "experts", "shexp", "shexp_gate")
                    else t.role,
                )
            )
    if s.rope_scaling == "llama3":
        items.append(("rope_freqs.weight", (hd // 2,), "rope_freqs"))
    items.append(("output_norm.weight", (s.d_model,), "norm"))
    if not s.tied:
        items.append(("output.weight", (s.vocab, s.d_model), "weight"))
    types = _plan_types(s, ftype, items)
    return [TensorPlan(n, types[n], sh, k) for n, sh, k in items]


# ---- values ---------------------------------------------------------------------------------
def llama3_rope_factors(
    head_dim: int, base: float, factor: float, orig_ctx: int, low: float = 1.0, high: float = 4.0
) -> np.ndarray:
    """rope_freqs.weight f32 [head_dim/2] as convert_hf_to_gguf.py derives it from a Llama 3.1
    config's rope_scaling (rope_type llama3): 1 for short wavelengths, `factor` for long
    ones, a smooth blend between."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < orig_ctx / high:
            out.append(1.0)
        elif wavelen > orig_ctx / low:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def longrope_factors(n: int, long: bool, scale: float) -> np.ndarray:
    """rope_factors_long / _short.weight f32 [n] (HF's long_factor / short_factor): made-up
    values of the real ones' form, rising with the pair index (the slow pairs stretched most):
    long from 1 to 2 x scale (Phi-3-mini-128k's: 1.03 .. 64 for a scale of 32), short from 1 to
    1.5."""
    x = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    top = 2.0 * scale if long else 1.5
    return (top ** (x * x)).astype(np.float32)


def longrope_attn_factor(n_ctx: int, orig_ctx: int) -> float:
    """convert_hf_to_gguf.py's Phi3MiniModel: sqrt(1 + ln(scale) / ln(orig)) for scale =
    max_position_embeddings / original_max_position_embeddings > 1, else 1."""
    import math

    scale = n_ctx / orig_ctx
    return math.sqrt(1 + math.log(scale) / math.log(orig_ctx)) if scale > 1.0 else 1.0


def make_tensor(
    plan: TensorPlan, seed: int, index: int, shape: SynthShape | None = None
) -> np.ndarray:
    """The data of one tensor: seeded by (seed, index) alone, so any worker can make it."""
    from minfer.tools.synth_blocks import random_blocks

    if plan.kind == "rope_freqs":
        return llama3_rope_factors(
            2 * plan.shape[0], shape.rope_base, shape.rope_factor, shape.rope_orig_ctx
        )
    if plan.kind in ("rope_long", "rope_short"):
        return longrope_factors(
            plan.shape[0], plan.kind == "rope_long", shape.n_ctx / shape.rope_orig_ctx
        )
    rng = np.random.default_rng([seed, index])
    if plan.kind == "norm":
        return rng.uniform(0.9, 1.1, plan.shape).astype(np.float32)
    if plan.kind == "bias":
        return (rng.standard_normal(plan.shape) * 0.02).astype(np.float32)
    rows, cols = int(np.prod(plan.shape[:-1])), plan.shape[-1]  # experts: [e * N, K]
    return random_blocks(plan.qtype, rng, rows, cols, 1.0 / np.sqrt(cols))


def _produce(
    plans: list[TensorPlan], seed: int, workers: int, shape: SynthShape | None = None
) -> Iterator[np.ndarray]:
    """Tensor data in plan order, made by `workers` processes at most 2*workers ahead."""
    if workers <= 1:
        for i, p in enumerate(plans):
            yield make_tensor(p, seed, i, shape)
        return
    import multiprocessing

    from minfer.host.signals import deferred

    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    # fork: workers start at once (before any other thread) and need no importable __main__;
    # they ignore signals (the parent reacts and stops them below), and a signal during Pool()
    # waits until the pool exists
    with deferred():
        pool = ctx.Pool(workers, initializer=_worker_init, initargs=(stop,))
    try:
        pending: deque = deque()
        nxt = 0
        while nxt < len(plans) or pending:
            while nxt < len(plans) and len(pending) < 2 * workers:
                pending.append(
                    pool.apply_async(_make_unless_stopped, (plans[nxt], seed, nxt, shape))
                )
                nxt += 1
            yield pending.popleft().get()
    finally:
        # not Pool.terminate(): its SIGTERM is ignored, and a worker killed while sending a
        # result would leave the result pipe half-written. Queued tensors are skipped.
        with deferred():  # a signal during the join would leave the pool half-stopped
            stop.set()
            pool.close()
            pool.join()


_stop = None  # the pool's stop event, in each worker process (set by _worker_init)


def _worker_init(stop) -> None:
    global _stop
    from minfer.host.signals import ignore_in_worker

    ignore_in_worker()
    _stop = stop


def _make_unless_stopped(
    plan: TensorPlan, seed: int, index: int, shape: SynthShape | None = None
) -> np.ndarray | None:
    return None if _stop.is_set() else make_tensor(plan, seed, index, shape)


# ---- tokenizer ------------------------------------------------------------------------------
SPECIALS = ("<|endoftext|>", "<|im_start|>")
# Phi-3: llama.cpp's vocab sets its special tokens' whitespace rule on these by name
# (llama_vocab::load: token_to_id.at, so a Phi-3 vocab must hold them)
SPECIALS_BY_ARCH = {"phi3": SPECIALS + ("</s>", "<s>", "<unk>")}


# the pre-tokenizer a family's real files name (Qwen2 / 2.5 / 3: digits one by one)
PRE_BY_ARCH = {"qwen2": "qwen2", "qwen3": "qwen2", "qwen3moe": "qwen2"}


def generated_tokenizer(
    vocab: int, specials: tuple[str, ...] = SPECIALS, pre: str = "gpt-2"
) -> dict[str, Any]:
    """A byte-level BPE tokenizer of exactly `vocab` tokens (see the module docstring); the
    control tokens `specials` last, the first of them EOS; `pre`: tokenizer.ggml.pre."""
    import gguf

    V = gguf.GGUFValueType
    n_special = len(specials)
    n_pairs = vocab - 256 - n_special
    if n_pairs < 0 or n_pairs > 256 * 256:
        raise BadInput(f"a generated vocab must have 258..{256 * 256 + 258} tokens, not {vocab}")
    from minfer.text.tokenizer import bytes_to_unicode

    chars = [bytes_to_unicode()[b] for b in range(256)]  # GPT-2 byte-level alphabet
    pairs = [(a, b) for a in range(256) for b in range(256)][:n_pairs]
    tokens = chars + [chars[a] + chars[b] for a, b in pairs] + list(specials)
    merges = [f"{chars[a]} {chars[b]}" for a, b in pairs]
    types = [1] * (vocab - n_special) + [3] * n_special  # 1 normal, 3 control
    eos = vocab - n_special
    return {
        "tokenizer.ggml.model": gguf.GGUFValue("gpt2", V.STRING),
        "tokenizer.ggml.pre": gguf.GGUFValue(pre, V.STRING),
        "tokenizer.ggml.tokens": gguf.GGUFValue(tokens, V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": gguf.GGUFValue(types, V.ARRAY, V.INT32),
        "tokenizer.ggml.merges": gguf.GGUFValue(merges, V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": gguf.GGUFValue(eos, V.UINT32),
        "tokenizer.ggml.eos_token_id": gguf.GGUFValue(eos, V.UINT32),
        "tokenizer.ggml.add_bos_token": gguf.GGUFValue(False, V.BOOL),
    }


def tokenizer_metadata(
    source: str | os.PathLike | None,
    vocab: int | None,
    specials: tuple[str, ...] = SPECIALS,
    pre: str = "gpt-2",
) -> tuple[dict[str, Any], int, str]:
    """(tokenizer.* metadata, vocab size, a line saying where it came from)."""
    path = None
    if source == "default":
        from minfer.gguf.fetch import default_model_path

        p = default_model_path(fetch=False)
        path = p if p.exists() else None
    elif source is not None:
        path = Path(source)
        if not path.is_file():
            raise BadInput(f"--tokenizer-from {path}: no such file")
    if path is not None:
        from minfer.gguf.header import read_header

        meta = {k: v for k, v in read_header(path).kv.items() if k.startswith("tokenizer.")}
        tok = meta.get("tokenizer.ggml.tokens")
        if tok is None:
            raise BadInput(f"--tokenizer-from {path}: it has no tokenizer.ggml.tokens")
        n = len(tok.value)
        if vocab is None or vocab == n:
            return meta, n, f"tokenizer copied from {path.name} (vocab {n})"
        why = f"--vocab {vocab} differs from {path.name}'s {n}"
    else:
        why = "no tokenizer source on disk" if source == "default" else "no tokenizer source"
    v = vocab if vocab is not None else 49152
    return (
        generated_tokenizer(v, specials, pre),
        v,
        f"generated byte-level BPE vocab of {v} ({why})",
    )


# ---- the model ------------------------------------------------------------------------------
def model_metadata(shape: SynthShape, ftype: str, name: str) -> dict[str, Any]:
    import gguf

    from minfer.tools.quantize_mix import FTYPES as MIX_FTYPES

    V = gguf.GGUFValueType
    a = shape.arch
    hd = shape.hd
    u32 = lambda x: gguf.GGUFValue(int(x), V.UINT32)  # noqa: E731
    f32 = lambda x: gguf.GGUFValue(float(x), V.FLOAT32)  # noqa: E731
    rope: dict[str, Any] = {}
    if shape.rope_scaling in ("linear", "yarn"):
        rope = {
            f"{a}.rope.scaling.type": gguf.GGUFValue(shape.rope_scaling, V.STRING),
            f"{a}.rope.scaling.factor": f32(shape.rope_factor),
        }
        if shape.rope_scaling == "yarn":
            rope[f"{a}.rope.scaling.original_context_length"] = u32(shape.rope_orig_ctx)
    elif shape.rope_scaling == "longrope":  # Phi3MiniModel: no type, no factor
        if a != "phi3":
            raise BadInput(f"longrope RoPE factors are phi3's, not {a}'s")
        rope = {
            f"{a}.rope.scaling.original_context_length": u32(shape.rope_orig_ctx),
            f"{a}.rope.scaling.attn_factor": f32(
                longrope_attn_factor(shape.n_ctx, shape.rope_orig_ctx)
            ),
        }
    kv = {f"{a}.attention.key_length": u32(hd), f"{a}.attention.value_length": u32(hd)}
    common = {
        "general.name": gguf.GGUFValue(name, V.STRING),
        "general.file_type": u32(MIX_FTYPES[ftype][0]),
        "general.quantization_version": u32(gguf.GGML_QUANT_VERSION),
        f"{a}.block_count": u32(shape.n_layers),
        f"{a}.context_length": u32(shape.n_ctx),
        f"{a}.embedding_length": u32(shape.d_model),
        f"{a}.feed_forward_length": u32(shape.d_ff),
        f"{a}.attention.head_count": u32(shape.n_heads),
        f"{a}.attention.head_count_kv": u32(shape.n_kv_heads),
        f"{a}.rope.freq_base": f32(shape.rope_base),
        f"{a}.attention.layer_norm_rms_epsilon": f32(shape.rms_eps),
    }
    from minfer.families import family

    return family(a).synth_metadata(shape, common, kv, rope, u32, f32)


def llama_twin(shape: SynthShape) -> SynthShape:
    """shape's dimensions (width, FFN, layers, heads, head_dim, vocab, tied, RoPE base, eps,
    context) as a plain llama: no family extras (post norms, q/k norms, scales, soft-caps,
    windows, biases, RoPE scaling). Benched beside the family, it shows what the family's own
    ops cost at its shape. Mixture-of-experts presets are refused (a llama with experts is
    Mixtral, of other widths)."""
    if shape.n_expert:
        raise BadInput("--as-llama: a mixture-of-experts preset has no dense llama twin")
    return SynthShape(
        "llama",
        shape.d_model,
        shape.d_ff,
        shape.n_layers,
        shape.n_heads,
        shape.n_kv_heads,
        vocab=shape.vocab,
        tied=shape.tied,
        rope_base=shape.rope_base,
        rms_eps=shape.rms_eps,
        n_ctx=shape.n_ctx,
        head_dim=shape.head_dim,
    )


def resolve_shape(opts: SynthOptions) -> SynthShape:
    if opts.preset not in PRESETS:
        raise BadInput(f"unknown preset {opts.preset!r} (choose from {', '.join(PRESETS)})")
    shape = PRESETS[opts.preset]
    if opts.as_llama:
        shape = llama_twin(shape)
    if opts.layers is not None:
        if opts.layers < 1:
            raise BadInput(f"--layers must be >= 1, not {opts.layers}")
        shape = replace(shape, n_layers=opts.layers)
    if opts.n_ctx is not None:
        if opts.n_ctx < 1:
            raise BadInput(f"--ctx must be >= 1, not {opts.n_ctx}")
        shape = replace(shape, n_ctx=opts.n_ctx)
    return shape


def make_synthetic_model(
    out: str | os.PathLike, opts: SynthOptions, progress: bool = True
) -> dict[str, Any]:
    """Write the model; returns a summary (path, bytes, tensors, tokenizer line, seconds)."""
    import time

    from minfer.gguf.write import write_gguf

    t0 = time.perf_counter()
    shape = resolve_shape(opts)
    if opts.qtype not in FTYPES:
        raise BadInput(f"unknown --type {opts.qtype!r} (choose from {', '.join(FTYPES)})")
    tok_meta, vocab, tok_line = tokenizer_metadata(
        opts.tokenizer_from,
        opts.vocab,
        SPECIALS_BY_ARCH.get(shape.arch, SPECIALS),
        PRE_BY_ARCH.get(shape.arch, "gpt-2"),
    )
    shape = replace(shape, vocab=vocab)
    plans = tensor_plan(shape, opts.qtype)
    name = f"synthetic {opts.preset} {opts.qtype} L{shape.n_layers} seed {opts.seed}"
    meta = model_metadata(shape, opts.qtype, name) | tok_meta
    workers = opts.workers if opts.workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise BadInput(f"--workers must be >= 1, not {workers}")
    stream = _produce(plans, opts.seed, min(workers, len(plans)), shape)
    # write_gguf calls each entry's callable once, in order: the stream yields in plan order
    try:
        path = write_gguf(
            out,
            shape.arch,
            meta,
            [(p.name, _qtype_id(p.qtype), p.shape, stream.__next__) for p in plans],
            progress=progress,
        )
    finally:
        stream.close()
    return {
        "path": path,
        "bytes": path.stat().st_size,
        "tensors": len(plans),
        "tokenizer": tok_line,
        "shape": shape,
        "seconds": time.perf_counter() - t0,
    }


def _qtype_id(name: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[name])
