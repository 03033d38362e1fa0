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


def test_shared_add_twin_and_launcher():
    """x += sigmoid(gl) * y: the twin against float64, the launch's grid and checks."""
    from test_moe_cuda_cpu import _RT, _dev

    from minfer.cuda.ops import moe as M
    from minfer.errors import GPUError

    rng = np.random.default_rng(1)
    T, D = 7, 40
    x0 = rng.standard_normal((T, D)).astype(np.float32)
    y = rng.standard_normal((T, D)).astype(np.float32)
    gl = (rng.standard_normal((T, 1)) * 4).astype(np.float32)
    x = M.shared_add_ref(x0.copy(), y, gl)
    want = x0 + y / (1 + np.exp(-gl.astype(np.float64)))
    assert np.abs(x - want).max() <= 4 * np.finfo(np.float32).eps * np.abs(want).max()
    rt = _RT()
    M.shared_add(rt, _dev((T, D), np.float32), _dev((T, D), np.float32), _dev((T, 1), np.float32))
    fn, grid, block, args = rt.launches[-1]
    assert fn == ("moe", "moe_shared_add_f32") and grid == (T,) and int(args[-1]) == D
    with pytest.raises(GPUError, match="gl"):
        M.shared_add(
            rt, _dev((T, D), np.float32), _dev((T, D), np.float32), _dev((T, 2), np.float32)
        )
    with pytest.raises(GPUError, match="shared_add y: dtype float16"):
        M.shared_add(rt, _dev((T, D), np.float32), _dev((T, D), np.float16), _dev((T,), np.float32))


@pytest.fixture(scope="module")
def q4(tmp_path_factory):
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    path = tmp_path_factory.mktemp("q2moe4") / "q.gguf"
    make_synthetic_model(
        path,
        SynthOptions(preset=P, qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1),
        progress=False,
    )
    return path


def test_moe_layer_with_shared_expert_on_the_heap_runtime(monkeypatch, q4):
    """MoeLayers on the heap runtime (tests/moe_heap.py: moe.cu's entries and the f16 GEMM in
    numpy): the shared expert's f16 weights as the dense f16 path uploads them (gate|up
    interleaved per 16 rows), ffn() launches the routed experts then the shared expert's three
    GEMMs and moe_shared_add_f32; the result equals the twins composed, and the CPU reference's
    MoE within the f16 rounding of the activations (test_moe_cuda_cpu's bound)."""
    from contextlib import nullcontext

    from moe_heap import install

    from minfer.cuda.load.moe import MoeLayers
    from minfer.cuda.ops import moe as M
    from minfer.cuda.paths.f16.moe import shared_ref
    from minfer.cuda.runtime import devarray as da
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    rt = install(monkeypatch)
    m = load_model(q4)
    c = m.config
    ml = MoeLayers(rt, m, ubatch=48, chunk=8 << 10)
    il = 1
    p = f"blk.{il}."

    def f16(s):
        return m.dequant(p + s + ".weight").astype(np.float16)

    w = {s: f16(s) for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
    gu = M.interleave_glu(f16("ffn_gate_shexp")[None], f16("ffn_up_shexp")[None])[0]
    assert np.array_equal(ml.w[p + "ffn_gate_up_shexp.weight"].get(), gu)
    assert np.array_equal(ml.w[p + "ffn_down_shexp.weight"].get(), f16("ffn_down_shexp"))
    g16 = ml.w[p + "ffn_gate_inp_shexp.weight"].get()
    assert g16.shape == (1, c.d_model) and np.array_equal(g16[0], f16("ffn_gate_inp_shexp"))
    rng = np.random.default_rng(5)
    for T in (37, 1):
        h16 = rng.standard_normal((T, c.d_model)).astype(np.float16)
        x0 = rng.standard_normal((T, c.d_model)).astype(np.float32)
        x = da.to_device(rt, x0)
        rt.launches.clear()
        ml.ffn(rt, il, x, da.to_device(rt, h16), lambda *a: nullcontext())
        assert rt.launches == [  # (the f16 GEMMs: the stub's, not recorded)
            "moe_route_f32",
            "moe_sort",
            "moe_mma_f16_glu",
            "moe_mma_f16",
            "moe_combine_f32",
            "moe_shared_add_f32",
        ], rt.launches
        routed, _, _ = M.moe_ffn_ref(h16, *w.values(), c.n_expert_used, norm_w=False)
        want = x0 + routed
        shared_ref(want, h16, g16, gu, f16("ffn_down_shexp"))
        got = x.get()
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want - x0).max()
        assert np.abs(got - (x0 + routed)).max() > 0.1 * np.abs(want - x0).max()  # it counts
        ref = ReferenceBackend(m)._moe(il, h16.astype(np.float32))
        assert np.abs((got - x0) - ref).max() <= 2e-3 * np.abs(ref).max()


def test_check_moe_rows_with_the_shared_expert(monkeypatch, q4):
    """`minfer check`'s MoE rows on qwen2moe (the heap runtime): its twins include the shared
    expert, so the layer passes (without it every row would be off by the shared expert)."""
    from moe_heap import install

    from minfer.gguf.loader import load_model
    from minfer.tools.check import moe_rows

    rt = install(monkeypatch)
    rows = moe_rows(rt, load_model(q4))
    assert len(rows) == 2 * 3 and all(r[-1] for r in rows), rows


def test_plan_counts_the_shared_expert():
    """qwen1.5-moe-a2.7b: the planner's expert bytes = routers + experts + shared experts (and
    their gates) as f16; the activations grow by the shared expert's buffers."""
    import types

    from synth_data import fake_moe_model

    from minfer.cuda.plan import moe

    s, cfg, fake = fake_moe_model("qwen1.5-moe-a2.7b")
    per_layer = s.n_expert * (3 * s.d_ff_exp * s.d_model + s.d_model)
    per_layer += 3 * s.d_ff_shexp * s.d_model + s.d_model
    assert moe.weight_bytes(fake) == s.n_layers * per_layer * 2
    T = 512
    none = types.SimpleNamespace(**{**vars(cfg), "d_ff_shexp": 0})
    grow = moe.act_bytes(cfg, T) - moe.act_bytes(none, T)
    assert grow == T * (4 + 2 * s.d_ff_shexp + 4 * s.d_model)
