"""Seed corpus for the GGUF fuzz tests: tiny, valid, llama-shaped models (a few KB each).

Deterministic (fixed seeds). `python tests/fuzz_corpus/make_corpus.py DIR` writes them to DIR;
the fuzz tests call `make_corpus(dir)` on a temp dir. Each seed loads with minfer.gguf.loader and
varies what the header holds: tensor types (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K),
custom alignment, tokenizer arrays (strings, int32 token types, float scores), nested arrays,
biases (qwen2), an output head.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SEEDS = ["llama_q8_f16", "llama_mixed_align64", "qwen2_bias_kquant", "llama_spm_vocab"]


def _tensor(w, rng, name: str, shape: tuple[int, ...], qtype) -> None:
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float16))
    else:
        block, bsize = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = shape
        raw = rng.integers(0, 256, size=(rows, cols // block * bsize), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qtype)  # byte shape [rows, row bytes]


def write_seed(path: Path, kind: str) -> Path:
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(SEEDS.index(kind))
    cfg = {
        "llama_q8_f16": dict(
            arch="llama",
            layers=1,
            d=32,
            ff=64,
            heads=2,
            kv=1,
            vocab=16,
            mat=Q.Q8_0,
            down=Q.F16,
            emb=Q.Q8_0,
            out=None,
            align=None,
        ),
        "llama_mixed_align64": dict(
            arch="llama",
            layers=2,
            d=64,
            ff=96,
            heads=4,
            kv=2,
            vocab=24,
            mat=Q.Q4_0,
            down=Q.Q5_0,
            emb=Q.Q4_1,
            out=Q.Q8_0,
            align=64,
        ),
        "qwen2_bias_kquant": dict(
            arch="qwen2",
            layers=1,
            d=32,
            ff=256,
            heads=2,
            kv=2,
            vocab=12,
            mat=Q.Q8_0,
            down=Q.Q4_K,
            emb=Q.F16,
            out=Q.Q5_1,
            align=None,
        ),
        "llama_spm_vocab": dict(
            arch="llama",
            layers=1,
            d=32,
            ff=32,
            heads=1,
            kv=1,
            vocab=20,
            mat=Q.F16,
            down=Q.F32,
            emb=Q.F32,
            out=None,
            align=16,
        ),
    }[kind]
    a, d, ff, h, kv, V = cfg["arch"], cfg["d"], cfg["ff"], cfg["heads"], cfg["kv"], cfg["vocab"]
    hd = d // h
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(f"fuzz-seed-{kind}")
    w.add_block_count(cfg["layers"])
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(h)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if cfg["align"]:
        w.add_custom_alignment(cfg["align"])
    if kind == "llama_spm_vocab":
        toks = ["<unk>", "<s>", "</s>"] + [f"▁t{i}" for i in range(V - 3)]
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([-float(i) for i in range(V)])
        w.add_token_types([2, 3, 3] + [1] * (V - 3))
        w.add_array("fuzz.nested", [[1, 2], [3]])
    else:
        toks = ["<|endoftext|>"] + [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(V - 1)]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(toks)
        w.add_token_types([3] + [1] * (V - 1))
        w.add_token_merges(["a b", "b c", "ab c"])
        w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_string("general.description", "minfer fuzz seed ünïcödé")
    _tensor(w, rng, "token_embd.weight", (V, d), cfg["emb"])
    _tensor(w, rng, "output_norm.weight", (d,), Q.F32)
    if cfg["out"] is not None:
        _tensor(w, rng, "output.weight", (V, d), cfg["out"])
    for i in range(cfg["layers"]):
        p = f"blk.{i}."
        _tensor(w, rng, p + "attn_norm.weight", (d,), Q.F32)
        _tensor(w, rng, p + "attn_q.weight", (h * hd, d), cfg["mat"])
        _tensor(w, rng, p + "attn_k.weight", (kv * hd, d), cfg["mat"])
        _tensor(w, rng, p + "attn_v.weight", (kv * hd, d), cfg["mat"])
        _tensor(w, rng, p + "attn_output.weight", (d, h * hd), cfg["mat"])
        _tensor(w, rng, p + "ffn_norm.weight", (d,), Q.F32)
        _tensor(w, rng, p + "ffn_gate.weight", (ff, d), cfg["mat"])
        _tensor(w, rng, p + "ffn_up.weight", (ff, d), cfg["mat"])
        _tensor(w, rng, p + "ffn_down.weight", (d, ff), cfg["down"])
        if a == "qwen2":
            _tensor(w, rng, p + "attn_q.bias", (h * hd,), Q.F32)
            _tensor(w, rng, p + "attn_k.bias", (kv * hd,), Q.F32)
            _tensor(w, rng, p + "attn_v.bias", (kv * hd,), Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_corpus(out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_seed(out_dir / f"{k}.gguf", k) for k in SEEDS]


if __name__ == "__main__":
    for p in make_corpus(Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz_corpus_out")):
        print(p, p.stat().st_size)
