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
from minfer.gguf.arch_keys import show
from minfer.host.words import plural

_BLK = re.compile(r"blk\.(\d+)\.")

# Architectures whose graph is the llama one (RMSNorm, RoPE, GQA attention, SwiGLU) or a small
# variation of it. rope_neox: rotate halves (NEOX) instead of adjacent pairs (llama.cpp
# LLAMA_ROPE_TYPE_NORM); qk_norm: an RMSNorm over each head of q and k before RoPE (attn_q_norm,
# attn_k_norm [head_dim]); gemma: llama.cpp's gemma3 graph (src/models/gemma3.cpp): embeddings
# times sqrt(d_model), post-attention and post-FFN norms, GeGLU, q pre-scaled, sliding-window
# layers with their own RoPE base, optional final logit soft-cap (ModelConfig's gemma fields);
# gemma2 (src/models/gemma2.cpp) is the same graph without the q/k norms, with attention and
# final logit soft-capping and every other layer local (GGUFModel._gemma).
_ARCHS = {"llama": {"rope_neox": False, "qk_norm": False, "gemma": False},
          "qwen2": {"rope_neox": True, "qk_norm": False, "gemma": False},
          "qwen3": {"rope_neox": True, "qk_norm": True, "gemma": False},
          "gemma2": {"rope_neox": True, "qk_norm": False, "gemma": True},
          "gemma3": {"rope_neox": True, "qk_norm": True, "gemma": True},
          # llama's graph on fused weights (attn_qkv, gate|up in ffn_up): _split_fused
          "phi3": {"rope_neox": True, "qk_norm": False, "gemma": False}}
_FUSED_ARCHS = ("phi3",)


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
        return (self.freq_scale == 1.0 and self.ext_factor == 0.0 and self.attn_factor == 1.0
                and self.freq_factors is None)

    @property
    def longrope_long(self) -> bool:
        """phi3: the long factors are the ones in use (False: the short ones, or none)."""
        return self.longrope is not None and uses_long_factors(self.longrope_ctx,
                                                               self.n_ctx_orig)

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
            parts.append(f"longrope {'long' if self.longrope_long else 'short'} factors "
                         f"(context {self.longrope_ctx} vs {self.n_ctx_orig})")
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

    def for_context(self, n_ctx: int) -> ModelConfig:
        """The config of a run with context n_ctx (llama.cpp's -c): phi3's long / short RoPE
        factors chosen for it (RopeScaling.for_context); everything else the same. The loader
        chooses for the model's own context_length (llama.cpp's -c 0)."""
        sc = self.rope_scaling.for_context(n_ctx)
        return self if sc is self.rope_scaling else replace(self, rope_scaling=sc)

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
        type(v), type(v).__name__)


