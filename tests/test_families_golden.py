"""CPU: minfer's reference forward against llama.cpp on each family's tiny synthetic file.

tests/golden/families/ holds llama.cpp's answers (scripts/llama_oracle.py: libllama on the CPU)
for the tiny F16 files of tests/families_data.FAMILIES, rebuilt here byte for byte. Per
family: the tokenizer gives llama.cpp's prompt ids; the reference's logits at the kept prompt
positions are within 0.03 of llama.cpp's; the 32 greedy ids are tie-aware identical (gate 3).
Each family also shows that the test has teeth: with its feature dropped (the RoPE scaling
minfer ignored before it read rope_freqs.weight and rope.scaling.*; qwen3's q/k norms; gemma3's
sliding window, local RoPE base, post norms, GeGLU, embedding scale) the logits move by far
more than the tolerance; for gemma3 so do a window one position too wide or too narrow and
the RoPE scaling applied to the local layers too; for gemma2 dropping the attention or the
final soft-cap or the window, the odd layers local instead of the even ones, and the 27B's
query scale on this shape; for phi3's long-context RoPE (tiny-phi3-long: rope_factors_long /
_short, rope.scaling.attn_factor) the long factors at the model's context and the short ones
at llama.cpp's -c 512 (its original context) both match, and dropping the factors, the
attention factor, or taking the other set is caught.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from families_data import CTX_GOLDEN, FAMILIES, GOLDEN, PROMPT, SPECIAL_PROMPT, synth_family

TOL = 0.03  # max |dlogit| against llama.cpp on an F16 file (the bar)


@pytest.fixture(scope="module")
def family_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    return {p: synth_family(p, d) for p in FAMILIES}


def _golden(preset):
    g = json.loads((GOLDEN / f"{preset}.json").read_text())
    return g, np.load(GOLDEN / f"{preset}.npy")


def _logits(model, ids):
    from minfer.reference.forward import ReferenceBackend

    return ReferenceBackend(model).window_logits(np.asarray(ids), 0)


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_family_matches_llamacpp(family_files, preset, report):
    from minfer.batch import single
    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend
    from minfer.text.tokenizer import Tokenizer
    from minfer.tools.gates import compare_greedy, tau_from

    g, want = _golden(preset)
    m = load_model(family_files[preset])
    tok = Tokenizer.from_metadata(m.metadata)
    ids = tok.encode(PROMPT, parse_special=True)
    assert ids == g["ids"], "tokenizer ids differ from llama.cpp's"
    assert tok.encode(SPECIAL_PROMPT, parse_special=True) == g["special_ids"]

    got = _logits(m, ids)[g["positions"]]
    err = float(np.abs(got - want).max())
    assert err <= TOL, f"{preset}: max |dlogit| {err:.4f} vs llama.cpp > {TOL}"

    res = single.run(ReferenceBackend(m), ids, n_greedy=32, warmup=False)
    tau = tau_from(res.last_logits, want[-1])
    v = compare_greedy(res.greedy_ids, g["greedy"], g["margins"], tau)
    assert v.ok, f"{preset}: {v.describe()}"
    report(
        f"family {preset} ({FAMILIES[preset]}): ids = llama.cpp's ({len(ids)}), "
        f"max |dlogit| {err:.4f}, greedy {v.describe()}"
    )


# what each family adds over plain llama, and the config that drops it
DROPS = [
    ("tiny-llama3", "rope_scaling"),
    ("tiny-linear", "rope_scaling"),
    ("tiny-qwen2-yarn", "rope_scaling"),
    ("tiny-qwen3", "qk_norm"),
    ("tiny-gemma3", "sliding_window"),
    ("tiny-gemma3", "rope_base_swa"),
    ("tiny-gemma3", "post_norms"),
    ("tiny-gemma3", "ffn_gelu"),
    ("tiny-gemma3", "embed_scale"),
    ("tiny-gemma3", "qk_norm"),
    ("tiny-gemma2", "attn_softcap"),
    ("tiny-gemma2", "logit_softcap"),
    ("tiny-gemma2", "sliding_window"),
    ("tiny-phi3-long", "rope_scaling"),
    ("tiny-granite", "embed_scale"),
    ("tiny-granite", "residual_scale"),
    ("tiny-granite", "kq_scale"),
    ("tiny-granite", "logit_mul"),
    ("tiny-olmo2", "post_norms"),
    ("tiny-olmo2", "qk_norm"),
    ("tiny-smollm3", "rope_layers"),
]


def _plain(cfg, feature):
    """The config value that drops `feature` (what minfer computed without it)."""
    from minfer.gguf.loader import RopeScaling

    return {
        "rope_scaling": RopeScaling(),
        "qk_norm": False,
        "sliding_window": 0,
        "rope_base_swa": cfg.rope_base,  # local layers on the global base
        "post_norms": False,
        "ffn_gelu": False,
        "embed_scale": 1.0,
        "attn_softcap": 0.0,
        "logit_softcap": 0.0,
        "residual_scale": 1.0,
        "kq_scale": 0.0,
        "logit_mul": 1.0,  # granite's scalars
        "rope_layers": (),
    }[feature]  # smollm3: RoPE on every layer


@pytest.mark.parametrize("preset, feature", DROPS)
def test_dropping_the_family_feature_is_caught(family_files, preset, feature):
    """Without its feature (what minfer did before it read it) a family's logits move far past
    the tolerance: the golden comparison has teeth."""
    from minfer.gguf.loader import load_model

    g, want = _golden(preset)
    m = load_model(family_files[preset])
    plain = _plain(m.config, feature)
    assert getattr(m.config, feature) != plain
    object.__setattr__(m, "config", replace(m.config, **{feature: plain}))
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, f"{preset} without {feature}: only {err:.4f} off llama.cpp"


@pytest.mark.parametrize("change", ["window + 1", "window - 1", "local layers scaled"])
def test_gemma3_window_edge_and_local_rope_are_caught(family_files, monkeypatch, change):
    """llama.cpp's exact rules matter: a local query at p sees keys p - window < j <= p (one
    more or one fewer moves the logits past 10x the tolerance), and the RoPE scaling (linear x8)
    applies to the global layers only (local ones: rope_freq_scale_train_swa = 1)."""
    from minfer.gguf.loader import ModelConfig, load_model
    from minfer.reference import ops

    g, want = _golden("tiny-gemma3")
    m = load_model(family_files["tiny-gemma3"])
    if change == "local layers scaled":
        assert not m.config.rope_scaling.plain
        monkeypatch.setattr(
            ModelConfig,
            "layer_rope",
            lambda c, il: (c.rope_base_swa if c.is_local(il) else c.rope_base, c.rope_scaling),
        )
    else:
        step = 1 if change == "window + 1" else -1
        attention = ops.attention

        def shifted(*a, window=0, **k):
            return attention(*a, window=window + step if window else 0, **k)

        monkeypatch.setattr(ops, "attention", shifted)
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, f"tiny-gemma3 with the {change}: only {err:.4f} off llama.cpp"


@pytest.mark.parametrize("change", ["odd layers local", "27B query scale"])
def test_gemma2_layer_pattern_and_query_scale_are_caught(family_files, change):
    """llama.cpp's gemma2 rules: the even layers are local (load_swa_pattern(ml, 2): il % 2 <
    1), and q is scaled by 1/sqrt(key_length) (1/sqrt(n_embd / n_head) only for the 46-layer
    27B): the other choice moves the logits past 10x the tolerance."""
    from minfer.gguf.loader import load_model

    g, want = _golden("tiny-gemma2")
    m = load_model(family_files["tiny-gemma2"])
    c = m.config
    assert c.swa_layers == (True, False, True, False)
    assert c.attn_scale == float(np.float32(1) / np.sqrt(np.float32(128)))
    if change == "odd layers local":
        new = replace(c, swa_layers=tuple(not x for x in c.swa_layers))
    else:
        new = replace(c, attn_scale=float(np.float32(1) / np.sqrt(np.float32(256 // 4))))
    object.__setattr__(m, "config", new)
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, f"tiny-gemma2 with the {change}: only {err:.4f} off llama.cpp"


def test_phi3_fused_weights_split_as_llamacpp(family_files):
    """phi3's attn_qkv and 2-ff ffn_up are read as row views (the gate half first): swapping
    the halves, as a wrong split would, moves the logits far past the tolerance."""
    from minfer.gguf.loader import load_model

    g, want = _golden("tiny-phi3")
    m = load_model(family_files["tiny-phi3"])
    assert not any(n.endswith(("attn_qkv.weight",)) for n in m.tensors)
    for i in range(m.config.n_layers):
        gate, up = (f"blk.{i}.ffn_{x}.weight" for x in ("gate", "up"))
        assert m.tensors[gate].data.base is not None  # a view into the file's map, no copy
        m.tensors[gate], m.tensors[up] = m.tensors[up], m.tensors[gate]
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, err


def test_tekken_pre_tokenizer_gives_llamacpp_ids(tmp_path):
    """tokenizer.ggml.pre = tekken (Mistral Nemo and later): llama.cpp's ids on mixed case,
    accents, digits, slashes and CRLF (golden: scripts/llama_oracle.cpp on this small model)."""
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    g = json.loads((GOLDEN / "tekken-ids.json").read_text())
    meta, tensors = small_parts(vocab=1024, d_model=64)
    meta["tokenizer.ggml.pre"] = "tekken"
    m = load_model(write_small(tmp_path / "tekken.gguf", meta, tensors))
    assert Tokenizer.from_metadata(m.metadata).encode(g["text"], parse_special=True) == g["ids"]


# phi3's long-context RoPE (Phi-3-mini-128k, Phi-3.5-mini): llama.cpp's two runs of the one file
# (tests/families_data.CTX_GOLDEN): at the model's context (4096 > the original 512: the long
# factors, what minfer's loader picks) and at -c 512 (the short ones: for_context(512))
PHI3_LONG = {"tiny-phi3-long": None, "tiny-phi3-long@512": 512}


def _phi3_long(family_files, n_ctx):
    from minfer.gguf.loader import load_model

    m = load_model(family_files["tiny-phi3-long"])
    if n_ctx is not None:
        object.__setattr__(m, "config", m.config.for_context(n_ctx))
    return m


@pytest.mark.parametrize("golden", list(PHI3_LONG))
def test_phi3_long_and_short_factors_match_llamacpp(family_files, golden, report):
    """The factor set llama.cpp picks for its context (long past the original context, short up
    to it) and the attention factor: logits within the tolerance, greedy tie-aware identical."""
    from minfer.batch import single
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.gates import compare_greedy, tau_from

    g, want = _golden(golden)
    assert CTX_GOLDEN.get(golden, ("tiny-phi3-long", None))[1] == PHI3_LONG[golden]
    m = _phi3_long(family_files, PHI3_LONG[golden])
    sc = m.config.rope_scaling
    assert sc.longrope_long == (PHI3_LONG[golden] is None)
    assert sc.freq_factors == sc.longrope[0 if sc.longrope_long else 1]
    assert sc.attn_factor == pytest.approx(float(np.sqrt(1 + np.log(8) / np.log(512))), 1e-7)
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err <= TOL, f"{golden}: max |dlogit| {err:.4f} vs llama.cpp > {TOL}"
    res = single.run(ReferenceBackend(m), g["ids"], n_greedy=32, warmup=False)
    v = compare_greedy(
        res.greedy_ids, g["greedy"], g["margins"], tau_from(res.last_logits, want[-1])
    )
    assert v.ok, f"{golden}: {v.describe()}"
    report(f"family {golden} ({sc.describe()}): max |dlogit| {err:.4f}, greedy {v.describe()}")


@pytest.mark.parametrize("golden", list(PHI3_LONG))
@pytest.mark.parametrize("change", ["no factors", "no attn factor", "other factors"])
def test_phi3_long_rope_parts_are_caught(family_files, golden, change):
    """Each part of phi3's long-context RoPE moves the logits past 10x the tolerance: the
    factors dropped (attention factor kept), the attention factor dropped (factors kept), the
    other factor set (long for short, short for long)."""
    g, want = _golden(golden)
    m = _phi3_long(family_files, PHI3_LONG[golden])
    sc = m.config.rope_scaling
    if change == "no factors":
        sc = replace(sc, freq_factors=None, longrope=None)
    elif change == "no attn factor":
        sc = replace(sc, attn_factor=1.0)
    else:
        sc = sc.for_context(512 if sc.longrope_long else 4096)
        assert sc.freq_factors != m.config.rope_scaling.freq_factors
    object.__setattr__(m, "config", replace(m.config, rope_scaling=sc))
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, f"{golden} with {change}: only {err:.4f} off llama.cpp"
