"""minfer.tools.synth: block designs (dequantized stats), llama.cpp's type mix, valid loadable models,
determinism, and finite, well-scaled activations through every layer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from minfer.errors import BadInput
from minfer.gguf.header import read_header
from minfer.gguf.loader import load_model
from minfer.tools.synth import PRESETS, SynthOptions, SynthShape, make_synthetic_model, tensor_plan
from minfer.tools.synth_blocks import pack_scale_min_k4, random_blocks

GOLDEN = Path(__file__).resolve().parent / "golden"
Q = gguf.GGMLQuantizationType


# ---- blocks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q8_0", "F16"])
@pytest.mark.parametrize("K", [4096, 14336])
def test_dequantized_weights_have_the_designed_std(name, K):
    rng = np.random.default_rng(7)
    raw = random_blocks(name, rng, 64, K, 1 / np.sqrt(K))
    w = raw.astype(np.float32) if name == "F16" else gguf.quants.dequantize(raw, Q[name])
    assert w.shape == (64, K)
    assert np.isfinite(w).all()
    assert abs(w.std() * np.sqrt(K) - 1) < 0.03  # std = 1/sqrt(K) within 3%
    assert abs(w.mean()) < 0.02 * w.std()
    # no all-zero block anywhere (a kernel could otherwise skip work)
    blocks = w.reshape(-1, 32)
    assert (np.abs(blocks).max(axis=1) > 0).all()


def test_q4k_scale_packing_matches_get_scale_min_k4():
    rng = np.random.default_rng(0)
    sc = rng.integers(0, 64, (100, 8), dtype=np.uint8)
    m = rng.integers(0, 64, (100, 8), dtype=np.uint8)
    q = pack_scale_min_k4(sc, m).astype(np.int32)
    for j in range(8):  # ggml's get_scale_min_k4, literally
        if j < 4:
            d, mm = q[:, j] & 63, q[:, j + 4] & 63
        else:
            d = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
            mm = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
        assert (d == sc[:, j]).all() and (mm == m[:, j]).all()


# ---- type mix -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ftype, key", [("q4_K_M", "q4_k_m"), ("q6_K", "q6_k"), ("q8_0", "q8_0"), ("f16", "f16")]
)
def test_type_mix_reproduces_llama_cpp_on_smollm2(ftype, key):
    """A synthetic model of SmolLM2's shape gets llama.cpp's exact types and shapes."""
    ref = json.loads((GOLDEN / "llamacpp-requant-tensors.json").read_text())[f"smollm2-135m-{key}"]
    smol = SynthShape("llama", 576, 1536, 30, 9, 3, vocab=49152, tied=True)
    got = {p.name: (p.qtype, list(reversed(p.shape))) for p in tensor_plan(smol, ftype)}
    assert got == {n: (t["type"], t["shape"]) for n, t in ref.items()}


def test_q4_k_m_mix_at_8b_shape_follows_use_more_bits():
    plans = {p.name: p.qtype for p in tensor_plan(PRESETS["llama3-8b"], "q4_K_M")}
    assert plans["output.weight"] == "Q6_K" and plans["token_embd.weight"] == "Q4_K"
    more = [i for i in range(32) if plans[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert all(
        plans[f"blk.{i}.attn_v.weight"] == ("Q6_K" if i in more else "Q4_K") for i in range(32)
    )
    assert all(plans[f"blk.{i}.attn_q.weight"] == "Q4_K" for i in range(32))
    assert all(v == "F32" for k, v in plans.items() if "norm" in k)


# ---- models ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("synth") / "tiny.gguf"
    r = make_synthetic_model(
        p,
        SynthOptions(preset="tiny", seed=3, vocab=512, tokenizer_from=None, workers=1),
        progress=False,
    )
    return p, r


def test_tiny_model_loads_with_minfer_and_gguf(tiny):
    p, r = tiny
    m = load_model(p)  # checks every tensor's presence and shape
    c, s = m.config, PRESETS["tiny"]
    assert (c.arch, c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads) == (
        s.arch,
        s.n_layers,
        s.d_model,
        s.d_ff,
        s.n_heads,
        s.n_kv_heads,
    )
    assert c.tied_embeddings and c.vocab_size == 512
    f = gguf.GGUFReader(p).fields
    assert list(f["llama.block_count"].types) == [gguf.GGUFValueType.UINT32]
    assert f["general.file_type"].contents() == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    # the tied LM head is Q6_K as llama.cpp would make it
    assert m.tensors["token_embd.weight"].type_name == "Q6_K"
    assert r["bytes"] == p.stat().st_size


def test_tokenizer_is_copied_whole_from_the_default_model(default_model_path, tmp_path):
    p = tmp_path / "t.gguf"
    r = make_synthetic_model(p, SynthOptions(preset="tiny", layers=1, workers=1), progress=False)
    src = read_header(default_model_path).kv
    mine = read_header(p).kv
    toks = [k for k in src if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.merges" in toks and "copied" in r["tokenizer"]
    for k in toks:
        assert (mine[k].value, mine[k].type, mine[k].sub_type) == (
            src[k].value,
            src[k].type,
            src[k].sub_type,
        ), k
    assert mine["llama.vocab_size"].value == len(src["tokenizer.ggml.tokens"].value) == 49152


def test_same_seed_same_file_any_worker_count_other_seed_differs(tiny, tmp_path):
    p, _ = tiny
    p2, p3 = tmp_path / "a.gguf", tmp_path / "b.gguf"
    o = SynthOptions(preset="tiny", seed=3, vocab=512, tokenizer_from=None, workers=2)
    make_synthetic_model(p2, o, progress=False)
    assert p2.read_bytes() == p.read_bytes()
    make_synthetic_model(p3, replace(o, seed=4, workers=1), progress=False)
    assert p3.stat().st_size == p.stat().st_size and p3.read_bytes() != p.read_bytes()


def test_generated_vocab_when_no_tokenizer_source(tmp_path):
    p = tmp_path / "v.gguf"
    r = make_synthetic_model(
        p, SynthOptions(preset="tiny", vocab=700, tokenizer_from=None, workers=1), progress=False
    )
    m = load_model(p)
    toks = m.metadata["tokenizer.ggml.tokens"]
    assert m.config.vocab_size == len(toks) == 700 == len(set(toks))
    merges = m.metadata["tokenizer.ggml.merges"]
    assert len(merges) == 700 - 256 - 2
    assert all(a + b in toks for a, b in (x.split(" ") for x in merges[:50]))
    assert "generated" in r["tokenizer"]
    try:
        from minfer.text.tokenizer import Tokenizer
    except ImportError:
        return
    tk = Tokenizer.from_metadata(m.metadata)  # the generated vocab is a working BPE
    text = "Hello world, synthetic! é"
    ids = tk.encode(text)
    assert tk.decode(ids) == text and max(ids) < 700


def _mini_forward(m, ids):
    """A plain f64 llama forward (no RoPE: it preserves norms) recording the residual rms
    after every layer; returns (rms per layer, logits of the last position)."""
    c = m.config
    T, H, Hkv, D = len(ids), c.n_heads, c.n_kv_heads, c.head_dim

    def W(n):
        return m.dequant(n).astype(np.float64)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_eps) * w

    x = m.dequant("token_embd.weight", rows=ids).astype(np.float64)
    rms = []
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        h = norm(x, W(p + "attn_norm.weight"))
        q = (h @ W(p + "attn_q.weight").T).reshape(T, H, D)
        k = np.repeat((h @ W(p + "attn_k.weight").T).reshape(T, Hkv, D), H // Hkv, axis=1)
        v = np.repeat((h @ W(p + "attn_v.weight").T).reshape(T, Hkv, D), H // Hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * D)
        x = x + o @ W(p + "attn_output.weight").T
        h = norm(x, W(p + "ffn_norm.weight"))
        g, u = h @ W(p + "ffn_gate.weight").T, h @ W(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ W(p + "ffn_down.weight").T
        rms.append(float(np.sqrt((x * x).mean())))
        assert np.isfinite(x).all(), f"layer {i}: non-finite residual"
    h = norm(x[-1:], W("output_norm.weight"))
    return rms, (h @ W(m.output_name).T)[0]


def test_activations_stay_finite_and_well_scaled_through_32_layers(tmp_path):
    """Finiteness through all layers: the residual after every one of 32 layers is finite and
    its rms stays in [0.3, 3*sqrt(layers)]; the logits are finite with std ~1. The reference
    backend, where present, agrees on the logits."""
    p = tmp_path / "deep.gguf"
    make_synthetic_model(
        p,
        SynthOptions(preset="tiny", layers=32, vocab=512, tokenizer_from=None, workers=1),
        progress=False,
    )
    m = load_model(p)
    ids = np.array([5, 77, 300, 12, 511, 0, 42, 99], dtype=np.int32)
    rms, logits = _mini_forward(m, ids)
    assert len(rms) == 32
    assert all(0.3 < r < 3 * np.sqrt(i + 1) for i, r in enumerate(rms)), rms
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3, logits.std()
    try:
        from minfer.reference.forward import ReferenceBackend
    except ImportError:
        return
    ref = ReferenceBackend(m, dtype=np.float64, kv_f16=False).forward(ids, 0)
    assert np.isfinite(ref).all()
    # RoPE changes the attention pattern, not the scale: the logits stay comparable
    assert 0.3 < ref.std() < 3


@pytest.fixture(scope="module")
def llama3_2layers(tmp_path_factory):
    """The Llama-3-8B shape with 2 layers (vocab 512 generated, to keep it ~250 MB)."""
    p = tmp_path_factory.mktemp("synth8b") / "l3.gguf"
    make_synthetic_model(
        p,
        SynthOptions(preset="llama3-8b", layers=2, vocab=512, tokenizer_from=None, workers=2),
        progress=False,
    )
    return p


@pytest.mark.slow
def test_llama3_8b_shape_loads_and_has_designed_weights(llama3_2layers):
    m = load_model(llama3_2layers)  # checks all shapes against the config
    c = m.config
    assert (c.d_model, c.d_ff, c.n_heads, c.n_kv_heads, c.head_dim, c.n_layers) == (
        4096,
        14336,
        32,
        8,
        128,
        2,
    )
    assert not c.tied_embeddings and c.rope_base == 500000.0
    r = gguf.GGUFReader(llama3_2layers)
    assert len(r.tensors) == len(m.tensors) == 2 * 9 + 3
    types = {t.name: t.type_name for t in m.tensors.values()}
    assert types["blk.0.attn_v.weight"] == "Q4_K" and types["blk.1.attn_v.weight"] == "Q6_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["output.weight"] == "Q6_K"
    for name in (
        "blk.0.attn_q.weight",
        "blk.0.ffn_down.weight",
        "blk.1.ffn_down.weight",
        "blk.1.attn_v.weight",
        "output.weight",
    ):
        K = m.tensors[name].shape[1]
        w = m.dequant(name, rows=slice(0, 64))
        assert abs(w.std() * np.sqrt(K) - 1) < 0.05, name
        assert abs(w.mean()) < 0.03 * w.std(), name
    n = m.dequant("blk.0.attn_norm.weight")
    assert 0.9 <= n.min() and n.max() <= 1.1


@pytest.mark.slow
def test_qwen2_like_one_layer_has_biases_and_loads(tmp_path):
    p = tmp_path / "q.gguf"
    make_synthetic_model(
        p,
        SynthOptions(preset="qwen2-7b-like", layers=1, vocab=512, tokenizer_from=None, workers=2),
        progress=False,
    )
    c = load_model(p).config
    assert c.arch == "qwen2" and c.qkv_bias and c.rope_neox
    assert (c.d_model, c.d_ff, c.n_heads, c.n_kv_heads) == (3584, 18944, 28, 4)


def test_presets_have_the_real_shapes():
    names = {p.name: p.shape for p in tensor_plan(PRESETS["llama2-7b"], "q4_K_M")}
    assert names["blk.31.attn_k.weight"] == (4096, 4096)  # 32:32 heads, no GQA
    assert names["blk.0.ffn_down.weight"] == (4096, 11008)
    names = {p.name: p.shape for p in tensor_plan(PRESETS["llama3-8b"], "q4_K_M")}
    assert names["blk.31.attn_k.weight"] == (1024, 4096)
    assert names["blk.0.ffn_up.weight"] == (14336, 4096)
    assert len(names) == 32 * 9 + 3


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(BadInput, match="preset"):
        make_synthetic_model(tmp_path / "x.gguf", SynthOptions(preset="gpt5"), progress=False)
    with pytest.raises(BadInput, match="--layers"):
        make_synthetic_model(
            tmp_path / "x.gguf", SynthOptions(preset="tiny", layers=0), progress=False
        )
    with pytest.raises(BadInput, match="type"):
        make_synthetic_model(
            tmp_path / "x.gguf", SynthOptions(preset="tiny", qtype="q3_K"), progress=False
        )
    with pytest.raises(BadInput, match="no such file"):
        make_synthetic_model(
            tmp_path / "x.gguf",
            SynthOptions(preset="tiny", tokenizer_from=tmp_path / "nope"),
            progress=False,
        )
    assert list(tmp_path.iterdir()) == []


def test_cli_synth(tmp_path):
    from click.testing import CliRunner

    from minfer.commands.synth import synth

    out = tmp_path / "c.gguf"
    res = CliRunner().invoke(
        synth,
        [
            "--preset",
            "tiny",
            "--type",
            "q8_0",
            "--vocab",
            "300",
            "--tokenizer-from",
            "none",
            "--workers",
            "1",
            "--quiet",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    m = load_model(out)
    assert m.config.vocab_size == 300
    assert {t.type_name for t in m.tensors.values()} == {"Q8_0", "F32"}
    res = CliRunner().invoke(synth, ["--preset", "nope", "-o", str(out)])
    assert res.exit_code != 0 and "nope" in res.output


def test_block_layouts_match_ggml_sizes():
    from minfer.tools.synth_blocks import _BLOCK, _DT

    for name, dt in _DT.items():
        assert (_BLOCK[name], dt.itemsize) == gguf.GGML_QUANT_SIZES[Q[name]], name


def test_ctx_override_sets_context_length(tmp_path):
    from minfer.errors import BadInput
    from minfer.gguf.loader import load_model
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    opts = dict(preset="tiny", qtype="q8_0", seed=0, vocab=300, tokenizer_from=None, workers=1)
    p = tmp_path / "c.gguf"
    make_synthetic_model(p, SynthOptions(n_ctx=64, **opts), progress=False)
    assert load_model(p).config.n_ctx == 64
    with pytest.raises(BadInput, match="--ctx"):
        make_synthetic_model(tmp_path / "d.gguf", SynthOptions(n_ctx=0, **opts), progress=False)


def test_llama3_70b_preset_outgrows_f16_on_one_h200():
    """The 70B preset: Llama-3-70B's shape (80 layers, d 8192, d_ff 28672, 64:8 heads); its 2-D
    weights at 2 B each (the f16 path) take 129 GiB of an H200's ~140, its Q4_K_M file ~40 GB."""
    import math

    import gguf

    plan = tensor_plan(PRESETS["llama3-70b"], "q4_K_M")
    w2d = [p for p in plan if len(p.shape) == 2]
    n = sum(math.prod(p.shape) for p in w2d)
    assert 69e9 < n < 72e9 and 128 << 30 < 2 * n < 130 << 30
    file_bytes = sum(
        math.prod(p.shape)
        // gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[p.qtype]][0]
        * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[p.qtype]][1]
        for p in w2d
    )
    assert 38e9 < file_bytes < 44e9
    assert sum(p.name.endswith("ffn_down.weight") for p in plan) == 80


