"""GGUF model loading: metadata -> ModelConfig, tensors memory-mapped, reference dequant.

The header is validated and parsed in one pass by minfer.gguf.header (fast: no numpy object
per metadata item); the file is memory-mapped once, read-only, and each tensor's data is a numpy
view into that map, only read when dequantized. Metadata and tensor data are what the `gguf`
package's GGUFReader gives (tests/test_loader.py holds us to it); `GGUFModel.reader` opens that
reference reader on demand (slow: seconds on a 49k vocab). Shapes are given the numpy way
([rows, cols] = [ne1, ne0]); a 2-D weight W of a linear layer y = x @ W.T has shape [N, K].
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import BadModel, Unsupported
from minfer.families import ARCHS as _ARCHS  # noqa: F401  (every family's architectures)
from minfer.gguf.arch_keys import show
from minfer.host.words import plural

_BLK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE beyond (base, dims) as llama.cpp applies it: ggml_rope_ext's freq_scale, ext_factor,
    attn_factor, beta_fast/slow, n_ctx_orig and freq_factors, resolved from the file the way
    llama_context does (src/llama-context.cpp). The default is plain RoPE.

    kind: "none" (or "linear" with factor 1: plain), "linear" (positions / factor), "yarn";
    the llama3 factors (rope_freqs.weight) combine with any kind. freq_factors: [rope_dim/2]
    f32 values dividing each pair's angle. attn_factor: ggml's mscale, multiplying cos and sin.
    longrope: phi3's (long, short) factors (rope_factors_long / _short.weight); freq_factors
    then holds the pair llama_model::get_rope_factors picks for the context `longrope_ctx`
    (for_context: long when that context, padded to 256, exceeds n_ctx_orig).
    """

    kind: str = "none"
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    freq_factors: tuple[float, ...] | None = None
    longrope: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    longrope_ctx: int = 0

    @property
    def plain(self) -> bool:
        return (
            self.freq_scale == 1.0
            and self.ext_factor == 0.0
            and self.attn_factor == 1.0
            and self.freq_factors is None
        )

    @property
    def longrope_long(self) -> bool:
        """phi3: the long factors are the ones in use (False: the short ones, or none)."""
        return self.longrope is not None and uses_long_factors(self.longrope_ctx, self.n_ctx_orig)

    def for_context(self, n_ctx: int) -> RopeScaling:
        """The scaling of a run whose context (llama.cpp's n_ctx, one sequence) is n_ctx: phi3's
        long or short factors as llama_model::get_rope_factors chooses them; the rest as is."""
        if self.longrope is None:
            return self
        long = uses_long_factors(n_ctx, self.n_ctx_orig)
        return replace(self, freq_factors=self.longrope[0 if long else 1], longrope_ctx=n_ctx)

    def describe(self) -> str:
        """'' for plain RoPE, else a few words: 'rope llama3 factors', 'rope yarn x4', ..."""
        if self.plain:
            return ""
        parts = []
        if self.longrope is not None:
            parts.append(
                f"longrope {'long' if self.longrope_long else 'short'} factors "
                f"(context {self.longrope_ctx} vs {self.n_ctx_orig})"
            )
        elif self.freq_factors is not None:
            parts.append("llama3 factors")
        if self.freq_scale != 1.0 or self.ext_factor:
            parts.append(f"{self.kind} x{1.0 / self.freq_scale:g}")
        if self.longrope is not None and self.attn_factor != 1.0:
            parts.append(f"attn factor {self.attn_factor:.4g}")
        return "rope " + ", ".join(parts)


# llama_context pads the context to 256 (GGML_PAD(n_ctx, 256)); with one sequence n_ctx_seq is
# that padded context
CTX_PAD = 256


