"""What a GGUF may say to minfer: the metadata keys and tensors each architecture understands.

llama.cpp refuses a file with a tensor its graph does not create ("wrong number of tensors"),
but quietly ignores metadata keys it does not read; minfer refuses both, by name, unless the
key is listed here as inert (it changes no number the forward computes). A hyperparameter (a
key in the architecture's namespace, `llama.*`) that changes the computation and is not
implemented (a sliding window, an attention scale, a RoPE type) is an `Unsupported` error,
never a silent plain-llama run; so is a split file. Keys of other namespaces (a tool's own,
another architecture's) are not hyperparameters of this one and pass.

Key names are llama.cpp's (src/llama-arch.cpp), with `{a}` the architecture.
"""

from __future__ import annotations

import re
from typing import Any

from minfer.errors import (
    Unsupported,
    show,  # noqa: F401  (the loader's and the families' error lines)
)
from minfer.families import FAMILIES as _FAMILIES

# Keys the loader reads for every supported architecture (minfer.gguf.loader.GGUFModel._config).
USED = (
    "{a}.block_count",
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.feed_forward_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.layer_norm_rms_epsilon",
    "{a}.rope.dimension_count",
    "{a}.rope.freq_base",
    "{a}.vocab_size",
    # RoPE scaling (minfer.gguf.loader.rope_scaling)
    "{a}.rope.scaling.type",
    "{a}.rope.scaling.factor",
    "{a}.rope.scale_linear",
    "{a}.rope.scaling.attn_factor",
    "{a}.rope.scaling.original_context_length",
    "{a}.pooling_type",  # embeddings' pooling (minfer.batch.pooling.model_pooling)
)

# Keys the loader reads for one architecture only (its family's reader, minfer.families: e.g.
# gemma's for gemma3 / gemma2, llama.cpp's load_arch_hparams); for the others they stay refused
# (WHY).
USED_BY_ARCH = {a: k for f in _FAMILIES for a, k in f.keys.items()}

# Keys that change nothing the forward computes, whatever their value.
INERT = (
    "{a}.rope.scaling.finetuned",  # llama.cpp stores it and never uses it
    "{a}.tensor_data_layout",  # how the converter laid out the source checkpoint
)
# Keys one architecture's llama.cpp graph reads and then disables: minfer follows the oracle
# (Phi-3's window: llama.cpp turns SWA off for phi3, ggml-org/llama.cpp#13676, so its logits
# are those of full causal attention; docs/families.md says so).
INERT_BY_ARCH = {a: k for f in _FAMILIES for a, k in f.inert_keys.items()}
# Whole namespaces with no effect on the numbers: descriptions (general.*), the tokenizer's
# (read and checked by minfer.text.tokenizer), imatrix provenance, and the reader's pseudo-keys.
INERT_PREFIXES = ("general.", "tokenizer.", "quantize.imatrix.", "GGUF.")

# Keys that are inert only at the value llama.cpp assumes (llama.cpp does not read them for
# these architectures; a file that states its default is the same model).
INERT_AT = {
    "{a}.expert_count": 0,
    "{a}.expert_used_count": 0,
    "{a}.rope.scaling.yarn_beta_fast": 32.0,
    "{a}.rope.scaling.yarn_beta_slow": 1.0,
    "{a}.rope.scaling.yarn_log_multiplier": 0.0,
    "{a}.attention.scale": 0.0,  # 0: llama.cpp's 1/sqrt(head_dim)
}

# What a refused key means, for the error line (the rest: "not implemented").
WHY = {
    "{a}.attention.sliding_window": "sliding-window attention is not implemented",
    "{a}.expert_count": "mixture-of-experts is implemented for llama (Mixtral), qwen3moe and qwen2moe only",
    "{a}.attention.scale": "a custom attention scale is not implemented",
    "{a}.rope.scaling.yarn_log_multiplier": "YaRN's log multiplier is not implemented",
    "split.count": "a split GGUF is not supported: merge it first (llama-gguf-split --merge)",
    "split.no": "a split GGUF is not supported: merge it first (llama-gguf-split --merge)",
}