@pytest.mark.parametrize("preset", ["tiny-olmo2", "tiny-smollm3", "tiny-granite", "tiny-gemma3"])
def test_as_llama_keeps_the_dimensions_and_drops_the_family(preset, tmp_path):
    """--as-llama: the preset's dimensions as a plain llama file (the family's overhead is then
    the bench's difference); a MoE preset is refused."""
    from minfer.tools.synth import PRESETS

    p = tmp_path / "twin.gguf"
    make_synthetic_model(
        p,
        SynthOptions(preset=preset, tokenizer_from=None, workers=1, as_llama=True),
        progress=False,
    )
    c, s = load_model(p).config, PRESETS[preset]
    assert load_model(p).metadata["general.architecture"] == "llama"
    assert (c.d_model, c.d_ff, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == (
        s.d_model,
        s.d_ff,
        s.n_layers,
        s.n_heads,
        s.n_kv_heads,
        s.hd,
        s.vocab,
    )
    assert c.pre_norms and not c.post_norms and not c.qk_norm and c.sliding_window in (0, None)
    assert c.residual_scale == 1.0 and c.embed_scale == 1.0
    with pytest.raises(BadInput, match="mixture-of-experts"):
        make_synthetic_model(
            tmp_path / "m.gguf",
            SynthOptions(preset="tiny-qwen3moe", tokenizer_from=None, workers=1, as_llama=True),
            progress=False,
        )
