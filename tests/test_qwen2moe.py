"""CPU: qwen2moe (minfer/families/qwen2moe.py) as its reader makes a file of it: the shared
expert's width from its own key (else feed_forward_length), raw softmax weights, the shared gate
as HF's one-row [1, d] form too, output.weight required; the reference's shared expert against a
numpy restatement of llama.cpp's graph. The logits against llama.cpp: tests/test_moe.py
(tie-aware) and tests/test_families_golden.py."""

from __future__ import annotations

import numpy as np
import pytest
from families_data import synth_family

P = "tiny-qwen2moe"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return synth_family(P, tmp_path_factory.mktemp("q2moe"))


def _rewrite(src, dst, drop_kv=(), drop_t=(), reshape=None):
    """src's GGUF with keys / tensors dropped, tensors reshaped (name -> numpy shape)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop_kv:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        if t.name in drop_t:
            continue
        a = np.asarray(t.data)
        shape = (reshape or {}).get(t.name, tuple(reversed(t.shape.tolist())))
        w.add_tensor(t.name, a.reshape(shape), raw_shape=list(shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_reads_experts_and_shared_expert(src):
    from minfer.families import schema_of
    from minfer.gguf.loader import load_model

    m = load_model(src)
    c = m.config
    assert (c.n_expert, c.n_expert_used, c.d_ff_exp, c.d_ff_shexp) == (8, 4, 256, 384)
    assert not c.moe_norm_w and c.qkv_bias and c.rope_neox and not c.qk_norm
    assert m.tensors["blk.1.ffn_gate_inp_shexp.weight"].shape == (256,)
    assert m.tensors["blk.1.ffn_down_shexp.weight"].shape == (256, 384)
    names = {t.name for t in schema_of(c).tensors}
    assert "ffn_up_shexp.weight" in names and "ffn_gate.weight" not in names
    assert "a sigmoid-gated shared expert of ff 384" in m.describe()


def test_key_defaults_one_row_gate_and_required_output(src, tmp_path):
    """Without expert_shared_feed_forward_length the width is feed_forward_length (llama.cpp's
    n_ff fallback: the tensors of width 384 then disagree, named); the gate as [1, d] loads as
    [d]; no output.weight is refused (llama.cpp's qwen2moe loader requires it)."""
    from minfer.errors import BadModel
    from minfer.gguf.loader import load_model

    with pytest.raises(BadModel, match="ffn_gate_shexp.weight.*expert_shared_feed_forward"):
        load_model(
            _rewrite(
                src, tmp_path / "a.gguf", drop_kv=("qwen2moe.expert_shared_feed_forward_length",)
            )
        )
    g = "blk.0.ffn_gate_inp_shexp.weight"
    m = load_model(_rewrite(src, tmp_path / "b.gguf", reshape={g: (1, 256)}))
    assert m.tensors[g].shape == (256,)
    assert np.array_equal(m.dequant(g), load_model(src).dequant(g))
    with pytest.raises(BadModel, match="output.weight.*qwen2moe"):
        load_model(_rewrite(src, tmp_path / "c.gguf", drop_t=("output.weight",)))


def test_reference_layer_is_llamacpps_graph(src):
    """The reference's MoE FFN of layer 0 against llama.cpp's graph restated in float64 numpy:
    moe_out (softmax, top 4, raw probs) + shexp(h) * silu(h . g) / (h . g)."""
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    m = load_model(src)
    b = ReferenceBackend(m, dtype=np.float64)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((9, 256))
    got = b._moe(0, h)

    def w(n):
        return m.dequant(f"blk.0.{n}.weight").astype(np.float64)

    def silu(x):
        return x / (1 + np.exp(-x))

    logits = h @ w("ffn_gate_inp").T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.zeros_like(h)
    for t in range(len(h)):
        for e in np.argsort(-p[t], kind="stable")[:4]:
            g, u, d = (w(f"ffn_{s}_exps")[e] for s in ("gate", "up", "down"))
            want[t] += p[t, e] * (d @ (silu(g @ h[t]) * (u @ h[t])))
    x = h @ w("ffn_gate_inp_shexp")
    shared = (silu(h @ w("ffn_gate_shexp").T) * (h @ w("ffn_up_shexp").T)) @ w("ffn_down_shexp").T
    want += shared * (silu(x) / x)[:, None]
    # float64 both ways: only the summation orders differ
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()
    assert np.abs(shared * (silu(x) / x)[:, None]).max() > 0.1 * np.abs(want).max()


def test_real_shape_preset():
    """qwen1.5-moe-a2.7b at Qwen1.5-MoE-A2.7B's shape: 14.3 B weights (its model card's), the
    shared expert 4x an expert's width, ffn_gate_inp and the 1-D shared gate kept F32 by the
    quantizer, the experts' down (K 1408, not a multiple of 256) on llama.cpp's Q5_0 / Q8_0
    fallbacks of Q4_K / Q6_K."""
    from minfer.tools.synth import PRESETS, tensor_plan

    plan = {p.name: p for p in tensor_plan(PRESETS["qwen1.5-moe-a2.7b"], "q4_K_M")}
    n = sum(int(np.prod(p.shape)) for p in plan.values())
    assert 14.2e9 < n < 14.4e9, n
    assert plan["blk.23.ffn_gate_exps.weight"].shape == (60, 1408, 2048)
    assert plan["blk.23.ffn_up_shexp.weight"].shape == (5632, 2048)
    assert plan["blk.0.attn_q.bias"].shape == (2048,)
    assert plan["blk.0.ffn_gate_inp_shexp.weight"].qtype == "F32"
    assert plan["blk.0.ffn_gate_inp.weight"].qtype == "F32"
    assert {plan[f"blk.{i}.ffn_down_exps.weight"].qtype for i in range(24)} == {"Q5_0", "Q8_0"}
    assert "output.weight" in plan


def test_gpu_refuses_it_for_now(src):
    from minfer.gguf.arch_keys import gpu_unsupported
    from minfer.gguf.loader import load_model

    assert "CPU reference only" in gpu_unsupported(load_model(src).config)
