"""GPU: the RoPE-scaled families on every GPU path. The CUDA kernels read RoPE from the
device cos/sin table (layers.RopeTable, built by the reference's rope_cos_sin with the file's
scaling), so the rope, rope_qkv and fused GEMM-epilogue kernels all apply it:
- the f16 path's logits on each family's tiny F16 file are within 0.03 of llama.cpp's own
  (tests/golden/families) and its greedy ids tie-aware identical to llama.cpp's;
- `minfer check` passes on each family's tiny Q4_K_M file (every path against the scaled
  reference: parity and greedy identity)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from families_data import FAMILIES, GOLDEN, synth_family

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_f16_path_matches_llamacpp(tmp_path, preset, report):
    from minfer.batch import single
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.gguf.loader import load_model
    from minfer.tools.gates import compare_greedy, tau_from

    g = json.loads((GOLDEN / f"{preset}.json").read_text())
    want = np.load(GOLDEN / f"{preset}.npy")
    m = load_model(synth_family(preset, tmp_path))
    _gpu_runs(m)
    be = CudaBackend(m, GemmChoice("f16"), max_tokens=512, ubatch=512)
    res = single.run(be, g["ids"], n_greedy=32)
    err = float(np.abs(res.last_logits - want[-1]).max())
    assert err <= 0.03, f"{preset}: cuda f16 max |dlogit| {err:.4f} vs llama.cpp"
    v = compare_greedy(
        res.greedy_ids, g["greedy"], g["margins"], tau_from(res.last_logits, want[-1])
    )
    assert v.ok, f"{preset}: {v.describe()}"
    report(f"cuda f16 {preset}: max |dlogit| vs llama.cpp {err:.4f}, greedy {v.describe()}")


def _gpu_runs(model) -> None:
    """Skip a family the CUDA backend does not run (arch_keys.gpu_unsupported: CPU only)."""
    from minfer.gguf.arch_keys import gpu_unsupported

    why = gpu_unsupported(model.config)
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("preset", [p for p in FAMILIES if p != "tiny"])
def test_check_passes_on_scaled_family(tmp_path, preset):
    from click.testing import CliRunner

    from minfer.commands.check import check
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    path = tmp_path / f"{preset}-q4km.gguf"
    make_synthetic_model(
        path,
        SynthOptions(preset=preset, qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1),
        progress=False,
    )
    from minfer.gguf.loader import load_model

    _gpu_runs(load_model(path))
    r = CliRunner().invoke(check, ["-m", str(path), "-p", "The quick brown fox " * 24])
    assert r.exit_code == 0, r.output
    assert "check: PASS" in r.output
