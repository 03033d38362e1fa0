"""Model families: one module per family (llama.cpp's src/models/<arch>.cpp in spirit), each
owning its GGUF architecture names, its hyperparameter reader (the ModelConfig fields only a
family sets), its extra keys and tensors, its RoPE style and its layer schema
(minfer.families.schema). The loader, arch_keys, the CUDA routes and upload, and synth read
them; a new llama-like family is a module here, its tests and its llama.cpp golden data."""

from __future__ import annotations

from minfer.errors import Unsupported
from minfer.families import gemma, granite, llama, olmo2, phi3, qwen, qwen2moe, qwen3moe, smollm3
from minfer.families.schema import Family, FusedSpec, LayerSchema, TensorSpec, layer_schema

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    qwen.FAMILY,
    phi3.FAMILY,
    gemma.FAMILY,
    granite.FAMILY,
    olmo2.FAMILY,
    smollm3.FAMILY,
    qwen3moe.FAMILY,
    qwen2moe.FAMILY,
)
BY_ARCH: dict[str, Family] = {a: f for f in FAMILIES for a in f.archs}
ARCHS: tuple[str, ...] = tuple(BY_ARCH)

# mixture-of-experts architectures refused by name: what of each is not built
NOT_BUILT = {
    "gpt-oss": "gpt-oss's MXFP4 experts, attention sinks and clamped SwiGLU are not implemented",
    "deepseek2": "DeepSeek's multi-head latent attention (MLA) and grouped expert routing are "
    "not implemented",
    "deepseek": "DeepSeek's shared experts and leading dense layers are not implemented",
}

__all__ = [
    "ARCHS",
    "BY_ARCH",
    "FAMILIES",
    "Family",
    "FusedSpec",
    "LayerSchema",
    "TensorSpec",
    "family",
    "layer_schema",
    "schema_of",
]


def family(arch: str, where: str = "") -> Family:
    """The family of a GGUF general.architecture; Unsupported naming the supported ones."""
    from minfer.errors import show

    f = BY_ARCH.get(arch) if isinstance(arch, str) else None
    if f is None and arch in NOT_BUILT:
        raise Unsupported(
            f"{where}architecture {show(arch, 60)}: {NOT_BUILT[arch]} "
            f"(supported: {', '.join(ARCHS)})"
        )
    if f is None:
        raise Unsupported(
            f"{where}unsupported architecture {show(arch, 60)} (supported: {', '.join(ARCHS)})"
        )
    return f


def schema_of(cfg) -> LayerSchema:
    """The layer schema of a ModelConfig (its arch, whether it has q/k/v biases, experts, a
    shared expert)."""
    sch = BY_ARCH[cfg.arch].layer(cfg.arch, cfg.qkv_bias)
    if not getattr(cfg, "n_expert", 0):
        return sch
    return sch.with_experts(shared=bool(getattr(cfg, "d_ff_shexp", 0)))
