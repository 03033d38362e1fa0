"""CPU: mixture-of-experts (qwen3moe, Mixtral-style llama + experts, qwen2moe's shared expert) on
the reference against llama.cpp, tie-aware about the router; the routing rules (softmax, top-k,
renormalized weights or not, the shared expert) each shown to matter; the stacked experts in the
quant types synth writes; the refusals (gpt-oss, DeepSeek; the CUDA backend, naming the weight
bytes of a 235B-A22B).

tests/golden/families/tiny-qwen3moe.*, tiny-mixtral.* and tiny-qwen2moe.* are llama.cpp's answers
(scripts/llama_oracle.py, libllama on the CPU) on the tiny F16 files of tests/families_data."""

from __future__ import annotations

import json
import types
from dataclasses import replace

import numpy as np
import pytest
from families_data import GOLDEN, PROMPT, synth_family

TOL = 0.03  # max |dlogit| against llama.cpp on an F16 file (the families' bar)
MOE = ("tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return {p: synth_family(p, d) for p in MOE}


def _run(m, ids):
    """(logits [T, vocab], router log) of the reference on ids."""
    from minfer.reference.forward import ReferenceBackend

    b = ReferenceBackend(m)
    b.router_log = []
    return b.window_logits(np.asarray(ids), 0), b.router_log


@pytest.mark.parametrize("preset", MOE)
def test_moe_matches_llamacpp(files, preset, report):
    from minfer.batch import single
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend
    from minfer.reference.moe import tie_excused
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.gates import compare_greedy, tau_from

    g = json.loads((GOLDEN / f"{preset}.json").read_text())
    want = np.load(GOLDEN / f"{preset}.npy")
    m = load_model(files[preset])
    ids = Tokenizer.from_metadata(m.metadata).encode(PROMPT, parse_special=True)
    assert ids == g["ids"]
    logits, log = _run(m, ids)
    errs = np.abs(logits[g["positions"]] - want).max(axis=1)
    ok, line = tie_excused(g["positions"], errs, log, TOL)
    assert ok, f"{preset}: {line}"
    res = single.run(ReferenceBackend(m), ids, n_greedy=32, warmup=False)
    v = compare_greedy(
        res.greedy_ids, g["greedy"], g["margins"], tau_from(res.last_logits, want[-1])
    )
    assert v.ok, f"{preset}: {v.describe()}"
    report(
        f"moe {preset}: max |dlogit| {errs.max():.4f} vs llama.cpp ({line}), greedy {v.describe()}"
    )


# the routing rule each family's graph asks for, and a config without it
DROPS = [
    ("tiny-qwen3moe", {"moe_norm_w": False}),
    ("tiny-mixtral", {"moe_norm_w": False}),
    ("tiny-qwen3moe", {"n_expert_used": 2}),
    ("tiny-mixtral", {"n_expert_used": 1}),
    ("tiny-mixtral", {"moe_w_scale": 2.0}),
    ("tiny-qwen2moe", {"moe_norm_w": True}),  # qwen2moe's weights are the raw probs
    ("tiny-qwen2moe", {"d_ff_shexp": 0}),  # without the shared expert
]


@pytest.mark.parametrize("preset,drop", DROPS)
def test_routing_rule_has_teeth(files, preset, drop):
    from minfer.gguf.loader import load_model

    g = json.loads((GOLDEN / f"{preset}.json").read_text())
    want = np.load(GOLDEN / f"{preset}.npy")
    m = load_model(files[preset])
    m.config = replace(m.config, **drop)
    err = float(
        np.abs(
            _run(m, g["ids"][:160])[0][[p for p in g["positions"] if p < 160]]
            - want[: sum(p < 160 for p in g["positions"])]
        ).max()
    )
    assert err > 10 * TOL, f"{preset} with {drop}: only {err:.4f} from llama.cpp"


def test_route_softmax_topk_norm_and_ties():
    from minfer.reference.moe import near_ties, route, tie_excused

    logits = np.array([[0.0, 2.0, 1.0, 2.0], [3.0, 0.0, 1.0, -1.0]], dtype=np.float32)
    sel, w, gap = route(logits, 2)
    assert sel.tolist() == [[1, 3], [0, 2]]  # rank order; equal probs: the lower index first
    assert np.allclose(w.sum(axis=1), 1) and np.allclose(w[0], 0.5)
    assert gap[0] == 1.0 and gap[1] == 1.0
    sel1, w1, gap1 = route(logits, 1)
    assert gap1[0] == 0.0 and near_ties(gap1).tolist() == [0]  # token 0: 1 vs 3, a tie
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    _, wn, _ = route(logits, 2, norm_w=False)
    assert np.allclose(wn[1], p[1, [0, 2]])  # the raw softmax probs without norm_w
    # the gate: a position past a near tie may differ; one before it may not
    log = [(0, np.array([1.0, 1.0, 0.001, 1.0]))]
    assert tie_excused([1, 3], [0.0, 0.5], log, 0.03)[0]
    ok, line = tie_excused([1, 3], [0.5, 0.0], log, 0.03)
    assert not ok and "before any router tie" in line
    assert not tie_excused([3], [0.5], [(0, np.ones(4))], 0.03)[0]


def test_moe_file_reads_and_describes(files):
    from minfer.families import schema_of
    from minfer.gguf.loader import load_model

    q = load_model(files["tiny-qwen3moe"])
    c = q.config
    assert (c.n_expert, c.n_expert_used, c.d_ff_exp, c.qk_norm, c.rope_neox) == (
        8,
        4,
        256,
        True,
        True,
    )
    assert q.tensors["blk.0.ffn_down_exps.weight"].shape == (8, 256, 256)
    assert "ffn_gate.weight" not in {t.name for t in schema_of(c).tensors}
    assert "experts 8 x ff 256, 4 used per token" in q.describe()
    x = load_model(files["tiny-mixtral"]).config
    assert (x.arch, x.n_expert, x.n_expert_used, x.d_ff_exp) == ("llama", 8, 2, 512)


@pytest.mark.parametrize("ftype", ["q8_0", "q4_K_M"])
def test_stacked_experts_quantized(tmp_path, ftype):
    """Each expert's dequantized slice is that expert's rows of the whole stack; Mixtral's
    8-expert type rules (attn_v, attn_k Q8_0); the forward runs."""
    from minfer.gguf.loader import load_model
    from minfer.quants import dequantize
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    path = tmp_path / "m.gguf"
    make_synthetic_model(
        path,
        SynthOptions(
            preset="tiny-mixtral", qtype=ftype, vocab=1024, tokenizer_from=None, workers=1
        ),
        progress=False,
    )
    m = load_model(path)
    t = m.tensors["blk.1.ffn_down_exps.weight"]
    assert t.type_name == ("Q8_0" if ftype == "q8_0" else "Q6_K")  # use_more_bits(1, 2)
    assert m.tensors["blk.0.ffn_gate_exps.weight"].type_name == ftype[:4].upper()
    assert m.tensors["blk.0.attn_v.weight"].type_name == "Q8_0"
    assert m.tensors["blk.0.attn_k.weight"].type_name == "Q8_0"
    assert m.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
    whole = dequantize(t.data, t.qtype)
    b = ReferenceBackend(m)
    for e in (0, 5):
        assert np.array_equal(b.expert(t.name, e), whole[e])
    assert np.isfinite(b.forward(np.arange(20), 0)).all()


def test_refusals_by_name():
    from minfer.errors import Unsupported
    from minfer.families import family
    from minfer.gguf.arch_keys import check_keys, gpu_unsupported

    for arch, what in (
        ("gpt-oss", "attention sinks"),
        ("deepseek2", "MLA"),
        ("deepseek", "shared experts"),
    ):
        with pytest.raises(Unsupported, match=what):
            family(arch)
    with pytest.raises(Unsupported, match="mixture-of-experts"):
        check_keys("m.gguf", "qwen2", {"qwen2.expert_count": 8})
    check_keys("m.gguf", "qwen3moe", {"qwen3moe.expert_weights_scale": 2.5})  # inert there
    cfg = types.SimpleNamespace(arch="qwen3moe", n_expert=128, n_expert_used=8, head_dim=128)
    assert gpu_unsupported(cfg) == ""  # minfer.cuda.load.moe runs it
    why = gpu_unsupported(types.SimpleNamespace(**{**vars(cfg), "n_expert": 600}))
    assert why.startswith("mixture-of-experts with 600 experts") and "at most 512" in why


def test_cuda_refusal_names_the_bytes():
    """A 235B-A22B at Q4_K_M: its planned bytes beyond one GPU, named; a 30B-A3B fits."""
    from minfer.cuda.backend import moe_bytes_note
    from minfer.gguf.write import expected_nbytes
    from minfer.tools.synth import PRESETS, tensor_plan

    def fake(preset):
        import gguf

        shape = replace(PRESETS[preset], vocab=151936)
        ts = {
            p.name: types.SimpleNamespace(
                data=types.SimpleNamespace(
                    nbytes=expected_nbytes(p.name, int(gguf.GGMLQuantizationType[p.qtype]), p.shape)
                )
            )
            for p in tensor_plan(shape, "q4_K_M")
        }
        return types.SimpleNamespace(
            config=types.SimpleNamespace(n_expert=shape.n_expert), tensors=ts
        )

    big = moe_bytes_note(fake("qwen3-235b-a22b"))
    assert "more than one 141.0 GB GPU" in big and "experts" in big, big
    assert "more than one" not in moe_bytes_note(fake("qwen3-30b-a3b"))
