"""CPU: the gemma2 architecture: how the loader reads its keys and tensors (as llama.cpp's
llama_model_gemma2::load_arch_hparams does: the window and both soft caps always on, with
llama_hparams' defaults when the file is silent), the attention soft-cap of ops.attention, and
what CUDA says of it. Agreement with llama.cpp itself: tests/test_families_golden.py
(tiny-gemma2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tolerance


def _gemma2_file(tmp_path, extra=None, drop=(), drop_tensors=(), extra_tensors=(), name="g2.gguf"):
    """The tiny-gemma2 preset (F16, a generated vocab of 260) with metadata changes."""
    import gguf

    from minfer.gguf.write import write_gguf
    from minfer.tools.synth import (
        PRESETS,
        generated_tokenizer,
        make_tensor,
        model_metadata,
        tensor_plan,
    )

    shape = replace(PRESETS["tiny-gemma2"], vocab=260)
    meta = model_metadata(shape, "f16", "t") | generated_tokenizer(260)
    meta = {k: v for k, v in meta.items() if k not in drop} | (extra or {})
    plans = [p for p in tensor_plan(shape, "f16") if p.name not in drop_tensors]
    tensors = [
        (p.name, int(gguf.GGMLQuantizationType[p.qtype]), p.shape, make_tensor(p, 0, i, shape))
        for i, p in enumerate(plans)
    ]
    tensors += [
        (n, int(gguf.GGMLQuantizationType.F32), (k,), np.ones(k, np.float32))
        for n, k in extra_tensors
    ]
    return write_gguf(tmp_path / name, "gemma2", meta, tensors, progress=False)


def _load(path):
    from minfer.gguf.loader import load_model

    return load_model(path)


def test_config_reads_as_llamacpp(tmp_path):
    c = _load(_gemma2_file(tmp_path)).config
    assert c.arch == "gemma2" and c.rope_neox and not c.qk_norm and c.post_norms and c.ffn_gelu
    assert c.sliding_window == 32
    assert c.swa_layers == (True, False, True, False)  # no pattern key: every other layer
    assert c.rope_base == 10000.0 and c.rope_base_swa == 10000.0  # one base (no key written)
    assert c.embed_scale == 16.0  # sqrtf(256)
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))  # 1/sqrt(key_length)
    assert c.attn_softcap == 2.0 and c.logit_softcap == 10.0 and c.tied_embeddings
    assert all(c.layer_rope(i) == (c.rope_base, c.rope_scaling) for i in range(4))


def test_llamacpp_defaults_when_the_file_is_silent(tmp_path):
    """No window key: n_swa 4096 (still every other layer local); no soft-cap keys: attention
    50, final 30 (llama_hparams' defaults, always applied for gemma2)."""
    drop = (
        "gemma2.attention.sliding_window",
        "gemma2.attn_logit_softcapping",
        "gemma2.final_logit_softcapping",
    )
    c = _load(_gemma2_file(tmp_path, drop=drop)).config
    assert c.sliding_window == 4096 and c.swa_layers == (True, False, True, False)
    assert c.attn_softcap == 50.0 and c.logit_softcap == 30.0


@pytest.mark.parametrize(
    "pattern, local",
    [
        (2, [True, False, True, False]),
        (3, [True, True, False, True]),  # il % n < n - 1
        (0, [True] * 4),  # 0: every layer local
        ([False, True], [False, True, False, False]),  # per layer; the rest global
    ],
)
def test_sliding_window_pattern(tmp_path, pattern, local):
    import gguf

    V = gguf.GGUFValueType
    if isinstance(pattern, list):
        value = gguf.GGUFValue(pattern, V.ARRAY, V.BOOL)
    else:
        value = gguf.GGUFValue(pattern, V.UINT32)
    c = _load(_gemma2_file(tmp_path, {"gemma2.attention.sliding_window_pattern": value})).config
    assert [c.is_local(i) for i in range(4)] == local


def test_local_rope_base_and_scaling(tmp_path):
    """rope.freq_base_swa sets the local layers' base (default: the global one), and unlike
    gemma3 the local layers keep the file's RoPE scaling (rope_freq_scale_train_swa =
    rope_freq_scale_train)."""
    c = _load(
        _gemma2_file(
            tmp_path,
            {
                "gemma2.rope.freq_base": 20000.0,
                "gemma2.rope.scaling.type": "linear",
                "gemma2.rope.scaling.factor": 4.0,
            },
        )
    ).config
    assert c.rope_base_swa == 20000.0
    assert c.layer_rope(0) == c.layer_rope(1) == (20000.0, c.rope_scaling)
    assert c.rope_scaling.freq_scale == 0.25
    c = _load(_gemma2_file(tmp_path, {"gemma2.rope.freq_base_swa": 5000.0})).config
    assert c.layer_rope(0)[0] == 5000.0 and c.layer_rope(1)[0] == 10000.0


def test_attention_scale_of_the_27b():
    """llama.cpp by model type: 46 layers (Gemma 2 27B) 1/sqrt(n_embd / n_head), else
    1/sqrt(head_dim)."""
    from minfer.gguf.loader import GGUFModel

    m = GGUFModel.__new__(GGUFModel)
    m.path, m.metadata = "x.gguf", {}
    f = np.float32
    assert m._gemma("gemma2", 46, 4608, 32, 128)["attn_scale"] == float(f(1) / np.sqrt(f(144)))
    assert m._gemma("gemma2", 42, 3584, 16, 256)["attn_scale"] == 0.0625
    assert m._gemma("gemma3", 46, 4608, 32, 128)["attn_scale"] == float(f(1) / np.sqrt(f(128)))


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("gemma2.attention.key_length_swa", 128, "not understood"),
        ("gemma2.rope.dimension_count_swa", 128, "not understood"),
        ("gemma2.expert_count", 8, "mixture-of-experts"),
        ("gemma2.attention.sliding_window", 0, "out of range"),  # would mask every key
        ("gemma2.attention.sliding_window", 1.5, "must be an integer"),
        ("gemma2.attn_logit_softcapping", 0.0, "finite and > 0"),  # llama.cpp divides by it
        ("gemma2.final_logit_softcapping", -3.0, "finite and > 0"),
        ("gemma2.attn_logit_softcapping", "50", "must be a number"),
    ],
)
def test_keys_it_cannot_honour_are_refused(tmp_path, key, value, needle):
    from minfer.errors import BadModel, Unsupported

    with pytest.raises((BadModel, Unsupported), match=needle) as e:
        _load(_gemma2_file(tmp_path, {key: value}))
    assert key in str(e.value)