def uses_long_factors(n_ctx: int, n_ctx_orig: int) -> bool:
    """llama_model::get_rope_factors: phi3's long factors when n_ctx_seq > n_ctx_orig_yarn,
    n_ctx_seq being the context padded to 256 (one sequence); else the short ones."""
    return -(-n_ctx // CTX_PAD) * CTX_PAD > n_ctx_orig


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    n_ctx: int
    rope_base: float
    rms_eps: float
    rope_neox: bool
    tied_embeddings: bool
    qkv_bias: bool
    rope_dim: int
    rope_scaling: RopeScaling = RopeScaling()
    qk_norm: bool = False
    # gemma3 (llama.cpp src/models/gemma3.cpp); the defaults are the llama graph, bit for bit
    embed_scale: float = 1.0  # the gathered embeddings times this (gemma: sqrtf(d_model))
    ffn_gelu: bool = False  # GeGLU: gelu(gate) * up, ggml's tanh GELU (its f16 table on f32)
    post_norms: bool = False  # RMSNorm of the attention / FFN output (post_attention_norm,
    # post_ffw_norm) before its residual add
    attn_scale: float = 0.0  # 0: softmax(q.k / sqrt(head_dim)); else q times this (after RoPE,
    # before the KV rounding) and an unscaled softmax, as gemma3's ggml_scale(Qcur) then kq 1.0
    sliding_window: int = 0  # n_swa: a local layer's query at p sees keys p - n_swa < j <= p
    swa_layers: tuple[bool, ...] = ()  # per layer: True = local (sliding window); () = none
    rope_base_swa: float = 10000.0  # the local layers' RoPE base (rope.freq_base_swa)
    swa_rope_scaled: bool = False  # the local layers keep the file's RoPE freq scale (gemma2:
    # rope_freq_scale_train_swa = rope_freq_scale_train); False: theirs is 1 (gemma3)
    logit_softcap: float = 0.0  # 0: none; else logits = cap * tanh(logits / cap)
    attn_softcap: float = 0.0  # 0: none; else attention scores = cap * tanh(scores / cap)
    # before the mask and softmax (gemma2: attn_logit_softcapping)
    # granite (minfer.families.granite): the scalars of llama.cpp's granite graph
    kq_scale: float = 0.0  # 0: the softmax scale 1/sqrt(head_dim); else this (attention.scale)
    residual_scale: float = 1.0  # the attention / FFN output times this before its residual add
    logit_mul: float = 1.0  # the logits times this (1 / logit_scale)
    # olmo2 (minfer.families.olmo2): post-norm layers, q/k norms over the whole projection
    pre_norms: bool = True  # attn_norm / ffn_norm before attention / the FFN (olmo2: none)
    qk_norm_full: bool = False  # qk_norm over all heads at once ([H D]), not per head
    rope_layers: tuple[bool, ...] = ()  # per layer: False = no RoPE (smollm3's every 4th
    # layer, granite's rope.scaling.finetuned false); () = every layer
    # mixture of experts (minfer.families.moe: qwen3moe, Mixtral); n_expert 0: a dense FFN
    n_expert: int = 0  # experts per layer (expert_count)
    n_expert_used: int = 0  # k: experts each token runs (expert_used_count)
    d_ff_exp: int = 0  # one expert's SwiGLU width
    moe_gating: str = "softmax"  # router logits -> probs (build_moe_ffn's gating_op)
    moe_norm_w: bool = True  # the k selected probs divided by their sum
    moe_w_scale: float = 0.0  # the weights times this (0 or 1: none)
    # qwen2moe: the shared expert's SwiGLU width (0: no shared expert), gated by
    # sigmoid(h . ffn_gate_inp_shexp) and added to the routed experts' sum
    d_ff_shexp: int = 0

    def for_context(self, n_ctx: int) -> ModelConfig:
        """The config of a run with context n_ctx (llama.cpp's -c): phi3's long / short RoPE
        factors chosen for it (RopeScaling.for_context); everything else the same. The loader
        chooses for the model's own context_length (llama.cpp's -c 0)."""
        sc = self.rope_scaling.for_context(n_ctx)
        return self if sc is self.rope_scaling else replace(self, rope_scaling=sc)

    def has_rope(self, il: int) -> bool:
        """Layer il rotates q and k (llama.cpp hparams.has_rope / smollm3's use_rope)."""
        return not self.rope_layers or self.rope_layers[il]

    def is_local(self, il: int) -> bool:
        """Layer il attends within the sliding window (llama.cpp hparams.is_swa)."""
        return self.sliding_window > 0 and bool(self.swa_layers) and self.swa_layers[il]

    def layer_rope(self, il: int) -> tuple[float, RopeScaling]:
        """(RoPE base, scaling) of layer il: a local layer has rope_base_swa and a freq scale of
        1 (llama.cpp get_rope_freq_base / get_rope_freq_scale: rope_freq_scale_train_swa), the
        rest of the scaling (YaRN's ext and attention factors) as the context resolved it;
        with swa_rope_scaled (gemma2) the file's freq scale as the global layers."""
        if not self.is_local(il):
            return self.rope_base, self.rope_scaling
        sc = self.rope_scaling
        if self.swa_rope_scaled or sc.freq_scale == 1.0:
            return self.rope_base_swa, sc
        return self.rope_base_swa, replace(sc, freq_scale=1.0)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # numpy order: [rows, cols]
    data: np.ndarray  # raw bytes/elements, a view into the memory map

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.qtype).name


