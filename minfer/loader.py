"""GGUF model loading: metadata -> ModelConfig, tensors memory-mapped, reference dequant.

The header is validated and parsed in one pass by minfer.gguf_header (fast: no numpy object
per metadata item); the file is memory-mapped once, read-only, and each tensor's data is a numpy
view into that map, only read when dequantized. Metadata and tensor data are what the `gguf`
package's GGUFReader gives (tests/test_loader.py holds us to it); `GGUFModel.reader` opens that
reference reader on demand (slow: seconds on a 49k vocab). Shapes are given the numpy way
([rows, cols] = [ne1, ne0]); a 2-D weight W of a linear layer y = x @ W.T has shape [N, K].
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import BadModel, Unsupported

# Architectures whose graph is the llama one (RMSNorm, RoPE, GQA attention, SwiGLU).
# rope_neox: rotate halves (NEOX) instead of adjacent pairs (llama.cpp LLAMA_ROPE_TYPE_NORM).
_ARCHS = {"llama": {"rope_neox": False}, "qwen2": {"rope_neox": True}}


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


def _layer_tensor_names(i: int, cfg_bias: bool) -> list[str]:
    names = [f"blk.{i}.{n}.weight" for n in (
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    if cfg_bias:
        names += [f"blk.{i}.{n}.bias" for n in ("attn_q", "attn_k", "attn_v")]
    return names


class GGUFModel:
    """An opened GGUF model: config, metadata, tensors (memory-mapped)."""

    def __init__(self, path: str | os.PathLike):
        from minfer.gguf_header import open_gguf, tensor_view

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
        try:
            self.config = self._config()
        except (TypeError, ValueError, OverflowError) as e:  # e.g. a string where a count goes
            raise BadModel(f"{self.path}: bad hyperparameter in metadata ({e})") from None
        # sanity bounds before anything loops over layers (a damaged block_count of 2^32
        # would otherwise build billions of expected tensor names)
        c = self.config
        for what, v in (("block_count", c.n_layers), ("embedding_length", c.d_model),
                        ("feed_forward_length", c.d_ff), ("head_dim", c.head_dim),
                        ("vocab_size", c.vocab_size)):
            if not 0 < v < 1 << 31:
                raise BadModel(f"{self.path}: {c.arch}.{what} = {v} out of range")
        if c.n_layers * 9 > len(self.tensors):
            raise BadModel(f"{self.path}: {c.arch}.block_count = {c.n_layers} but the file has "
                           f"only {len(self.tensors)} tensors")
        self._check_tensors()

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

    def _config(self) -> ModelConfig:
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise BadModel(f"{self.path}: metadata key 'general.architecture' missing")
        if arch not in _ARCHS:
            raise Unsupported(
                f"{self.path}: unsupported architecture {arch!r} (supported: {', '.join(_ARCHS)})")
        a = arch
        d_model = int(self._get(f"{a}.embedding_length"))
        n_heads = int(self._get(f"{a}.attention.head_count"))
        n_kv = int(self._get(f"{a}.attention.head_count_kv", n_heads))
        if n_heads <= 0 or n_kv <= 0 or n_heads % n_kv or d_model % n_heads:
            raise BadModel(f"{self.path}: bad head counts {n_heads}/{n_kv} for width {d_model}")
        head_dim = int(self._get(f"{a}.attention.key_length", d_model // n_heads))
        emb = self.tensors.get("token_embd.weight")
        if emb is None:
            raise BadModel(f"{self.path}: tensor 'token_embd.weight' missing")
        vocab = int(self._get(f"{a}.vocab_size", emb.shape[0]))
        tied = "output.weight" not in self.tensors
        bias = "blk.0.attn_q.bias" in self.tensors
        return ModelConfig(
            arch=a,
            n_layers=int(self._get(f"{a}.block_count")),
            d_model=d_model,
            d_ff=int(self._get(f"{a}.feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            vocab_size=vocab,
            n_ctx=int(self._get(f"{a}.context_length")),
            rope_base=float(self._get(f"{a}.rope.freq_base", 10000.0)),
            rms_eps=float(self._get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_neox=_ARCHS[a]["rope_neox"],
            tied_embeddings=tied,
            qkv_bias=bias,
            rope_dim=int(self._get(f"{a}.rope.dimension_count", head_dim)),
        )

    def _check_tensors(self) -> None:
        from minfer.quants import traits_of

        c = self.config
        hd = c.head_dim
        want = {
            "token_embd.weight": (c.vocab_size, c.d_model),
            "output_norm.weight": (c.d_model,),
        }
        if not c.tied_embeddings:
            want["output.weight"] = (c.vocab_size, c.d_model)
        for i in range(c.n_layers):
            p = f"blk.{i}."
            want.update({
                p + "attn_norm.weight": (c.d_model,),
                p + "attn_q.weight": (c.n_heads * hd, c.d_model),
                p + "attn_k.weight": (c.n_kv_heads * hd, c.d_model),
                p + "attn_v.weight": (c.n_kv_heads * hd, c.d_model),
                p + "attn_output.weight": (c.d_model, c.n_heads * hd),
                p + "ffn_norm.weight": (c.d_model,),
                p + "ffn_gate.weight": (c.d_ff, c.d_model),
                p + "ffn_up.weight": (c.d_ff, c.d_model),
                p + "ffn_down.weight": (c.d_model, c.d_ff),
            })
            if c.qkv_bias:
                want[p + "attn_q.bias"] = (c.n_heads * hd,)
                want[p + "attn_k.bias"] = (c.n_kv_heads * hd,)
                want[p + "attn_v.bias"] = (c.n_kv_heads * hd,)
        for name, shape in want.items():
            t = self.tensors.get(name)
            if t is None:
                raise BadModel(f"{self.path}: tensor {name!r} missing")
            if t.shape != shape:
                raise BadModel(f"{self.path}: tensor {name!r} has shape {list(t.shape)}, "
                               f"expected {list(shape)}")
            traits_of(t.qtype, where=f"{self.path}: tensor {name!r}")  # raises Unsupported

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
        return (f"{self.path.name}: {c.arch}, {c.n_layers} layers, d={c.d_model}, ff={c.d_ff}, "
                f"heads {c.n_heads}:{c.n_kv_heads}, vocab {c.vocab_size}")


def load_model(path: str | os.PathLike) -> GGUFModel:
    return GGUFModel(path)
