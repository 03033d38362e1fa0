"""CPU: what the loader refuses by name instead of ignoring (minfer.gguf.arch_keys), and how it reads
RoPE scaling (rope_freqs.weight, rope.scaling.*) into ModelConfig.rope_scaling."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from cli_inproc import error_lines, run_cli
from synth_data import small_parts, write_small

Q = gguf.GGMLQuantizationType


def _write(tmp_path, meta_extra=None, tensors_extra=(), drop=()):
    meta, tensors = small_parts()
    meta = {k: v for k, v in meta.items() if k not in drop} | (meta_extra or {})
    return write_small(tmp_path / "m.gguf", meta, tensors + list(tensors_extra))


def _load(path, strict=True):
    from minfer.gguf.loader import load_model

    return load_model(path, strict)


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("llama.attention.scale", 0.5, "custom attention scale"),
        ("llama.rope.scaling.yarn_beta_fast", 16.0, "not understood"),
        ("llama.logit_scale", 2.0, "not understood for architecture 'llama'"),
        ("split.count", 3, "merge it first"),
    ],
)
def test_a_key_that_changes_the_numbers_is_refused(tmp_path, key, value, needle):
    from minfer.errors import Unsupported

    p = _write(tmp_path, {key: value})
    with pytest.raises(Unsupported, match=needle) as e:
        _load(p)
    assert repr(key) in str(e.value)
    code, _, err = run_cli(["prefill", "-m", str(p), "--backend", "cpu", "-p", "hi"])
    assert code == 2 and len(error_lines(err)) == 1 and key in err, err


def test_experts_on_a_dense_file_are_refused(tmp_path):
    """llama + expert_count is Mixtral's form now (tests/test_moe.py): on a file without the
    router and the stacked experts, the first missing tensor is named; without
    expert_used_count, that key."""
    from minfer.errors import BadModel

    with pytest.raises(BadModel, match="expert_used_count"):
        _load(_write(tmp_path, {"llama.expert_count": 8}))
    with pytest.raises(BadModel, match="blk.0.ffn_gate_inp.weight' missing"):
        _load(_write(tmp_path, {"llama.expert_count": 8, "llama.expert_used_count": 2}))


@pytest.mark.parametrize(
    "key, value",
    [
        ("general.description", "anything"),
        ("quantize.imatrix.file", "x.dat"),
        ("mytool.note", "not a llama hyperparameter"),
        ("qwen2.rope.scaling.type", "yarn"),
        ("llama.rope.scaling.finetuned", True),
        ("llama.expert_count", 0),
        ("llama.rope.scaling.yarn_beta_fast", 32.0),
        ("llama.attention.scale", 0.0),
        ("llama.rope.scaling.type", "none"),
    ],
)
def test_inert_keys_are_accepted(tmp_path, key, value):
    assert _load(_write(tmp_path, {key: value})).config.rope_scaling.plain


@pytest.mark.parametrize(
    "name, shape, role",
    [
        ("blk.0.attn_output.bias", (64,), "a bias"),
        ("blk.1.ffn_up.bias", (128,), "a bias"),
        ("blk.0.post_attention_norm.weight", (64,), "an extra norm"),
        ("rope_factors_long.weight", (8,), "RoPE factors"),
        ("mystery", (4,), ""),
    ],
)
def test_a_tensor_outside_the_graph_is_refused(tmp_path, name, shape, role):
    from minfer.errors import Unsupported

    p = _write(tmp_path, tensors_extra=[(name, Q.F32, shape, np.ones(shape, np.float32))])
    with pytest.raises(Unsupported, match="not part of the llama graph") as e:
        _load(p)
    assert repr(name) in str(e.value) and role in str(e.value)
    # inspect still shows such a file, and says why it would not run
    m = _load(p, strict=False)
    assert m.refusal and repr(name) in m.refusal
    code, out, _ = run_cli(["inspect", str(p)])
    assert code == 0 and any(x.startswith("refused") and name in x for x in out.splitlines())


def test_unknown_rope_scaling_type_is_refused(tmp_path):
    from minfer.errors import Unsupported

    with pytest.raises(Unsupported, match="'longrope': RoPE scaling type not implemented"):
        _load(_write(tmp_path, {"llama.rope.scaling.type": "longrope"}))


def test_linear_and_yarn_keys_resolve_as_llamacpp(tmp_path):
    c = _load(
        _write(tmp_path, {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    ).config.rope_scaling
    assert (c.kind, c.freq_scale, c.ext_factor, c.attn_factor) == ("linear", 0.25, 0.0, 1.0)
    c = _load(
        _write(
            tmp_path,
            {
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.attn_factor": 0.5,
                "llama.rope.scaling.original_context_length": 64,
            },
        )
    ).config.rope_scaling
    # llama_context: get_mscale(4, 1) / (1 + 0.1 ln 4) cancels; the file's attn_factor stays
    assert (c.kind, c.freq_scale, c.ext_factor, c.n_ctx_orig) == ("yarn", 0.25, 1.0, 64)
    assert c.attn_factor == pytest.approx(0.5, abs=1e-7)
    # the old key, and a factor of 0 meaning none (llama.cpp's reading)
    c = _load(_write(tmp_path, {"llama.rope.scale_linear": 2.0})).config.rope_scaling
    assert c.freq_scale == 0.5
    assert _load(_write(tmp_path, {"llama.rope.scaling.factor": 0.0})).config.rope_scaling.plain


def test_rope_freqs_is_read_and_checked(tmp_path):
    from minfer.errors import BadModel, Unsupported

    ff = np.linspace(1, 8, 8).astype(np.float32)  # head_dim 16: 8 pairs
    c = _load(_write(tmp_path, tensors_extra=[("rope_freqs.weight", Q.F32, (8,), ff)])).config
    assert c.rope_scaling.freq_factors == tuple(float(x) for x in ff)
    assert "llama3 factors" in c.rope_scaling.describe()
    with pytest.raises(BadModel, match=r"expected F32 \[8\]"):
        _load(_write(tmp_path, tensors_extra=[("rope_freqs.weight", Q.F32, (4,), ff[:4])]))
    bad = ff.copy()
    bad[3] = 0.0
    with pytest.raises(BadModel, match="finite and > 0"):
        _load(_write(tmp_path, tensors_extra=[("rope_freqs.weight", Q.F32, (8,), bad)]))
    # qwen2's graph has no rope_freqs: llama.cpp would refuse the file, so does minfer
    meta, tensors = small_parts()
    meta = {k.replace("llama.", "qwen2."): v for k, v in meta.items()}
    meta["general.architecture"] = "qwen2"
    from minfer.gguf.write import write_gguf

    p = write_gguf(
        tmp_path / "q.gguf",
        "qwen2",
        meta,
        tensors + [("rope_freqs.weight", Q.F32, (8,), ff)],
        progress=False,
    )
    with pytest.raises(Unsupported, match="'rope_freqs.weight'"):
        _load(p)


def test_scaled_table_equals_the_plain_one_when_plain():
    """A plain RopeScaling leaves the cos/sin table bit for bit as before."""
    from minfer.gguf.loader import RopeScaling
    from minfer.reference.ops import rope_cos_sin

    pos = np.arange(300)
    for dt in (np.float32, np.float64):
        a = rope_cos_sin(pos, 10000.0, 64, dt)
        b = rope_cos_sin(pos, 10000.0, 64, dt, RopeScaling(kind="linear"))
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_scaled_table_f32_tracks_f64():
    """The f32 table (ggml's float steps) and the f64 oracle agree for each scaling kind."""
    from minfer.gguf.loader import RopeScaling
    from minfer.reference.ops import rope_cos_sin

    pos = np.arange(2048)
    ff = tuple(float(x) for x in np.linspace(1, 8, 32))
    for sc in (
        RopeScaling("linear", freq_scale=0.25),
        RopeScaling(freq_factors=ff),
        RopeScaling("yarn", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=512),
    ):
        c32, s32 = rope_cos_sin(pos, 10000.0, 64, np.float32, sc)
        c64, s64 = rope_cos_sin(pos, 10000.0, 64, np.float64, sc)
        # the running f32 angle drifts ~1e-4 rad by position 2048, as in ggml
        assert np.abs(c32 - c64).max() < 2e-3 and np.abs(s32 - s64).max() < 2e-3
    # YaRN multiplies by its attention factor 1 + 0.1 ln 4
    c, s = rope_cos_sin(
        pos[:1],
        10000.0,
        64,
        np.float32,
        RopeScaling("yarn", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=512),
    )
    assert c[0, 0] == pytest.approx(1 + 0.1 * np.log(4), rel=1e-6)


def test_phi3_window_follows_llamacpp(tmp_path):
    """llama.cpp disables Phi-3's sliding window (its logits are full attention's), so minfer
    accepts the key for phi3; llama (Mistral) applies it (test_mistral_window_*); an
    architecture without a window implementation refuses it."""
    from minfer.errors import Unsupported
    from minfer.gguf.arch_keys import check_keys

    check_keys("f", "phi3", {"phi3.attention.sliding_window": 2047})
    check_keys("f", "llama", {"llama.attention.sliding_window": 4096})
    with pytest.raises(Unsupported, match="sliding-window"):
        check_keys("f", "qwen3", {"qwen3.attention.sliding_window": 2047})


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2", "tiny-qwen3"])
def test_cuda_runs_every_family_at_the_kernels_head_dims(tmp_path, preset):
    """CUDA runs every architecture the loader reads (gemma: gemma_layers.cu and the
    attention's window and soft-cap) at the kernels' head dims (64, Phi-3-mini's 96, 128, the
    real Gemma files' 256); another is refused by name, and `prefill`'s automatic choice
    takes the CPU."""
    from dataclasses import replace

    from families_data import synth_family

    from minfer.gguf.arch_keys import GPU_ARCHS, gpu_unsupported
    from minfer.gguf.loader import load_model

    c = load_model(synth_family(preset, tmp_path)).config
    assert c.arch in GPU_ARCHS and gpu_unsupported(c) == ""
    for d in (64, 96, 128, 256):
        assert gpu_unsupported(replace(c, head_dim=d)) == ""
    for d in (80, 512):
        why = gpu_unsupported(replace(c, head_dim=d))
        assert f"head_dim {d}" in why and "CPU reference only" in why
