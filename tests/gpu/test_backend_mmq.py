"""CudaBackend on the raw int8 paths of the table (r1, narrow, wide-kd4, wide-kd8): raw weights only, shared q8_1 scratch, logits vs the f16 path,
the tie-aware greedy-32 gate vs the CPU reference, ragged ubatch chunks and M=1 decode.

Model: a tiny synthetic Q4_K_M model (every GEMM weight q4_K/q6_K, K % 256 == 0, tied q6_K LM
head); with MINFER_TEST_MODEL set (e.g. a sliced real model on the device), that one too.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

PATHS = ["r1", "narrow", "wide-kd4", "wide-kd8"]  # (blk: test_blk_device)


@pytest.fixture(scope="module")
def f16_logits(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.vocab_size, 37).astype(np.int32)
    b = CudaBackend(model, GemmChoice("f16"), max_tokens=128, ubatch=16)
    return prompt, b.forward(prompt, 0)


@pytest.mark.parametrize("path", PATHS)
def test_mmq_backend_matches_f16(model, f16_logits, path):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    prompt, ref = f16_logits
    b = CudaBackend(model, GemmChoice(path), max_tokens=128, ubatch=16)  # 16+16+5
    mmq = [n for n, (p, _) in b.routes.items() if p != "f16"]
    if not mmq:
        pytest.skip(f"{model.path.name}: no q4_K/q6_K GEMM weight")
    assert {b.routes[n][0] for n in mmq} == {path}
    for n in mmq:  # raw bytes only, no f16 copy
        assert b.w[n].dtype == np.uint8 and b.w[n].nbytes == model.tensor(n).data.nbytes
    assert "MMQ (" in b.route_summary() and f"{len(mmq)} GEMMs" in b.route_summary()
    got = b.forward(prompt, 0)
    assert np.all(np.isfinite(got))
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert rel < 3e-2, f"{path}: logits rel err vs f16 path {rel:.2e}"
    # M=1 decode steps after the prefill (MMQ on one token, KV cache appended)
    nxt = b.forward(np.array([int(np.argmax(got))], np.int32), len(prompt))
    assert np.all(np.isfinite(nxt)) and b.n_past == len(prompt) + 1
    # one ubatch vs ragged chunks: the shared q8_1 scratch is reused at every M
    b.reset()
    b2 = CudaBackend(model, GemmChoice(path), max_tokens=128, ubatch=64)
    one = b2.forward(prompt, 0)
    assert np.linalg.norm(one - got) / np.linalg.norm(one) < 5e-3


@pytest.mark.parametrize("path", ["narrow", "wide-kd8"])
def test_mmq_backend_greedy_gate(model, path):
    from minfer.batch import single
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.check import identity_verdict

    rng = np.random.default_rng(5)
    prompt = [int(i) for i in rng.integers(0, model.config.vocab_size, 21)]
    ref = single.run(ReferenceBackend(model), prompt, 32, 512)
    res = single.run(CudaBackend(model, GemmChoice(path), max_tokens=64), prompt, 32, 8)
    v, diff = identity_verdict(ref, res)
    print(f"\n{model.path.name} {path}: {v.describe()} (max |dlogit| {diff:.4f})")
    assert v.ok, v.describe()
    assert v.identical_through >= 1


def test_mmq_backend_memory_plan(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice

    f = CudaBackend(model, GemmChoice("f16"), max_tokens=32, ubatch=32, warmup=False)._plan()
    b = CudaBackend(model, GemmChoice("wide-kd4"), max_tokens=32, ubatch=32, warmup=False)
    m = b._plan()
    if m["MMQ weights"] == 0 and m["f16 weights"] == f["f16 weights"]:
        pytest.skip("no MMQ weights in this model")
    assert m["f16 weights"] < f["f16 weights"]
    keys = ("q8_1 scratch", "blk operand scratch")
    assert not any(f[k] for k in keys)
    # the raw kernels read q8_1 activations: that scratch only
    assert m["q8_1 scratch"] > 0 and not m["blk operand scratch"]