# Tensors beyond the layer schema (minfer.families: token_embd, output_norm, output and each
# layer's schema tensors) that an architecture may carry, with what they are (rope_freqs,
# phi3's long-context factors).
EXTRA_TENSORS = {a: f.extra_tensors.get(a, {}) for f in _FAMILIES for a in f.archs}


def _named(a: str, keys) -> set[str]:
    return {k.format(a=a) for k in keys}


def check_keys(path: Any, arch: str, metadata: dict[str, Any]) -> None:
    """Unsupported naming the first metadata key minfer does not understand for `arch`."""
    used = _named(arch, USED) | _named(arch, USED_BY_ARCH.get(arch, ()))
    inert = _named(arch, INERT) | _named(arch, INERT_BY_ARCH.get(arch, ()))
    at = {k.format(a=arch): v for k, v in INERT_AT.items()}
    why = {k.format(a=arch): v for k, v in WHY.items()}
    for key, value in metadata.items():
        if not (key.startswith(arch + ".") or key in why):
            continue  # not a hyperparameter of this architecture
        if key in used or key in inert or key.startswith(INERT_PREFIXES):
            continue
        if key in at and _equal(value, at[key]):
            continue
        reason = why.get(key, f"not understood for architecture {arch!r}")
        raise Unsupported(
            f"{path}: metadata key {key!r} = {show(value)}: {reason} "
            "(minfer refuses what it would otherwise silently ignore)"
        )


def check_tensor_names(path: Any, arch: str, expected: set[str], present) -> None:
    """Unsupported naming the first tensor that is neither expected nor a known extra."""
    extra = EXTRA_TENSORS.get(arch, {})
    for name in present:
        if name not in expected and name not in extra:
            what = _tensor_role(name)
            raise Unsupported(
                f"{path}: tensor {name!r}{what} is not part of the {arch} graph "
                "minfer implements (refused rather than ignored)"
            )


_ROLES = (
    (r"\.bias$", "a bias"),
    (r"_norm\.weight$", "an extra norm"),
    (r"^rope_(factors|freqs)", "RoPE factors"),
    (r"_exps\.", "expert weights"),
)


def _tensor_role(name: str) -> str:
    for pat, role in _ROLES:
        if re.search(pat, name):
            return f" ({role})"
    return ""


def _equal(value: Any, want: Any) -> bool:
    return not isinstance(value, (bool, str, list)) and value == want


# Architectures the CUDA backend runs (its kernels: rmsnorm, SwiGLU, RoPE, causal GQA
# attention with windows and soft-caps, qwen3's head norms, gemma_layers.cu): every one the
# loader reads; an architecture added to the loader first runs on the CPU reference alone.
GPU_ARCHS = tuple(a for f in _FAMILIES if f.gpu for a in f.archs)
GPU_HEAD_DIMS = (64, 96, 128, 256)
MAX_GPU_EXPERTS = 512  # kernels/moe.cu's MOE_MAX_E (minfer.cuda.ops.moe.MAX_EXPERTS)  # the attention kernels' entries (minfer.cuda.ops.attention)


def gpu_unsupported(cfg) -> str:
    """'' when the CUDA backend runs a model of this config, else why not (one clause)."""
    if getattr(cfg, "n_expert", 0) > MAX_GPU_EXPERTS:
        return (
            f"mixture-of-experts with {cfg.n_expert} experts: the CUDA routing kernels take "
            f"at most {MAX_GPU_EXPERTS} (--backend cpu)"
        )
    if cfg.arch not in GPU_ARCHS:
        return (
            f"architecture {cfg.arch!r} runs on the CPU reference only (--backend cpu); "
            f"the CUDA backend runs {', '.join(GPU_ARCHS)}"
        )
    if cfg.head_dim not in GPU_HEAD_DIMS:
        return (
            f"head_dim {cfg.head_dim} runs on the CPU reference only (--backend cpu); "
            f"the CUDA attention takes {', '.join(map(str, GPU_HEAD_DIMS))}"
        )
    return ""