def _show(v: Any) -> str:
    return show(v, 60)


def _kind(v: Any) -> str:
    return {bool: "a bool", str: "a string", float: "a float", list: "an array"}.get(
        type(v), type(v).__name__
    )


class GGUFModel:
    """An opened GGUF model: config, metadata, tensors (memory-mapped)."""

    def __init__(self, path: str | os.PathLike, strict: bool = True):
        """strict=False (`minfer inspect`): a metadata key or tensor minfer does not understand
        is recorded in self.refusal instead of raised, so the file can still be shown."""
        from minfer.gguf.header import open_gguf, tensor_view

        self.path = Path(path)
        self.header, self._map = open_gguf(self.path)  # validates every count/length/offset
        h = self.header
        # the same dict gguf.GGUFReader's fields give through .contents(), pseudo-keys included
        self.metadata: dict[str, Any] = {
            "GGUF.version": h.version,
            "GGUF.tensor_count": h.n_tensors,
            "GGUF.kv_count": h.n_kv,
        }
        for key, v in h.kv.items():
            if key in self.metadata:
                raise BadModel(f"{self.path}: metadata key {key!r} clashes with the header's")
            self.metadata[key] = v.value
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, t.qtype, t.shape, tensor_view(self._map, t))
            for t in h.tensors
        }
        self.config = self._config()  # type and range of every key: BadModel naming it
        c = self.config
        self._split_fused()
        if c.n_layers * (7 if c.n_expert else 9) > len(self.tensors):
            raise BadModel(
                f"{self.path}: {c.arch}.block_count = {c.n_layers} but the file has "
                f"only {len(self.tensors)} tensors"
            )
        expected = self._check_tensors()
        self.refusal: str | None = None
        from minfer.gguf.arch_keys import check_keys, check_tensor_names

        try:  # what minfer would otherwise silently ignore
            check_keys(self.path, c.arch, self.metadata)
            check_tensor_names(self.path, c.arch, expected, self.tensors)
        except Unsupported as e:
            if strict:
                raise
            self.refusal = str(e)

    @functools.cached_property
    def reader(self):
        """The `gguf` package's GGUFReader on the same file (the reference; slow to open)."""
        import gguf

        return gguf.GGUFReader(str(self.path), "r")

    # -- metadata -> config ---------------------------------------------------------------
    def _get(self, key: str, default: Any = None, required: bool = True) -> Any:
        if key in self.metadata:
            return self.metadata[key]
        if required and default is None:
            raise BadModel(f"{self.path}: metadata key {key!r} missing")
        return default

    def _int(
        self, key: str, default: int | None = None, lo: int = 1, hi: int = (1 << 31) - 1
    ) -> int:
        """An integer hyperparameter in [lo, hi]; a bool, float or string is refused (a GGUF
        integer type is what llama.cpp reads: `block_count = True` would run one layer)."""
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadModel(
                f"{self.path}: metadata key {key!r} = {_show(v)} must be an integer, not {_kind(v)}"
            )
        if not lo <= v <= hi:
            raise BadModel(f"{self.path}: metadata key {key!r} = {v} out of range [{lo}, {hi}]")
        return v

    def _float(self, key: str, default: float | None) -> float:
        """A positive finite float hyperparameter (ints accepted, bools and strings not).
        llama.cpp holds these as float32 and so does the forward: a value (a FLOAT64 or an
        integer key) that float32 turns into inf or 0 is refused too (a RoPE factor of 1e300
        would scale the angles by 0, a base of 1e-300 divide by 0)."""
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadModel(
                f"{self.path}: metadata key {key!r} = {_show(v)} must be a number, not {_kind(v)}"
            )
        if not (math.isfinite(v) and v > 0):
            raise BadModel(f"{self.path}: metadata key {key!r} = {v!r} must be finite and > 0")
        with np.errstate(over="ignore", under="ignore"):
            as_f32 = float(np.float32(v))
        if not 0 < as_f32 < math.inf:
            raise BadModel(
                f"{self.path}: metadata key {key!r} = {v!r} is out of float32's "
                "range (the hyperparameters are float32, as in llama.cpp)"
            )
        return float(v)

    # the readers a family's hparams use (minfer.families.schema.Family.hparams)
    def int_key(
        self, key: str, default: int | None = None, lo: int = 1, hi: int = (1 << 31) - 1
    ) -> int:
        return self._int(key, default, lo, hi)

    def float_key(self, key: str, default: float | None) -> float:
        return self._float(key, default)

    def _config(self) -> ModelConfig:
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise BadModel(f"{self.path}: metadata key 'general.architecture' missing")
        from minfer.families import family

        fam = family(arch, f"{self.path}: ")
        a = arch
        k_heads, k_kv = f"{a}.attention.head_count", f"{a}.attention.head_count_kv"
        d_model = self._int(f"{a}.embedding_length")
        n_heads = self._int(k_heads, hi=d_model)
        n_kv = self._int(k_kv, n_heads, hi=n_heads)
        if n_heads % n_kv:
            raise BadModel(
                f"{self.path}: metadata key {k_kv!r} = {n_kv} does not divide "
                f"{k_heads!r} = {n_heads} (grouped-query attention)"
            )
        k_hd = f"{a}.attention.key_length"
        if k_hd not in self.metadata and d_model % n_heads:
            raise BadModel(
                f"{self.path}: metadata key {k_heads!r} = {n_heads} does not divide "
                f"'{a}.embedding_length' = {d_model} (and no {k_hd!r} is given)"
            )
        head_dim = self._int(k_hd, d_model // n_heads, hi=1 << 16)
        k_vd = f"{a}.attention.value_length"
        if k_vd in self.metadata and self._int(k_vd, hi=1 << 16) != head_dim:
            raise BadModel(
                f"{self.path}: metadata key {k_vd!r} = {self.metadata[k_vd]} differs "
                f"from the key length {head_dim} (not supported)"
            )
        k_rd = f"{a}.rope.dimension_count"
        rope_dim = self._int(k_rd, head_dim, hi=head_dim)
        if rope_dim % 2:
            raise BadModel(
                f"{self.path}: metadata key {k_rd!r} = {rope_dim} must be even (RoPE rotates pairs)"
            )
        emb = self.tensors.get("token_embd.weight")
        if emb is None:
            raise BadModel(f"{self.path}: tensor 'token_embd.weight' missing")
        vocab = self._int(f"{a}.vocab_size", emb.shape[0])
        tied = "output.weight" not in self.tensors
        bias = "blk.0.attn_q.bias" in self.tensors
        n_ctx = self._int(f"{a}.context_length")
        n_layers = self._int(f"{a}.block_count", hi=1 << 16)
        # the fields only the family sets (minfer.families: its reader, llama.cpp's
        # load_arch_hparams)
        own = fam.hparams(
            self,
            a,
            {
                "n_layers": n_layers,
                "d_model": d_model,
                "n_heads": n_heads,
                "head_dim": head_dim,
                "rope_dim": rope_dim,
            },
        )
        return ModelConfig(
            arch=a,
            n_layers=n_layers,
            d_model=d_model,
            d_ff=self._int(f"{a}.feed_forward_length"),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            vocab_size=vocab,
            n_ctx=n_ctx,
            rope_base=self._float(f"{a}.rope.freq_base", 10000.0),
            rms_eps=self._float(f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
            tied_embeddings=tied,
            qkv_bias=bias,
            rope_dim=rope_dim,
            rope_scaling=self._rope_scaling(a, rope_dim, n_ctx),
            **own,
        )

    def _gemma(
        self, a: str, n_layers: int, d_model: int, n_heads: int, head_dim: int
    ) -> dict[str, Any]:
        """gemma's ModelConfig fields (minfer.families.gemma's reader, on this file)."""
        from minfer.families import family

        return family(a).hparams(
            self,
            a,
            {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "head_dim": head_dim},
        )

    def _rope_scaling(self, a: str, rope_dim: int, n_ctx: int) -> RopeScaling:
        """The file's RoPE scaling, resolved as llama.cpp's llama_context does (f32 math)."""
        f32 = np.float32
        kt = f"{a}.rope.scaling.type"
        kind = self.metadata.get(kt, "linear")  # llama.cpp's default when the key is absent
        if not isinstance(kind, str):
            raise BadModel(
                f"{self.path}: metadata key {kt!r} = {_show(kind)} must be a string, "
                f"not {_kind(kind)}"
            )
        if kind not in ("none", "linear", "yarn"):
            raise Unsupported(
                f"{self.path}: metadata key {kt!r} = {_show(kind)}: RoPE scaling "
                "type not implemented (supported: none, linear, yarn)"
            )
        kf = f"{a}.rope.scaling.factor"
        if kf not in self.metadata and f"{a}.rope.scale_linear" in self.metadata:
            kf = f"{a}.rope.scale_linear"  # the old key, as llama.cpp falls back to it
        factor = self.metadata.get(kf, 0.0)
        if factor != 0.0:  # 0 means "no scaling" to llama.cpp
            factor = self._float(kf, 1.0)
        freq_scale = f32(1.0) if factor == 0.0 or kind == "none" else f32(1.0) / f32(factor)
        ext = 1.0 if kind == "yarn" else 0.0
        attn = f32(1.0)
        if ext:  # llama_context: get_mscale(factor, 1), cancelled by ggml's own YaRN mscale
            fac = f32(1.0) / freq_scale
            attn = f32(1.0) if fac <= 1 else f32(f32(0.1) * np.log(fac) + f32(1.0))
            attn = attn * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(fac)))
        attn = f32(attn * f32(self._float(f"{a}.rope.scaling.attn_factor", 1.0)))
        n_orig = self._int(f"{a}.rope.scaling.original_context_length", n_ctx)
        sc = RopeScaling(
            kind=kind,
            freq_scale=float(freq_scale),
            ext_factor=ext,
            attn_factor=float(attn),
            n_ctx_orig=n_orig,
            freq_factors=self._freq_factors(rope_dim),
            longrope=self._longrope(a, rope_dim),
        )
        return sc.for_context(n_ctx)

    def _longrope(
        self, a: str, rope_dim: int
    ) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """phi3's rope_factors_long / rope_factors_short.weight (Phi-3-mini-128k, Phi-3.5-mini:
        HF's longrope long_factor / short_factor, written by convert_hf_to_gguf.py), both or
        neither. Another architecture's graph has no place for them: arch_keys refuses them."""
        names = ("rope_factors_long.weight", "rope_factors_short.weight")
        have = [n in self.tensors for n in names]
        from minfer.families import family

        if names[0] not in family(a).extra_tensors.get(a, {}) or not any(have):
            return None
        if not all(have):
            one, other = (names[0], names[1]) if have[0] else (names[1], names[0])
            raise BadModel(
                f"{self.path}: tensor {one!r} without {other!r} (phi3's long-context "
                "RoPE factors come as a pair)"
            )
        return self._factors(names[0], rope_dim), self._factors(names[1], rope_dim)

    def _freq_factors(self, rope_dim: int) -> tuple[float, ...] | None:
        """rope_freqs.weight (the llama3 factors): f32 [rope_dim/2], finite and > 0."""
        if "rope_freqs.weight" not in self.tensors:
            return None
        return self._factors("rope_freqs.weight", rope_dim)

    def _factors(self, name: str, rope_dim: int) -> tuple[float, ...]:
        """A RoPE frequency-factor tensor: f32 [rope_dim/2], finite and > 0."""
        t = self.tensors[name]
        if t.qtype != 0 or t.shape != (rope_dim // 2,):
            raise BadModel(
                f"{self.path}: tensor {name!r} is {t.type_name} {list(t.shape)}, "
                f"expected F32 [{rope_dim // 2}] (rope.dimension_count / 2)"
            )
        v = np.asarray(t.data, dtype=np.float32).reshape(-1)
        if not (np.isfinite(v).all() and (v > 0).all()):
            raise BadModel(
                f"{self.path}: tensor {name!r} holds values that are not finite "
                "and > 0 (RoPE frequency factors divide the angle)"
            )
        return tuple(float(x) for x in v)

    def _check_tensors(self) -> set[str]:
        """BadModel/Unsupported for a missing tensor, a wrong shape or type; -> the names of
        the tensors the graph uses (arch_keys.EXTRA_TENSORS aside)."""
        from minfer.quants import traits_of

        c = self.config
        a = c.arch
        # which metadata keys fix each dimension, named when a tensor disagrees with them
        kd, kv = f"{a}.embedding_length", f"{a}.vocab_size"
        want: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
            "token_embd.weight": ((c.vocab_size, c.d_model), (kv, kd)),
            "output_norm.weight": ((c.d_model,), (kd,)),
        }
        if not c.tied_embeddings:
            want["output.weight"] = ((c.vocab_size, c.d_model), (kv, kd))
        from minfer.families import schema_of
        from minfer.families.schema import DIM_KEYS

        sch = schema_of(c)
        for i in range(c.n_layers):  # the family's layer schema: names, shapes, their keys
            for t in sch.tensors:
                want[t.full(i)] = (
                    sch.shape(t, c),
                    tuple(
                        " + ".join(DIM_KEYS[x].format(a=a) for x in d.split("+")) for d in t.shape
                    ),
                )
        for name, (shape, keys) in want.items():
            t = self.tensors.get(name)
            if t is None:
                raise BadModel(f"{self.path}: tensor {name!r} missing")
            if len(shape) == 1 and t.shape == (1, shape[0]):  # ggml's ne [n, 1] is [n] to
                # llama.cpp's shape check (qwen2moe's ffn_gate_inp_shexp as HF's [1, d])
                t = self.tensors[name] = TensorInfo(name, t.qtype, shape, t.data.reshape(-1))
            if t.shape != shape:
                why = ", ".join(f"{k} = {n}" for k, n in zip(keys, shape) if k)
                raise BadModel(
                    f"{self.path}: tensor {name!r} has shape {list(t.shape)}, "
                    f"expected {list(shape)} from the metadata ({why})"
                )
            traits_of(t.qtype, where=f"{self.path}: tensor {name!r}")  # raises Unsupported
        # a layer's tensors beyond block_count would be silently skipped
        for name in self.tensors:
            m = _BLK.match(name)
            if m and int(m.group(1)) >= c.n_layers:
                raise BadModel(
                    f"{self.path}: tensor {name!r} lies beyond the metadata's "
                    f"'{a}.block_count' = {c.n_layers}"
                )
        return set(want)

    def _split_fused(self) -> None:
        """Fused weights (the schema's file_fused: phi3's) as the schema's members, row views
        of the file's bytes (no copy; llama.cpp's create_tensor_qkv reads either form): e.g.
        attn_qkv [(H + 2 Hkv) D, d] -> attn_q, attn_k, attn_v; ffn_up [2 ff, d] without an
        ffn_gate -> ffn_gate (the first ff rows, the gate half of ggml_swiglu's LLM_FFN_SEQ
        split) and ffn_up (the rest). A fused tensor is read where its first member is absent."""
        from minfer.families import schema_of

        c = self.config
        sch = schema_of(c)
        if not sch.file_fused:
            return
        spec = {t.name.split(".")[0]: t for t in sch.tensors}
        for i in range(c.n_layers):
            p = f"blk.{i}."
            for f in sch.file_fused:
                if p + f.name not in self.tensors or p + f.members[0] + ".weight" in self.tensors:
                    continue
                split = [(m, sch.shape(spec[m], c)[0]) for m in f.members]
                rows = sum(n for _, n in split)
                t = self.tensors.pop(p + f.name)
                if len(t.shape) != 2 or t.shape[0] != rows:
                    raise BadModel(
                        f"{self.path}: tensor {t.name!r} has shape {list(t.shape)}, "
                        f"expected {rows} rows (the fused {f.name.split('.')[0]} of "
                        "the metadata's heads and feed_forward_length)"
                    )
                r0 = 0
                for m, nr in split:
                    name = p + m + ".weight"
                    self.tensors[name] = TensorInfo(
                        name, t.qtype, (nr, t.shape[1]), t.data[r0 : r0 + nr]
                    )
                    r0 += nr

    # -- tensors --------------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise BadModel(f"{self.path}: tensor {name!r} missing") from None

    def dequant(self, name: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Reference dequantization (the `gguf` package's) to float32, [rows, cols].

        rows: optional row selection (e.g. token ids for an embedding gather), so a large
        table is never dequantized whole when a few rows are needed.
        """
        from minfer.quants import dequantize

        t = self.tensor(name)
        data = t.data
        if rows is not None:
            data = data.reshape(t.shape[0], -1)[rows] if len(t.shape) == 2 else data[rows]
        return dequantize(data, t.qtype)

    @property
    def output_name(self) -> str:
        return "token_embd.weight" if self.config.tied_embeddings else "output.weight"

    def describe(self) -> str:
        c = self.config
        rope = c.rope_scaling.describe()
        swa = ""
        if c.sliding_window:
            swa = (
                f", sliding window {c.sliding_window} on {sum(c.swa_layers)} of "
                f"{plural(c.n_layers, 'layer')}"
            )
        return (
            f"{self.path.name}: {c.arch}, {plural(c.n_layers, 'layer')}, d={c.d_model}, "
            f"ff={c.d_ff}, "
            f"heads {c.n_heads}:{c.n_kv_heads}, vocab {c.vocab_size}"
            + (f", {rope}" if rope else "")
            + swa
            + self.describe_experts()
        )

    def describe_experts(self) -> str:
        """', experts 128 x ff 768, 8 used per token (softmax, top-k renormalized)' or ''."""
        c = self.config
        if not c.n_expert:
            return ""
        norm = ", top-k renormalized" if c.moe_norm_w else ""
        scale = f", x{c.moe_w_scale:g}" if c.moe_w_scale not in (0.0, 1.0) else ""
        shared = f", a sigmoid-gated shared expert of ff {c.d_ff_shexp}" if c.d_ff_shexp else ""
        return (
            f", experts {c.n_expert} x ff {c.d_ff_exp}, {c.n_expert_used} used per token "
            f"({c.moe_gating}{norm}{scale}){shared}"
        )


def load_model(path: str | os.PathLike, strict: bool = True) -> GGUFModel:
    return GGUFModel(path, strict)
