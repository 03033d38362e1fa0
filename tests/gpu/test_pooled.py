"""Pooled jobs on the GPU (issue 52): rmsnorm_rows into f32 against its numpy twin and the
whole-chunk kernel, CudaBackend.packed(hidden=) against the CPU reference (hidden states and
the label logits LabelHead makes of them), and Engine.embed / score / rerank on cuda against
the cpu backend."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err

pytestmark = pytest.mark.gpu


def test_rmsnorm_rows_f32(rt):
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    rows = np.array([39, 0, 7, 7, 21], np.int32)
    y = da.to_device(rt, np.full((5, 4096), np.nan, np.float32))
    L.rmsnorm_rows(rt, y, da.to_device(rt, x), da.to_device(rt, rows), da.to_device(rt, w), 1e-6)
    full = da.to_device(rt, np.full((40, 4096), np.nan, np.float32))
    L.rmsnorm(rt, full, da.to_device(rt, x), da.to_device(rt, w), 1e-6)
    assert np.array_equal(y.get(), full.get()[rows])  # the same kernel body, gathered
    assert rel_err(y.get(), ops.rmsnorm(x[rows], w, 1e-6)) < 1e-6


def test_backend_hidden_rows_match_the_reference(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.reference.forward import ReferenceBackend
    from minfer.reference.heads import LabelHead

    rng = np.random.default_rng(0)
    lengths = [9, 30, 2]
    prompts = [rng.integers(0, model.config.vocab_size, n).astype(np.int32) for n in lengths]
    ids = np.concatenate(prompts)
    tok = np.concatenate(
        [np.stack([128 * i + np.arange(n), np.full(n, 128 * i)], 1) for i, n in enumerate(lengths)]
    ).astype(np.int32)
    ends = np.cumsum(lengths) - 1
    hid = np.arange(len(ids))  # every row (mean pooling's need)
    gpu = CudaBackend(model, max_tokens=64, ubatch=48, kv_slots=512)
    cpu = ReferenceBackend(model, max_tokens=64)
    cpu.reserve_slots(512)
    st, h = gpu.packed(ids, tok, ends, np.full(3, -1), hidden=hid)
    st_ref, h_ref = cpu.packed(ids, tok, ends, np.full(3, -1), hidden=hid)
    err = rel_err(h, h_ref)
    cos = (h * h_ref).sum(1) / np.linalg.norm(h, axis=1) / np.linalg.norm(h_ref, axis=1)
    print(f"\nhidden GPU vs CPU: rel err {err:.2e}, min cosine {cos.min():.6f}")
    assert err < 3e-2 and cos.min() > 0.999
    labels = [1, 5, model.config.vocab_size - 1]
    lh = LabelHead(model, labels)
    got, ref = lh(h[ends]), lh(h_ref[ends])
    print(f"label logits GPU vs CPU: max |d| {np.abs(got - ref).max():.4f}")
    assert np.abs(got - ref).max() < 0.25  # the f16 path's distance (test_packed's log-probs)
    # the label log-probs against the GPU's own full head (its logsumexp): same scale
    lp, lp_ref = got - st[:, 3:4], ref - st_ref[:, 3:4]
    assert np.abs(lp - lp_ref).max() < 0.3
    # hidden rows only: no LM head; the same rows
    st0, h0 = gpu.packed(ids, tok, [], [], hidden=ends)
    assert st0.shape == (0, 4) and rel_err(h0, h[ends]) < 1e-6


def test_engine_jobs_on_cuda_match_cpu(model):
    from minfer.engine.api import Engine

    rng = np.random.default_rng(1)
    V = model.config.vocab_size
    texts = [rng.integers(0, V, n).tolist() for n in (5, 40, 130, 1)]
    gpu, cpu = Engine(model, backend="cuda"), Engine(model, backend="cpu")
    for pooling in ("last", "mean", "cls"):
        eg = np.array(gpu.embed(texts, pooling=pooling))
        ec = np.array(cpu.embed(texts, pooling=pooling))
        cos = (eg * ec).sum(1)  # both L2-normalised
        print(f"\nembed {pooling}: min cosine {cos.min():.6f}")
        assert cos.min() > 0.999
    q, items = texts[0], texts[1:]
    sg = np.array(gpu.score(q, items, [1, 2, 3]))
    sc = np.array(cpu.score(q, items, [1, 2, 3]))
    assert np.abs(sg - sc).max() < 0.02