@pytest.mark.parametrize(
    "tensor",
    ["blk.1.post_ffw_norm.weight", "blk.0.post_attention_norm.weight", "blk.3.ffn_gate.weight"],
)
def test_a_missing_gemma2_tensor_is_named(tmp_path, tensor):
    from minfer.errors import BadModel

    with pytest.raises(BadModel, match=f"'{tensor}' missing"):
        _load(_gemma2_file(tmp_path, drop_tensors=(tensor,)))


def test_qk_norms_are_not_part_of_gemma2(tmp_path):
    """llama.cpp's gemma2 creates no attn_q_norm: a file with one is refused, not ignored."""
    from minfer.errors import Unsupported

    with pytest.raises(Unsupported, match="attn_q_norm.*not part of the gemma2 graph"):
        _load(_gemma2_file(tmp_path, extra_tensors=(("blk.0.attn_q_norm.weight", 128),)))


def test_gemma2_9b_preset_has_the_real_shape():
    from minfer.gguf.arch_keys import check_keys
    from minfer.tools.synth import PRESETS, model_metadata, tensor_plan

    s = PRESETS["gemma2-9b"]
    plan = {p.name: (p.shape, p.qtype) for p in tensor_plan(s, "q4_K_M")}
    assert plan["blk.0.attn_q.weight"][0] == (16 * 256, 3584)
    assert plan["blk.0.attn_k.weight"][0] == (8 * 256, 3584)
    assert plan["blk.41.ffn_down.weight"][0] == (3584, 14336)
    for n in ("post_attention_norm", "post_ffw_norm"):
        assert plan[f"blk.41.{n}.weight"][1] == "F32"
    assert "blk.0.attn_q_norm.weight" not in plan
    assert "output.weight" not in plan and len(plan) == 2 + 42 * 11
    meta = {k: v.value for k, v in model_metadata(s, "q4_K_M", "x").items()}
    assert meta["gemma2.attention.sliding_window"] == 4096
    assert meta["gemma2.attn_logit_softcapping"] == 50.0
    assert meta["gemma2.final_logit_softcapping"] == 30.0
    assert "gemma2.rope.freq_base" not in meta and "gemma2.rope.dimension_count" not in meta
    check_keys("x", "gemma2", meta)  # every key it writes is understood


