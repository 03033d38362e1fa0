"""GPU: CudaBackend.window_logits (perplexity's scored rows) against the CPU reference, and
`minfer perplexity --backend cuda` end to end, KL divergence against a CPU base.

Models: the tiny synthetic Q4_K_M model and MINFER_TEST_MODEL (e.g. the default model sliced
for the device) when set (conftest). The f16 path against the f32 CPU reference differs by f16
rounding of the GEMM operands only, so its KLD must sit far below gate 6's 0.003.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_inproc import run_cli

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("ubatch", [64, 24])  # the window as one chunk, and in three
def test_window_logits_match_reference(model, ubatch):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.perplexity.windows import compare_rows

    ids = (np.random.default_rng(1).integers(0, model.config.vocab_size, 64)).astype(np.int32)
    gpu = CudaBackend(model, GemmChoice("f16"), max_tokens=64, ubatch=ubatch)
    gpu.HEAD_ROWS = 13  # ragged head blocks
    cpu = ReferenceBackend(model, max_tokens=64)
    got = gpu.window_logits(ids, 20)
    want = cpu.window_logits(ids, 20)
    assert got.shape == want.shape == (44, model.config.vocab_size)
    kld, same, dmax = compare_rows(want, got)
    scale = float(np.abs(want).max())
    assert dmax <= 0.02 * scale, (dmax, scale)
    assert kld.mean() < 1e-3, kld.mean()
    # the last row is what forward() gives for the whole window on the same backend
    gpu.reset()
    last = gpu.forward(ids, 0)
    np.testing.assert_allclose(got[-1], last, atol=1e-3 * scale)
    # a window after a longer one starts fresh (the cache is reset, not appended to)
    again = gpu.window_logits(ids[:40], 20)
    np.testing.assert_allclose(again, got[:20], atol=1e-3 * scale)


def test_perplexity_cli_cuda_vs_cpu_base(model, tmp_path):
    base = tmp_path / "cpu.logits"
    args = ["perplexity", "-m", str(model.path), "--ctx", "64", "--chunks", "3", "--json"]
    code, out, err = run_cli([*args, "--backend", "cpu", "--save-logits", str(base)])
    assert code == 0, err
    cpu = json.loads(out)
    code, out, err = run_cli([*args, "--backend", "cuda", "--gemm", "f16", "--kld-base", str(base)])
    assert code == 0, err
    r = json.loads(out)
    k = r["kld"]
    assert r["backend"].startswith("cuda") and r["n_scored"] == 3 * 31
    assert k["base_ppl"] == pytest.approx(cpu["ppl"], rel=1e-9)
    assert r["ppl"] == pytest.approx(cpu["ppl"], rel=2e-2)
    assert k["mean"] < 3e-3 and k["p99"] < 3e-2, k
    assert k["same_top1"] >= 0.8, k
    print(
        f"\n{model.path.name}: PPL cuda {r['ppl']:.4f} cpu {cpu['ppl']:.4f}, mean KLD "
        f"{k['mean']:.2e}, p99 {k['p99']:.2e}, same top-1 {100 * k['same_top1']:.1f} %, "
        f"max |dlogit| {k['max_abs_dlogit']:.4f}"
    )
