"""CPU: the gemma3 architecture: how the loader reads its keys and tensors (as llama.cpp's
llama_model_gemma3::load_arch_hparams does), the reference ops it adds (ggml's GELU, the
sliding-window mask) and the forward's bookkeeping. Agreement with llama.cpp itself:
tests/test_families_golden.py (tiny-gemma3) and tests/test_gemma3_real.py (Gemma 3 270M)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tolerance


def _gemma_file(tmp_path, extra=None, drop=(), drop_tensors=(), layers=None, name="g.gguf"):
    """The tiny-gemma3 preset (F16, a generated vocab of 260) with metadata changes."""
    import gguf

    from minfer.gguf.write import write_gguf
    from minfer.tools.synth import (
        PRESETS,
        generated_tokenizer,
        make_tensor,
        model_metadata,
        tensor_plan,
    )

    shape = replace(PRESETS["tiny-gemma3"], vocab=260)
    if layers is not None:
        shape = replace(shape, n_layers=layers)
    meta = model_metadata(shape, "f16", "t") | generated_tokenizer(260)
    meta = {k: v for k, v in meta.items() if k not in drop} | (extra or {})
    plans = [p for p in tensor_plan(shape, "f16") if p.name not in drop_tensors]
    tensors = [
        (p.name, int(gguf.GGMLQuantizationType[p.qtype]), p.shape, make_tensor(p, 0, i, shape))
        for i, p in enumerate(plans)
    ]
    return write_gguf(tmp_path / name, "gemma3", meta, tensors, progress=False)


def _load(path):
    from minfer.gguf.loader import load_model

    return load_model(path)


def test_config_reads_as_llamacpp(tmp_path):
    c = _load(_gemma_file(tmp_path)).config
    assert c.arch == "gemma3" and c.rope_neox and c.qk_norm and c.post_norms and c.ffn_gelu
    assert c.sliding_window == 32
    assert c.swa_layers == (True,) * 5 + (False,)  # no pattern key: every 6th layer global
    assert c.rope_base == 1e6 and c.rope_base_swa == 10000.0  # freq_base_swa's default
    assert c.embed_scale == 16.0  # sqrtf(256)
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))
    assert c.logit_softcap == 0.0 and c.tied_embeddings
    # linear RoPE x8 on the global layer only (local: rope_freq_scale_train_swa = 1)
    assert c.rope_scaling.freq_scale == 0.125
    base, sc = c.layer_rope(0)
    assert base == 10000.0 and sc.plain
    base, sc = c.layer_rope(5)
    assert base == 1e6 and sc.freq_scale == 0.125
    assert c.is_local(0) and not c.is_local(5)


@pytest.mark.parametrize(
    "pattern, local",
    [
        (2, [True, False, True, False, True, False]),  # il % n < n - 1
        (3, [True, True, False, True, True, False]),
        (1, [False] * 6),
        (0, [True] * 6),  # 0: every layer local
        ([True, False, True], [True, False, True, False, False, False]),  # per layer; rest global
        ([1, 1, 0, 0, 1, 1], [True, True, False, False, True, True]),
    ],
)
def test_sliding_window_pattern(tmp_path, pattern, local):
    import gguf

    V = gguf.GGUFValueType
    if isinstance(pattern, list):
        sub = V.BOOL if isinstance(pattern[0], bool) else V.INT32
        value = gguf.GGUFValue(pattern, V.ARRAY, sub)
    else:
        value = gguf.GGUFValue(pattern, V.UINT32)
    c = _load(_gemma_file(tmp_path, {"gemma3.attention.sliding_window_pattern": value})).config
    assert list(c.swa_layers) == local
    assert [c.is_local(i) for i in range(6)] == local


@pytest.mark.parametrize("drop_window", [True, False])
def test_no_window_means_every_layer_global(tmp_path, drop_window):
    """No sliding_window key (or 0): llama.cpp's LLAMA_SWA_TYPE_NONE, pattern and local base
    unread."""
    extra = {"gemma3.rope.freq_base_swa": 5000.0}
    if not drop_window:
        extra["gemma3.attention.sliding_window"] = 0
    c = _load(_gemma_file(tmp_path, extra, drop=("gemma3.attention.sliding_window",))).config
    assert c.sliding_window == 0 and not any(c.is_local(i) for i in range(c.n_layers))
    assert c.layer_rope(0) == (c.rope_base, c.rope_scaling)


def test_local_rope_base_and_softcap_keys(tmp_path):
    c = _load(
        _gemma_file(
            tmp_path, {"gemma3.rope.freq_base_swa": 5000.0, "gemma3.final_logit_softcapping": 30.0}
        )
    ).config
    assert c.rope_base_swa == 5000.0 and c.layer_rope(0)[0] == 5000.0
    assert c.logit_softcap == 30.0


def test_softcap_bounds_the_logits(tmp_path):
    from minfer.reference.forward import ReferenceBackend

    ids = np.arange(1, 40)
    m = _load(_gemma_file(tmp_path))
    raw = ReferenceBackend(m).forward(ids, 0)
    object.__setattr__(m, "config", replace(m.config, logit_softcap=2.0))
    capped = ReferenceBackend(m).forward(ids, 0)
    assert np.abs(raw).max() > 2.5 and np.abs(capped).max() < 2.0
    np.testing.assert_allclose(capped, 2.0 * np.tanh(raw / 2.0), atol=1e-6)


def test_attention_scale_of_the_27b():
    """llama.cpp by model type: 62 layers (27B) 1/sqrt(n_embd / n_head), else 1/sqrt(head_dim)."""
    from minfer.gguf.loader import GGUFModel

    m = GGUFModel.__new__(GGUFModel)
    m.path, m.metadata = "x.gguf", {}
    f = np.float32
    assert m._gemma("gemma3", 62, 5376, 32, 128)["attn_scale"] == float(f(1) / np.sqrt(f(168)))
    assert m._gemma("gemma3", 48, 3840, 16, 256)["attn_scale"] == 0.0625


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("gemma3.attn_logit_softcapping", 50.0, "not understood"),  # gemma2's, unread for gemma3
        ("gemma3.attention.key_length_swa", 128, "not understood"),
        ("gemma3.attention.sliding_window", 1.5, "must be an integer"),
        ("gemma3.attention.sliding_window_pattern", "6", "must be an integer"),
        ("gemma3.final_logit_softcapping", -3.0, "finite and > 0"),
    ],
)
def test_keys_it_cannot_honour_are_refused(tmp_path, key, value, needle):
    from minfer.errors import BadModel, Unsupported

    with pytest.raises((BadModel, Unsupported), match=needle) as e:
        _load(_gemma_file(tmp_path, {key: value}))
    assert key in str(e.value)


def test_mistral_window_applies_past_its_width_only(tmp_path):
    """A llama file with attention.sliding_window (Mistral 7B v0.1): every layer local on the
    model's RoPE. Rows before the window's width equal full attention's exactly (the window
    masks nothing there), rows past it differ; with RoPE scaling it is refused."""
    import numpy as np
    from synth_data import small_parts, write_small

    from minfer.errors import Unsupported
    from minfer.reference.forward import ReferenceBackend

    meta, tensors = small_parts()
    plain = _load(write_small(tmp_path / "p.gguf", meta, tensors))
    meta["llama.attention.sliding_window"] = 16
    m = _load(write_small(tmp_path / "w.gguf", meta, tensors))
    c = m.config
    assert c.sliding_window == 16 and all(c.is_local(i) for i in range(c.n_layers))
    assert c.layer_rope(0) == (c.rope_base, c.rope_scaling)
    ids = np.arange(40) % 200 + 3
    a = ReferenceBackend(plain).window_logits(ids, 0)
    b = ReferenceBackend(m).window_logits(ids, 0)
    assert np.array_equal(a[:16], b[:16])
    assert np.abs(a[16:] - b[16:]).max() > 1e-3
    meta["llama.rope.scaling.type"], meta["llama.rope.scaling.factor"] = "linear", 2.0
    with pytest.raises(Unsupported, match="sliding window over scaled RoPE"):
        _load(write_small(tmp_path / "s.gguf", meta, tensors))


@pytest.mark.parametrize(
    "tensor",
    ["blk.1.post_ffw_norm.weight", "blk.0.post_attention_norm.weight", "blk.2.attn_k_norm.weight"],
)
def test_a_missing_gemma3_tensor_is_named(tmp_path, tensor):
    from minfer.errors import BadModel

    with pytest.raises(BadModel, match=f"'{tensor}' missing"):
        _load(_gemma_file(tmp_path, drop_tensors=(tensor,)))


def test_gemma3_12b_preset_has_the_real_shape():
    from minfer.gguf.arch_keys import check_keys
    from minfer.tools.synth import PRESETS, model_metadata, tensor_plan

    s = PRESETS["gemma3-12b"]
    plan = {p.name: (p.shape, p.qtype) for p in tensor_plan(s, "q4_K_M")}
    assert plan["blk.0.attn_q.weight"][0] == (16 * 256, 3840)
    assert plan["blk.0.attn_k.weight"][0] == (8 * 256, 3840)
    assert plan["blk.47.ffn_down.weight"][0] == (3840, 15360)
    for n in ("post_attention_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"):
        assert plan[f"blk.47.{n}.weight"][1] == "F32"
    assert "output.weight" not in plan and len(plan) == 2 + 48 * 13
    meta = {k: v.value for k, v in model_metadata(s, "q4_K_M", "x").items()}
    assert meta["gemma3.attention.sliding_window"] == 1024
    assert meta["gemma3.rope.scaling.type"] == "linear"
    check_keys("x", "gemma3", meta)  # every key it writes is understood


# -- ops --------------------------------------------------------------------------------------
def test_gelu_is_ggmls_f16_table():
    from minfer.reference.ops import gelu, gelu_f32

    x = np.linspace(-12, 12, 20001, dtype=np.float32)
    y = gelu(x)
    assert y.dtype == np.float32
    assert np.all(y[x <= -10] == 0) and np.all(y[x >= 10] == x[x >= 10])
    mid = (x > -10) & (x < 10)
    # table[f16(x)]: the f16 rounding of ggml_gelu_f32 at the f16 value of x
    want = gelu_f32(x[mid].astype(np.float16).astype(np.float32)).astype(np.float16)
    assert np.array_equal(y[mid], want.astype(np.float32))
    # and the tanh approximation itself, to f16 precision
    exact = gelu(x.astype(np.float64))
    assert np.abs(y - exact).max() < 0.01 and np.abs(y - exact)[np.abs(x) < 1].max() < 1e-3
    assert gelu(np.float32([0.0]))[0] == 0.0


def test_attention_window_masks_as_llamacpp():
    """A query at p sees keys j with p - window < j <= p (is_masked_swa: p - j >= n_swa)."""
    from minfer.reference.ops import attention

    rng = np.random.default_rng(0)
    T, Hq, Hkv, D, W = 20, 4, 2, 8, 5
    q = rng.standard_normal((T, Hq, D))
    k = rng.standard_normal((T, Hkv, D))
    v = rng.standard_normal((T, Hkv, D))
    got = attention(q, k, v, 0, window=W)
    for t in range(T):
        lo = max(0, t - W + 1)
        for h in range(Hq):
            s = k[lo : t + 1, h // 2] @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            np.testing.assert_allclose(
                got[t, h], (p / p.sum()) @ v[lo : t + 1, h // 2], rtol=1e-12, atol=1e-12
            )
    # a window past the sequence is plain causal; a chunk at pos0 > 0 sees the same keys
    assert np.array_equal(attention(q, k, v, 0, window=T), attention(q, k, v, 0))
    np.testing.assert_allclose(attention(q[12:], k, v, 12, window=W), got[12:], rtol=1e-12)
    # scale=1.0: q taken as pre-scaled
    np.testing.assert_allclose(
        attention(q / np.sqrt(D), k, v, 0, window=W, scale=1.0), got, rtol=1e-12, atol=1e-12
    )


@pytest.mark.identity
def test_chunked_and_token_by_token_decode_agree_across_the_window(tmp_path):
    """The KV cache and the window: 60 tokens (window 32) in one chunk, or 40 then one at a
    time, give the same last logits."""
    from minfer.reference.forward import ReferenceBackend

    m = _load(_gemma_file(tmp_path))
    ids = (np.arange(60) * 7 + 3) % 260
    whole = ReferenceBackend(m, dtype=np.float64, kv_f16=False).forward(ids, 0)
    b = ReferenceBackend(m, dtype=np.float64, kv_f16=False)
    b.forward(ids[:40], 0)
    for t in range(40, 60):
        last = b.forward(ids[t : t + 1], t)
    tol = tolerance.f64_tol(m.config, tolerance.scale(whole))  # float64: exact but rounding
    np.testing.assert_allclose(last, whole, rtol=0, atol=tol)
    # and the window is in effect: without it the last logits move
    object.__setattr__(m, "config", replace(m.config, sliding_window=0))
    assert (
        np.abs(ReferenceBackend(m, dtype=np.float64, kv_f16=False).forward(ids, 0) - whole).max()
        > 1e-3
    )