def test_attention_softcap_is_applied_before_the_mask():
    """softcap: scores -> cap * tanh(scores / cap), then the causal / window mask and softmax
    (llama.cpp's build_attn with attn_soft_cap)."""
    from minfer.reference.ops import attention

    rng = np.random.default_rng(1)
    T, Hq, Hkv, D, W, cap = 12, 4, 2, 8, 5, 1.5
    q = rng.standard_normal((T, Hq, D)) * 2
    k = rng.standard_normal((T, Hkv, D))
    v = rng.standard_normal((T, Hkv, D))
    got = attention(q, k, v, 0, window=W, softcap=cap)
    for t in range(T):
        lo = max(0, t - W + 1)
        for h in range(Hq):
            s = k[lo : t + 1, h // 2] @ q[t, h] / np.sqrt(D)
            s = cap * np.tanh(s / cap)
            p = np.exp(s - s.max())
            np.testing.assert_allclose(
                got[t, h], (p / p.sum()) @ v[lo : t + 1, h // 2], rtol=1e-12, atol=1e-12
            )
    assert np.abs(got - attention(q, k, v, 0, window=W)).max() > 1e-2
    # float32 in, float32 out, close to the float64 result
    g32 = attention(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), 0, window=W, softcap=cap
    )
    assert g32.dtype == np.float32 and np.abs(g32 - got).max() < 1e-5


@pytest.mark.identity
def test_chunked_and_token_by_token_decode_agree(tmp_path):
    """The KV cache, the window and the soft cap: 50 tokens in one chunk, or 36 then one at a
    time, give the same last logits; packed() (two sequences) gives the same rows."""
    from minfer.reference.forward import ReferenceBackend

    m = _load(_gemma2_file(tmp_path))
    ids = (np.arange(50) * 7 + 3) % 260
    whole = ReferenceBackend(m, dtype=np.float64, kv_f16=False).forward(ids, 0)
    b = ReferenceBackend(m, dtype=np.float64, kv_f16=False)
    b.forward(ids[:36], 0)
    for t in range(36, 50):
        last = b.forward(ids[t : t + 1], t)
    tol = tolerance.f64_tol(m.config, tolerance.scale(whole))  # float64: exact but rounding
    np.testing.assert_allclose(last, whole, rtol=0, atol=tol)
    assert np.abs(whole).max() < m.config.logit_softcap
    # packed: the same 50 tokens as the second of two sequences
    b = ReferenceBackend(m, dtype=np.float64, kv_f16=False)
    b.reserve_slots(60)
    pre = (np.arange(10) * 5 + 1) % 260
    all_ids = np.r_[pre, ids].astype(np.int32)
    tok = np.array([(s, 0) for s in range(10)] + [(s, 10) for s in range(10, 60)], np.int32)
    stats = b.packed(all_ids, tok, np.array([59], np.int32), np.array([-1], np.int32))
    assert int(stats[0, 0]) == int(np.argmax(whole))
    from minfer.reference.ops import row_stats

    np.testing.assert_allclose(
        stats[0],
        row_stats(whole[None].astype(np.float32), np.array([-1]))[0],
        rtol=0,
        atol=tol,
        equal_nan=True,
    )
