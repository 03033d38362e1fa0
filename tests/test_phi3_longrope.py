"""CPU: phi3's long-context RoPE (Phi-3-mini-128k, Phi-3.5-mini): how the loader reads
rope_factors_long / rope_factors_short.weight and rope.scaling.attn_factor, which set it picks
for a context (llama.cpp's llama_model::get_rope_factors), and what it refuses. The agreement
with llama.cpp itself is in tests/test_families_golden.py (tiny-phi3-long)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


def _write(path, n_ctx=1024, orig=256, drop=(), data=None, retype=None, meta=None):
    """tiny-phi3-long shrunk (d 64, 4 heads of 16: 8 factors each), the synth generator's
    values; `data` {name: array} replaces a tensor's values, `retype` {name: ggml type name}
    its type, `drop` leaves tensors or metadata keys out, `meta` adds keys."""
    from minfer.gguf.write import write_gguf
    from minfer.tools.synth import (
        PRESETS,
        SPECIALS_BY_ARCH,
        _qtype_id,
        generated_tokenizer,
        make_tensor,
        model_metadata,
        tensor_plan,
    )

    shape = replace(
        PRESETS["tiny-phi3-long"],
        d_model=64,
        d_ff=128,
        n_heads=4,
        n_kv_heads=4,
        n_ctx=n_ctx,
        rope_orig_ctx=orig,
        vocab=264,
    )
    plans = tensor_plan(shape, "f16")
    md = model_metadata(shape, "f16", "t") | generated_tokenizer(264, SPECIALS_BY_ARCH["phi3"])
    md = {k: v for k, v in md.items() if k not in drop} | (meta or {})
    data, retype = data or {}, retype or {}
    tensors = []
    for i, p in enumerate(plans):
        if p.name in drop:
            continue
        v = data.get(p.name, make_tensor(p, 0, i, shape))
        q = retype.get(p.name, p.qtype)
        if q != p.qtype:
            v = np.asarray(v, np.float16)
        tensors.append((p.name, _qtype_id(q), tuple(np.shape(v)) or p.shape, v))
    return write_gguf(path, "phi3", md, tensors, progress=False)


def _load(path):
    from minfer.gguf.loader import load_model

    return load_model(path)


def test_the_choice_is_llamacpps():
    """get_rope_factors: long when n_ctx_seq > n_ctx_orig_yarn, n_ctx_seq being the context
    padded to 256 (llama_context: GGML_PAD(n_ctx, 256), one sequence)."""
    from minfer.gguf.loader import uses_long_factors

    assert not uses_long_factors(512, 512)
    assert uses_long_factors(513, 512)
    assert not uses_long_factors(477, 512)  # the oracle's default context, padded to 512
    assert uses_long_factors(257, 256) and uses_long_factors(1, 255)  # padding: 512, 256
    assert not uses_long_factors(4096, 4096) and uses_long_factors(131072, 4096)


def test_loader_reads_the_pair_and_picks_for_the_models_context(tmp_path):
    from minfer.tools.synth import longrope_attn_factor, longrope_factors

    m = _load(_write(tmp_path / "m.gguf"))
    sc = m.config.rope_scaling
    long, short = (tuple(float(x) for x in longrope_factors(8, k, 4.0)) for k in (True, False))
    assert sc.longrope == (long, short) and sc.n_ctx_orig == 256
    assert sc.longrope_ctx == 1024 and sc.longrope_long and sc.freq_factors == long
    assert (sc.kind, sc.freq_scale, sc.ext_factor) == ("linear", 1.0, 0.0)  # no type, factor
    assert sc.attn_factor == pytest.approx(longrope_attn_factor(1024, 256), rel=1e-7)
    assert "longrope long factors (context 1024 vs 256)" in m.describe()
    # -c: ModelConfig.for_context (what llama.cpp's -c N does); short up to the original 256
    c = m.config.for_context(256)
    assert c.rope_scaling.freq_factors == short and not c.rope_scaling.longrope_long
    assert c.rope_scaling.attn_factor == sc.attn_factor  # llama.cpp applies it to both
    assert "short factors" in c.rope_scaling.describe()
    assert m.config.for_context(257).rope_scaling == replace(sc, longrope_ctx=257)
    # without original_context_length it is the model's own context: the short factors
    sc = _load(
        _write(tmp_path / "n.gguf", drop=("phi3.rope.scaling.original_context_length",))
    ).config.rope_scaling
    assert sc.n_ctx_orig == 1024 and sc.freq_factors == short


def test_the_table_divides_each_pair_and_scales_by_the_attn_factor(tmp_path):
    """rope_cos_sin (the host table every GPU rope reads): cos / sin of p * base^(-2i/d) / f_i,
    times the attention factor."""
    from minfer.reference.ops import rope_cos_sin

    c = _load(_write(tmp_path / "m.gguf")).config
    sc = c.rope_scaling
    pos = np.arange(100)
    cos, sin = rope_cos_sin(pos, c.rope_base, c.rope_dim, np.float64, sc)
    f = np.asarray(sc.freq_factors)
    theta = pos[:, None] * c.rope_base ** (-np.arange(8) * 2 / c.rope_dim) / f
    np.testing.assert_allclose(cos, np.cos(theta) * sc.attn_factor, atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(theta) * sc.attn_factor, atol=1e-6)
    c32, _ = rope_cos_sin(pos, c.rope_base, c.rope_dim, np.float32, sc)
    np.testing.assert_allclose(c32, cos, atol=1e-4)


@pytest.mark.parametrize(
    "what, kw, needle",
    [
        ("shape", {"data": {LONG: np.ones(6, np.float32)}}, r"expected F32 \[8\]"),
        ("type", {"retype": {SHORT: "F16"}}, r"is F16 \[8\], expected F32"),
        ("nan", {"data": {LONG: np.r_[np.ones(7), np.nan].astype(np.float32)}}, "not finite"),
        ("inf", {"data": {SHORT: np.r_[np.inf, np.ones(7)].astype(np.float32)}}, "not finite"),
        ("zero", {"data": {LONG: np.r_[np.ones(7), 0].astype(np.float32)}}, "and > 0"),
        ("negative", {"data": {SHORT: -np.ones(8, np.float32)}}, "and > 0"),
        ("long alone", {"drop": (SHORT,)}, "without 'rope_factors_short.weight'"),
        ("short alone", {"drop": (LONG,)}, "without 'rope_factors_long.weight'"),
    ],
)
def test_malformed_factors_are_refused(tmp_path, what, kw, needle):
    from minfer.errors import BadModel

    with pytest.raises(BadModel, match=needle):
        _load(_write(tmp_path / "m.gguf", **kw))


def test_attn_factor_must_be_positive(tmp_path):
    from minfer.errors import BadModel

    with pytest.raises(BadModel, match="attn_factor"):
        _load(_write(tmp_path / "m.gguf", meta={"phi3.rope.scaling.attn_factor": 0.0}))


def test_the_factors_are_phi3s_only(tmp_path):
    """llama's graph has no place for them: refused by name (arch_keys), never ignored."""
    import gguf
    from synth_data import small_parts, write_small

    from minfer.errors import Unsupported

    meta, tensors = small_parts()
    f = np.ones(8, np.float32)
    tensors += [
        (LONG, gguf.GGMLQuantizationType.F32, (8,), f),
        (SHORT, gguf.GGMLQuantizationType.F32, (8,), f),
    ]
    with pytest.raises(Unsupported, match="not part of the llama graph"):
        _load(write_small(tmp_path / "l.gguf", meta, tensors))


