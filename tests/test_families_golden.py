"""CPU: minfer's reference forward against llama.cpp on each family's tiny synthetic file.

tests/golden/families/ holds llama.cpp's answers (scripts/llama_oracle.py: libllama on the CPU)
for the tiny F16 files of tests/families_data.FAMILIES, rebuilt here byte for byte. Per
family: the tokenizer gives llama.cpp's prompt ids; the reference's logits at the kept prompt
positions are within 0.03 of llama.cpp's; the 32 greedy ids are tie-aware identical (gate 3).
The RoPE scaling families also show that the test has teeth: with the scaling dropped (what
minfer did before it read rope_freqs.weight and rope.scaling.*) the logits move by far more
than the tolerance.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from families_data import FAMILIES, GOLDEN, PROMPT, synth_family

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
    from minfer import engine
    from minfer.gates import compare_greedy, tau_from
    from minfer.loader import load_model
    from minfer.reference.forward import ReferenceBackend
    from minfer.tokenizer import Tokenizer

    g, want = _golden(preset)
    m = load_model(family_files[preset])
    ids = Tokenizer.from_metadata(m.metadata).encode(PROMPT, parse_special=True)
    assert ids == g["ids"], "tokenizer ids differ from llama.cpp's"

    got = _logits(m, ids)[g["positions"]]
    err = float(np.abs(got - want).max())
    assert err <= TOL, f"{preset}: max |dlogit| {err:.4f} vs llama.cpp > {TOL}"

    res = engine.run(ReferenceBackend(m), ids, n_greedy=32, warmup=False)
    tau = tau_from(res.last_logits, want[-1])
    v = compare_greedy(res.greedy_ids, g["greedy"], g["margins"], tau)
    assert v.ok, f"{preset}: {v.describe()}"
    report(f"family {preset} ({FAMILIES[preset]}): ids = llama.cpp's ({len(ids)}), "
           f"max |dlogit| {err:.4f}, greedy {v.describe()}")


@pytest.mark.parametrize("preset", [p for p in FAMILIES if p != "tiny"])
def test_dropping_the_rope_scaling_is_caught(family_files, preset):
    from minfer.loader import RopeScaling, load_model

    g, want = _golden(preset)
    m = load_model(family_files[preset])
    assert not m.config.rope_scaling.plain
    object.__setattr__(m, "config", replace(m.config, rope_scaling=RopeScaling()))
    err = float(np.abs(_logits(m, g["ids"])[g["positions"]] - want).max())
    assert err > 10 * TOL, f"{preset}: plain RoPE is only {err:.4f} off llama.cpp"