def _layer_tensor_names(i: int, cfg_bias: bool) -> list[str]:
    names = [f"blk.{i}.{n}.weight" for n in (
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    if cfg_bias:
        names += [f"blk.{i}.{n}.bias" for n in ("attn_q", "attn_k", "attn_v")]
    return names


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
        self.metadata: dict[str, Any] = {"GGUF.version": h.version,
                                         "GGUF.tensor_count": h.n_tensors,
                                         "GGUF.kv_count": h.n_kv}
        for key, v in h.kv.items():
            if key in self.metadata:
                raise BadModel(f"{self.path}: metadata key {key!r} clashes with the header's")
            self.metadata[key] = v.value
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, t.qtype, t.shape, tensor_view(self._map, t))
            for t in h.tensors}
        self.config = self._config()  # type and range of every key: BadModel naming it
        c = self.config
        if c.arch in _FUSED_ARCHS:
            self._split_fused()
        if c.n_layers * 9 > len(self.tensors):
            raise BadModel(f"{self.path}: {c.arch}.block_count = {c.n_layers} but the file has "
                           f"only {len(self.tensors)} tensors")
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

    def _int(self, key: str, default: int | None = None, lo: int = 1,
             hi: int = (1 << 31) - 1) -> int:
        """An integer hyperparameter in [lo, hi]; a bool, float or string is refused (a GGUF
        integer type is what llama.cpp reads: `block_count = True` would run one layer)."""
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadModel(f"{self.path}: metadata key {key!r} = {_show(v)} must be an integer, "
                           f"not {_kind(v)}")
        if not lo <= v <= hi:
            raise BadModel(f"{self.path}: metadata key {key!r} = {v} out of range [{lo}, {hi}]")
        return v

    def _float(self, key: str, default: float) -> float:
        """A positive finite float hyperparameter (ints accepted, bools and strings not).
        llama.cpp holds these as float32 and so does the forward: a value (a FLOAT64 or an
        integer key) that float32 turns into inf or 0 is refused too (a RoPE factor of 1e300
        would scale the angles by 0, a base of 1e-300 divide by 0)."""
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadModel(f"{self.path}: metadata key {key!r} = {_show(v)} must be a number, "
                           f"not {_kind(v)}")
        if not (math.isfinite(v) and v > 0):
            raise BadModel(f"{self.path}: metadata key {key!r} = {v!r} must be finite and > 0")
        with np.errstate(over="ignore", under="ignore"):
            as_f32 = float(np.float32(v))
        if not 0 < as_f32 < math.inf:
            raise BadModel(f"{self.path}: metadata key {key!r} = {v!r} is out of float32's "
                           "range (the hyperparameters are float32, as in llama.cpp)")
        return float(v)

    def _config(self) -> ModelConfig:
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise BadModel(f"{self.path}: metadata key 'general.architecture' missing")
        if arch not in _ARCHS:
            raise Unsupported(f"{self.path}: unsupported architecture {_show(arch)} "
                              f"(supported: {', '.join(_ARCHS)})")
        a = arch
        k_heads, k_kv = f"{a}.attention.head_count", f"{a}.attention.head_count_kv"
        d_model = self._int(f"{a}.embedding_length")
        n_heads = self._int(k_heads, hi=d_model)
        n_kv = self._int(k_kv, n_heads, hi=n_heads)
        if n_heads % n_kv:
            raise BadModel(f"{self.path}: metadata key {k_kv!r} = {n_kv} does not divide "
                           f"{k_heads!r} = {n_heads} (grouped-query attention)")
        k_hd = f"{a}.attention.key_length"
        if k_hd not in self.metadata and d_model % n_heads:
            raise BadModel(f"{self.path}: metadata key {k_heads!r} = {n_heads} does not divide "
                           f"'{a}.embedding_length' = {d_model} (and no {k_hd!r} is given)")
        head_dim = self._int(k_hd, d_model // n_heads, hi=1 << 16)
        k_vd = f"{a}.attention.value_length"
        if k_vd in self.metadata and self._int(k_vd, hi=1 << 16) != head_dim:
            raise BadModel(f"{self.path}: metadata key {k_vd!r} = {self.metadata[k_vd]} differs "
                           f"from the key length {head_dim} (not supported)")
        k_rd = f"{a}.rope.dimension_count"
        rope_dim = self._int(k_rd, head_dim, hi=head_dim)
        if rope_dim % 2:
            raise BadModel(f"{self.path}: metadata key {k_rd!r} = {rope_dim} must be even "
                           "(RoPE rotates pairs)")
        emb = self.tensors.get("token_embd.weight")
        if emb is None:
            raise BadModel(f"{self.path}: tensor 'token_embd.weight' missing")
        vocab = self._int(f"{a}.vocab_size", emb.shape[0])
        tied = "output.weight" not in self.tensors
        bias = "blk.0.attn_q.bias" in self.tensors
        n_ctx = self._int(f"{a}.context_length")
        n_layers = self._int(f"{a}.block_count", hi=1 << 16)
        gemma = self._gemma(a, n_layers, d_model, n_heads, head_dim) if _ARCHS[a]["gemma"] \
            else self._mistral_window(a, n_layers)
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
            rope_neox=_ARCHS[a]["rope_neox"],
            tied_embeddings=tied,
            qkv_bias=bias,
            rope_dim=rope_dim,
            rope_scaling=self._rope_scaling(a, rope_dim, n_ctx),
            qk_norm=_ARCHS[a]["qk_norm"],
            **gemma,
        )

    def _mistral_window(self, a: str, n_layers: int) -> dict[str, Any]:
        """A llama file's attention.sliding_window (Mistral 7B v0.1: 4096): every layer local,
        on the model's own RoPE, as HF's MistralAttention applies it. llama.cpp's llama graph
        ignores the key (full attention): the two agree up to the window's width, past it
        minfer follows the model (docs/families.md)."""
        kw = f"{a}.attention.sliding_window"
        if a != "llama" or kw not in self.metadata:
            return {}
        n_swa = self._int(kw, lo=0)
        if n_swa == 0:
            return {}
        if not self._rope_plain(a):
            raise Unsupported(f"{self.path}: metadata key {kw!r} = {n_swa} with RoPE scaling: "
                              "a sliding window over scaled RoPE is not implemented")
        return {"sliding_window": n_swa, "swa_layers": (True,) * n_layers,
                "rope_base_swa": self._float(f"{a}.rope.freq_base", 10000.0)}

    def _rope_plain(self, a: str) -> bool:
        """No RoPE scaling key and no frequency factors in the file."""
        return ("rope_freqs.weight" not in self.tensors and
                not any(k.startswith(f"{a}.rope.scaling.") and k != f"{a}.rope.scaling.finetuned"
                        for k in self.metadata))

    def _gemma(self, a: str, n_layers: int, d_model: int, n_heads: int,
               head_dim: int) -> dict[str, Any]:
        """The gemma ModelConfig fields, read as llama.cpp's load_arch_hparams does:
        llama_model_gemma3's for gemma3, llama_model_gemma2's for gemma2."""
        f32 = np.float32
        g2 = a == "gemma2"
        # gemma_pytorch: query_pre_attn_scalar; llama.cpp by model type: the 27B (gemma3: 62
        # layers, gemma2: 46) 1/sqrt(n_embd / n_head) (integer division), else 1/sqrt(head_dim),
        # in float
        big = n_layers == (46 if g2 else 62)
        out: dict[str, Any] = {
            "embed_scale": float(np.sqrt(f32(d_model))),  # sqrtf(n_embd)
            "ffn_gelu": True, "post_norms": True,
            "attn_scale": float(f32(1.0) / np.sqrt(f32(d_model // n_heads if big else head_dim))),
        }
        kw = f"{a}.attention.sliding_window"
        if g2:  # always LLAMA_SWA_TYPE_STANDARD, n_swa 4096 unless the file says (0 would mask
            # every key of a local layer: refused)
            n_swa = self._int(kw, 4096, lo=1)
        else:  # the window only with a key > 0 (else LLAMA_SWA_TYPE_NONE)
            n_swa = self._int(kw, lo=0) if kw in self.metadata else 0
        if n_swa > 0:  # load_swa_pattern(ml, 6 / 2), dense_first false
            kp = f"{a}.attention.sliding_window_pattern"
            n_pat = 2 if g2 else 6
            pat = self.metadata.get(kp, n_pat)
            if isinstance(pat, list):  # per-layer flags (bool or integer; missing: global)
                if not all(isinstance(x, int) for x in pat) or len(pat) > 512:
                    raise BadModel(f"{self.path}: metadata key {kp!r} = {_show(pat)} must be "
                                   "an integer or an array of at most 512 bools/integers")
                flags = tuple(bool(pat[i]) if i < len(pat) else False
                              for i in range(n_layers))
            else:
                n = self._int(kp, lo=0) if kp in self.metadata else n_pat
                flags = tuple(n == 0 or i % n < n - 1 for i in range(n_layers))
            # gemma3: the local base defaults to 10000, the local freq scale is 1; gemma2: both
            # default to the global ones (rope_freq_base_train_swa = rope_freq_base_train)
            base_swa = self._float(f"{a}.rope.freq_base", 10000.0) if g2 else 10000.0
            out |= {"sliding_window": n_swa, "swa_layers": flags, "swa_rope_scaled": g2,
                    "rope_base_swa": self._float(f"{a}.rope.freq_base_swa", base_swa)}
        kc = f"{a}.final_logit_softcapping"
        if g2:  # both caps always on (llama_hparams' defaults 30 and 50 when absent); 0 would
            # divide by zero in llama.cpp's graph: refused by _float
            out["logit_softcap"] = float(f32(self._float(kc, 30.0)))
            out["attn_softcap"] = float(f32(self._float(f"{a}.attn_logit_softcapping", 50.0)))
            return out
        cap = self.metadata.get(kc, 0.0)
        if cap != 0.0:  # 0 (or absent): no soft-cap, as llama.cpp's `if (f_final_...)`
            cap = self._float(kc, 0.0)
        out["logit_softcap"] = float(f32(cap))
        return out

    def _rope_scaling(self, a: str, rope_dim: int, n_ctx: int) -> RopeScaling:
        """The file's RoPE scaling, resolved as llama.cpp's llama_context does (f32 math)."""
        f32 = np.float32
        kt = f"{a}.rope.scaling.type"
        kind = self.metadata.get(kt, "linear")  # llama.cpp's default when the key is absent
        if not isinstance(kind, str):
            raise BadModel(f"{self.path}: metadata key {kt!r} = {_show(kind)} must be a string, "
                           f"not {_kind(kind)}")
        if kind not in ("none", "linear", "yarn"):
            raise Unsupported(f"{self.path}: metadata key {kt!r} = {_show(kind)}: RoPE scaling "
                              "type not implemented (supported: none, linear, yarn)")
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
        sc = RopeScaling(kind=kind, freq_scale=float(freq_scale), ext_factor=ext,
                         attn_factor=float(attn), n_ctx_orig=n_orig,
                         freq_factors=self._freq_factors(rope_dim),
                         longrope=self._longrope(a, rope_dim))
        return sc.for_context(n_ctx)

    def _longrope(self, a: str, rope_dim: int
                  ) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """phi3's rope_factors_long / rope_factors_short.weight (Phi-3-mini-128k, Phi-3.5-mini:
        HF's longrope long_factor / short_factor, written by convert_hf_to_gguf.py), both or
        neither. Another architecture's graph has no place for them: arch_keys refuses them."""
        names = ("rope_factors_long.weight", "rope_factors_short.weight")
        have = [n in self.tensors for n in names]
        if a != "phi3" or not any(have):
            return None
        if not all(have):
            one, other = (names[0], names[1]) if have[0] else (names[1], names[0])
            raise BadModel(f"{self.path}: tensor {one!r} without {other!r} (phi3's long-context "
                           "RoPE factors come as a pair)")
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
            raise BadModel(f"{self.path}: tensor {name!r} is {t.type_name} {list(t.shape)}, "
                           f"expected F32 [{rope_dim // 2}] (rope.dimension_count / 2)")
        v = np.asarray(t.data, dtype=np.float32).reshape(-1)
        if not (np.isfinite(v).all() and (v > 0).all()):
            raise BadModel(f"{self.path}: tensor {name!r} holds values that are not finite "
                           "and > 0 (RoPE frequency factors divide the angle)")
        return tuple(float(x) for x in v)

    def _check_tensors(self) -> set[str]:
        """BadModel/Unsupported for a missing tensor, a wrong shape or type; -> the names of
        the tensors the graph uses (arch_keys.EXTRA_TENSORS aside)."""
        from minfer.quants import traits_of

        c = self.config
        a = c.arch
        hd = c.head_dim
        # which metadata keys fix each dimension, named when a tensor disagrees with them
        kd, kf, kv = f"{a}.embedding_length", f"{a}.feed_forward_length", f"{a}.vocab_size"
        kq = f"{a}.attention.head_count x head_dim"
        kk = f"{a}.attention.head_count_kv x head_dim"
        want: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
            "token_embd.weight": ((c.vocab_size, c.d_model), (kv, kd)),
            "output_norm.weight": ((c.d_model,), (kd,)),
        }
        if not c.tied_embeddings:
            want["output.weight"] = ((c.vocab_size, c.d_model), (kv, kd))
        for i in range(c.n_layers):
            p = f"blk.{i}."
            want.update({
                p + "attn_norm.weight": ((c.d_model,), (kd,)),
                p + "attn_q.weight": ((c.n_heads * hd, c.d_model), (kq, kd)),
                p + "attn_k.weight": ((c.n_kv_heads * hd, c.d_model), (kk, kd)),
                p + "attn_v.weight": ((c.n_kv_heads * hd, c.d_model), (kk, kd)),
                p + "attn_output.weight": ((c.d_model, c.n_heads * hd), (kd, kq)),
                p + "ffn_norm.weight": ((c.d_model,), (kd,)),
                p + "ffn_gate.weight": ((c.d_ff, c.d_model), (kf, kd)),
                p + "ffn_up.weight": ((c.d_ff, c.d_model), (kf, kd)),
                p + "ffn_down.weight": ((c.d_model, c.d_ff), (kd, kf)),
            })
            if c.post_norms:
                want[p + "post_attention_norm.weight"] = ((c.d_model,), (kd,))
                want[p + "post_ffw_norm.weight"] = ((c.d_model,), (kd,))
            if c.qk_norm:
                want[p + "attn_q_norm.weight"] = ((hd,), (f"{a}.attention.key_length",))
                want[p + "attn_k_norm.weight"] = ((hd,), (f"{a}.attention.key_length",))
            if c.qkv_bias:
                want[p + "attn_q.bias"] = ((c.n_heads * hd,), (kq,))
                want[p + "attn_k.bias"] = ((c.n_kv_heads * hd,), (kk,))
                want[p + "attn_v.bias"] = ((c.n_kv_heads * hd,), (kk,))
        for name, (shape, keys) in want.items():
            t = self.tensors.get(name)
            if t is None:
                raise BadModel(f"{self.path}: tensor {name!r} missing")
            if t.shape != shape:
                why = ", ".join(f"{k} = {n}" for k, n in zip(keys, shape) if k)
                raise BadModel(f"{self.path}: tensor {name!r} has shape {list(t.shape)}, "
                               f"expected {list(shape)} from the metadata ({why})")
            traits_of(t.qtype, where=f"{self.path}: tensor {name!r}")  # raises Unsupported
        # a layer's tensors beyond block_count would be silently skipped
        for name in self.tensors:
            m = _BLK.match(name)
            if m and int(m.group(1)) >= c.n_layers:
                raise BadModel(f"{self.path}: tensor {name!r} lies beyond the metadata's "
                               f"'{a}.block_count' = {c.n_layers}")
        return set(want)

    def _split_fused(self) -> None:
        """Fused weights as the llama set, row views of the file's bytes (no copy; llama.cpp's
        create_tensor_qkv reads either form): attn_qkv [(H + 2 Hkv) D, d] -> attn_q, attn_k,
        attn_v; ffn_up [2 ff, d] without an ffn_gate -> ffn_gate (the first ff rows, the gate
        half of ggml_swiglu's LLM_FFN_SEQ split) and ffn_up (the rest)."""
        c = self.config
        qd, kd, ff = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.d_ff
        for i in range(c.n_layers):
            p = f"blk.{i}."
            parts = []
            if p + "attn_qkv.weight" in self.tensors:
                parts.append(("attn_qkv", qd + 2 * kd, (("attn_q", 0, qd), ("attn_k", qd, kd),
                                                        ("attn_v", qd + kd, kd))))
            if p + "ffn_up.weight" in self.tensors and p + "ffn_gate.weight" not in self.tensors:
                parts.append(("ffn_up", 2 * ff, (("ffn_gate", 0, ff), ("ffn_up", ff, ff))))
            for fused, rows, split in parts:
                t = self.tensors.pop(p + fused + ".weight")
                if len(t.shape) != 2 or t.shape[0] != rows:
                    raise BadModel(f"{self.path}: tensor {t.name!r} has shape {list(t.shape)}, "
                                   f"expected {rows} rows (the fused {fused} of the metadata's "
                                   "heads and feed_forward_length)")
                for n, r0, nr in split:
                    name = p + n + ".weight"
                    self.tensors[name] = TensorInfo(name, t.qtype, (nr, t.shape[1]),
                                                    t.data[r0: r0 + nr])

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
            swa = (f", sliding window {c.sliding_window} on {sum(c.swa_layers)} of "
                   f"{plural(c.n_layers, 'layer')}")
        return (f"{self.path.name}: {c.arch}, {plural(c.n_layers, 'layer')}, d={c.d_model}, "
                f"ff={c.d_ff}, "
                f"heads {c.n_heads}:{c.n_kv_heads}, vocab {c.vocab_size}"
                + (f", {rope}" if rope else "") + swa)


def load_model(path: str | os.PathLike, strict: bool = True) -> GGUFModel:
    return GGUFModel(path, strict)