def test_synth_preset_writes_what_the_converter_writes(tmp_path):
    """convert_hf_to_gguf.py's Phi3MiniModel: context_length = max_position_embeddings, the
    original context, attn_factor sqrt(1 + ln(scale) / ln(orig)), no scaling type or factor,
    the two F32 factor tensors first (generate_extra_tensors)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from families_data import synth_family

    from minfer.gguf.header import read_header

    h = read_header(synth_family("tiny-phi3-long", tmp_path))
    kv = {k: v.value for k, v in h.kv.items()}
    assert kv["phi3.context_length"] == 4096
    assert kv["phi3.rope.scaling.original_context_length"] == 512
    assert kv["phi3.rope.scaling.attn_factor"] == pytest.approx(np.sqrt(4 / 3), rel=1e-7)
    assert not any(k in kv for k in ("phi3.rope.scaling.type", "phi3.rope.scaling.factor"))
    assert [(t.name, t.qtype, t.shape) for t in h.tensors[:2]] == [
        (LONG, 0, (32,)),
        (SHORT, 0, (32,)),
    ]


def test_prefill_and_perplexity_choose_for_their_context(tmp_path):
    """-c picks the factors as llama.cpp's -c does: prefill's model line and its numbers
    follow it (context 1024 over an original 256: long; -c 256: short)."""
    import json

    from cli_inproc import run_cli

    path = str(_write(tmp_path / "l.gguf"))
    runs = {}
    for c in ("0", "256"):
        code, out, err = run_cli(
            ["prefill", "-m", path, "--backend", "cpu", "-p", "abc", "-n", "4", "-c", c]
        )
        assert code == 0, err
        runs[c] = out
    assert "long factors (context 1024" in runs["0"]
    assert "short factors (context 256" in runs["256"]
    code, out, err = run_cli(
        ["perplexity", "-m", path, "--backend", "cpu", "-c", "64", "--chunks", "1", "--json"]
    )
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["ppl"] > 0
