"""CPU: the families added as modules (granite, olmo2, smollm3; minfer/families/): what their
readers make of a file (the ModelConfig flags only the family sets, llama.cpp's keys and
defaults, refusals by name), and CudaBackend's forward of each on the fake runtime of
tests/test_backend_forward_cpu.py (every launch recorded, no kernel runs): the launches each
family adds or drops. The numbers against llama.cpp: tests/test_families_golden.py (CPU) and
tests/gpu/test_families_device.py (GPU)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from families_data import synth_family


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("newfam")
    return {p: synth_family(p, d) for p in ("tiny-granite", "tiny-olmo2", "tiny-smollm3")}


def test_granite_reads_its_four_scalars(files):
    from minfer.gguf.loader import load_model

    c = load_model(files["tiny-granite"]).config
    f = np.float32
    assert (c.embed_scale, c.kq_scale, c.residual_scale) == (12.0, float(f(1 / 64)), 0.5)
    assert c.logit_mul == float(f(1) / f(2.0)) and c.rope_layers == () and not c.rope_neox
    assert c.pre_norms and not c.post_norms and not c.qk_norm


def test_olmo2_is_post_norm_with_full_qk_norms(files):
    from minfer.families import schema_of
    from minfer.gguf.loader import load_model

    m = load_model(files["tiny-olmo2"])
    c = m.config
    assert not c.pre_norms and c.post_norms and c.qk_norm and c.qk_norm_full and c.rope_neox
    assert not c.tied_embeddings
    assert m.tensors["blk.0.attn_q_norm.weight"].shape == (c.n_heads * c.head_dim,)
    assert m.tensors["blk.0.attn_k_norm.weight"].shape == (c.n_kv_heads * c.head_dim,)
    assert "blk.0.attn_norm.weight" not in m.tensors
    assert schema_of(c).names(0, "norm") == [
        "blk.0.attn_q_norm.weight",
        "blk.0.attn_k_norm.weight",
        "blk.0.post_attention_norm.weight",
        "blk.0.post_ffw_norm.weight",
    ]


def test_smollm3_drops_rope_on_every_fourth_layer(files):
    from minfer.gguf.loader import load_model

    c = load_model(files["tiny-smollm3"]).config
    assert c.rope_layers == (True, True, True, False) * 2
    assert [c.has_rope(i) for i in range(8)] == [True, True, True, False] * 2


def _rewrite(src, dst, set_kv=None, drop_kv=(), drop_t=()):
    """src's GGUF rewritten with metadata keys set / dropped and tensors dropped (the gguf
    package's writer; tensors copied as they are)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop_kv:
            continue
        v = f.contents()
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, t)
    for k, (v, t) in (set_kv or {}).items():
        w.add_key_value(k, v, t)
    for t in r.tensors:
        if t.name in drop_t:
            continue
        w.add_tensor(
            t.name,
            np.asarray(t.data),
            raw_shape=list(reversed(t.shape.tolist())),
            raw_dtype=t.tensor_type,
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_granite_needs_its_logit_scale_and_reads_the_rope_switch(files, tmp_path):
    """llama.cpp reads granite.logit_scale as required; rope.scaling.finetuned false (Granite's
    switch) runs every layer without RoPE."""
    import gguf

    from minfer.errors import BadModel
    from minfer.gguf.loader import load_model

    src = files["tiny-granite"]
    with pytest.raises(BadModel, match="granite.logit_scale"):
        load_model(_rewrite(src, tmp_path / "a.gguf", drop_kv=("granite.logit_scale",)))
    c = load_model(
        _rewrite(
            src,
            tmp_path / "b.gguf",
            set_kv={"granite.rope.scaling.finetuned": (False, gguf.GGUFValueType.BOOL)},
        )
    ).config
    assert c.rope_layers == (False,) * c.n_layers
    c = load_model(
        _rewrite(
            src,
            tmp_path / "c.gguf",
            drop_kv=(
                "granite.residual_scale",
                "granite.embedding_scale",
                "granite.attention.scale",
            ),
        )
    ).config
    assert (c.residual_scale, c.embed_scale, c.kq_scale) == (1.0, 1.0, 0.0)


def test_what_a_family_does_not_have_is_refused_by_name(files, tmp_path):
    """An OLMo 3 window, a granite attn_output bias-free file with a stray norm, an olmo2 file
    missing a post norm: refused naming the key or tensor."""
    import gguf

    from minfer.errors import BadModel, Unsupported
    from minfer.gguf.loader import load_model

    with pytest.raises(Unsupported, match="olmo2.attention.sliding_window"):
        load_model(
            _rewrite(
                files["tiny-olmo2"],
                tmp_path / "a.gguf",
                set_kv={"olmo2.attention.sliding_window": (4096, gguf.GGUFValueType.UINT32)},
            )
        )
    with pytest.raises(BadModel, match="blk.1.post_ffw_norm.weight"):
        load_model(
            _rewrite(
                files["tiny-olmo2"], tmp_path / "b.gguf", drop_t=("blk.1.post_ffw_norm.weight",)
            )
        )
    with pytest.raises(Unsupported, match="smollm3.rope.freq_base_swa"):
        load_model(
            _rewrite(
                files["tiny-smollm3"],
                tmp_path / "c.gguf",
                set_kv={"smollm3.rope.freq_base_swa": (10000.0, gguf.GGUFValueType.FLOAT32)},
            )
        )


# -- the CUDA forward's launches (fake runtime) ----------------------------------------------
def _launches(monkeypatch, path, model_path, T=40):
    from fake_gpuarray import install
    from test_backend_forward_cpu import FakeRT, _Arr, fake_tensor_maps

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray
    from minfer.gguf.loader import load_model

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    model = load_model(model_path)
    rt = FakeRT("sm_90")
    calls = []
    rt.launch = lambda fn, grid, block, a, smem=0, stream=None: calls.append((fn[1], a))
    be = CudaBackend(
        model,
        GemmChoice.resolve({}, path, variants=True),
        rt=rt,
        max_tokens=256,
        ubatch=64,
        warmup=False,
        graphs=False,
    )
    calls.clear()
    be.forward_device(np.arange(T, dtype=np.int32), 0)  # one chunk: the last
    return be, model.config, calls


@pytest.mark.parametrize("path", ["f16", "blk"])
def test_granite_cuda_launches(monkeypatch, files, path):
    """granite: the embedding scaled once (scale_f32 with 12), each attention / FFN output
    through post32 and scale_add_f32 (its residual scale), the attention's scale the kq scale, the logits
    scaled last (logit_mul)."""
    be, c, calls = _launches(monkeypatch, path, files["tiny-granite"])
    entries = [e for e, _ in calls]
    L = c.n_layers
    scales = [a for e, a in calls if e == "scale_f32"]
    assert len(scales) == 2 and entries[-1] == "scale_f32"
    assert float(scales[0][2]) == np.float32(12.0) and float(scales[1][2]) == np.float32(0.5)
    adds = [a for e, a in calls if e == "scale_add_f32"]
    assert len(adds) == 2 * L and all(float(a[3]) == np.float32(0.5) for a in adds)
    assert be.buf.post32 is not None and "rmsnorm_add_f32" not in entries
    assert be.fwd.attn_opts[0]["scale"] == c.kq_scale


@pytest.mark.parametrize("path", ["f16", "blk"])
def test_olmo2_cuda_launches(monkeypatch, files, path):
    """olmo2: no rmsnorm before the q|k|v or gate|up GEMMs, q and k normed as one row each in
    the rope's launch (rope_qkv_norm_f32_f16_v4, full), both post norms, no residual scale.
    On f16 the GEMMs read the residual rounded to f16 (cvt_f32_f16, 2 per layer) and each
    post-norm adds on its own (rmsnorm_add_f32); on blk the operand launch does it all
    (rmsnorm_blk_operand: layer 0's q|k|v from the residual itself, every later input from
    the post-norm before it, added into x there), but the last layer's FFN post-norm, which
    the output norm reads."""
    be, c, calls = _launches(monkeypatch, path, files["tiny-olmo2"])
    entries = [e for e, _ in calls]
    L = c.n_layers
    assert "scale_add_f32" not in entries and "head_rmsnorm_f32" not in entries
    ropes = [a for e, a in calls if e == "rope_qkv_norm_f32_f16_v4"]
    assert len(ropes) == L and all(int(a[20]) == 1 for a in ropes)  # full
    assert entries.count("rmsnorm_f32_f16") == 1  # the output norm (the pre-norms are gone)
    ops = [a for e, a in calls if e == "rmsnorm_blk_operand"]
    if path == "f16":
        assert entries.count("cvt_f32_f16") >= 2 * L and not ops
        assert entries.count("rmsnorm_add_f32") == 2 * L
        return
    assert "cvt_f32_f16" not in entries and entries.count("rmsnorm_add_f32") == 1
    assert len(ops) == 2 * L
    assert int(ops[0][1]) == 0 and int(ops[0][-1]) == 0  # no norm weight, no t: f16(x)
    from minfer.cuda.runtime import devarray as da

    post32 = int(da.ptr(be.buf.post32))
    assert all(int(a[-1]) == post32 and int(a[1]) != 0 for a in ops[1:])  # x += norm(t) * w


@pytest.mark.parametrize("path", ["f16", "blk"])
def test_smollm3_cuda_launches(monkeypatch, files, path):
    """smollm3: layers 3 and 7 rope with the identity table (cos 1, sin 0), the others with
    the model's; on f16 the layers with RoPE may rope in the q|k|v GEMM's epilogue, 3 and 7
    never."""
    be, c, calls = _launches(monkeypatch, path, files["tiny-smollm3"])
    assert be.buf.rope_none is not None
    assert [t is be.buf.rope_none for t in be.fwd.rope] == [False, False, False, True] * 2
    assert not {"blk.3.attn_qkv.weight", "blk.7.attn_qkv.weight"} & set(be.rope_epi)
    ropes = [a for e, a in calls if e.startswith("rope_qkv")]
    from minfer.cuda.runtime import devarray as da

    assert int(ropes[-1][14]) == int(da.ptr(be.buf.rope_none.cos))
