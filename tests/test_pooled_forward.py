"""packed(..., hidden=rows) (issue 52): the final-normed hidden states of chosen rows without
the LM head, and LabelHead's label logits from them. CPU reference: equal to rmsnorm of the
rows' residual (a one-sequence window's logits give the check: hidden @ W.T is the LM head);
label logits equal the full logits at those ids; the CUDA backend on the fake runtime: one
f32 rmsnorm_rows per HEAD_ROWS block of hidden rows, no LM head for m = 0, refusals."""

from __future__ import annotations

import types

import numpy as np
import pytest
from synth_data import tiny_model
from test_backend_forward_cpu import FakeRT, _Arr, fake_tensor_maps

from minfer.errors import BadInput
from minfer.reference.forward import ReferenceBackend
from minfer.reference.heads import LabelHead


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("pool"), seed=5, workers=None))


def _two(vocab):
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, vocab, 9), rng.integers(0, vocab, 6)
    ids = np.r_[a, b].astype(np.int32)
    tok = np.array([(p, 0) for p in range(9)] + [(128 + p, 128) for p in range(6)], np.int32)
    return a, b, ids, tok


def test_reference_hidden_rows_are_the_lm_heads_input(tiny):
    a, b, ids, tok = _two(tiny.config.vocab_size)
    be = ReferenceBackend(tiny, dtype=np.float64)
    be.reserve_slots(256)
    hid = np.array([8, 14, 0, 14])
    st, h = be.packed(ids, tok, [8, 14], [-1, -1], hidden=hid)
    assert st.shape == (2, 4) and h.shape == (4, tiny.config.d_model) and h.dtype == np.float32
    assert np.array_equal(h[1], h[3])
    W = tiny.dequant(tiny.output_name).astype(np.float64)
    for row, seq, p in ((0, a, 8), (1, b, 5), (2, a, 0)):
        alone = ReferenceBackend(tiny, dtype=np.float64)
        full = alone.window_logits(seq[: p + 1], p)[0]  # the row's logits, alone
        assert np.allclose(h[row] @ W.T, full, rtol=1e-5, atol=1e-5)
    # the label head: those logits at a few ids, and the logsumexp of the stats row
    labels = [3, 0, tiny.config.vocab_size - 1]
    lh = LabelHead(tiny, labels)(h[:2])
    full_a = ReferenceBackend(tiny, dtype=np.float64).window_logits(a, 8)[0]
    assert np.allclose(lh[0], full_a[labels], rtol=1e-5, atol=1e-5)
    lse = np.log(np.exp(full_a - full_a.max()).sum()) + full_a.max()
    assert abs(st[0, 3] - lse) < 1e-5
    # hidden only: no LM head rows at all; f32 gives the same rows to f32 precision
    fresh = ReferenceBackend(tiny, dtype=np.float64)
    fresh.reserve_slots(256)
    st0, h0 = fresh.packed(ids, tok, [], [], hidden=hid)
    assert st0.shape == (0, 4) and np.allclose(h0, h, rtol=1e-6, atol=1e-6)
    f32 = ReferenceBackend(tiny)
    f32.reserve_slots(256)
    _, h32 = f32.packed(ids, tok, [], [], hidden=hid)
    assert np.allclose(h32, h, rtol=2e-3, atol=2e-3)
    # top and hidden together: (st, ids, lp), hidden
    (st3, ti, tl), h3 = be.packed(ids, tok, [8], [-1], top=2, hidden=[8])
    assert ti.shape == (1, 2) and np.allclose(h3[0], h[0], atol=1e-6)


@pytest.mark.parametrize(
    "bad,msg",
    [
        ([15], "hidden must be"),
        ([-1], "hidden must be"),
        (np.zeros(16, int), "at most 15"),
        ([[1]], "1-D integer"),
        ([1.5], "1-D integer"),
    ],
)
def test_reference_refuses_bad_hidden_rows(tiny, bad, msg):
    _, _, ids, tok = _two(tiny.config.vocab_size)
    be = ReferenceBackend(tiny)
    be.reserve_slots(256)
    with pytest.raises(BadInput, match=msg):
        be.packed(ids, tok, [], [], hidden=bad)


def test_label_head_refuses_ids_outside_the_vocabulary(tiny):
    V = tiny.config.vocab_size
    for bad in ([V], [-1], [], [[1, 2]]):
        with pytest.raises(BadInput, match="label id"):
            LabelHead(tiny, bad)


def test_cuda_hidden_rows_launch_f32_rmsnorm_rows_only(monkeypatch, tiny):
    from fake_gpuarray import install

    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray

    install(monkeypatch)
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=_Arr))
    fake_tensor_maps(monkeypatch)
    rt = FakeRT("sm_90")
    args = []
    launch = rt.launch
    rt.launch = lambda fn, grid, block, a, **kw: (
        args.append((fn[1], grid, a)),
        launch(fn, grid, block, a),
    )
    be = CudaBackend(
        tiny,
        GemmChoice("f16"),
        rt=rt,
        max_tokens=64,
        ubatch=16,
        warmup=False,
        graphs=False,
        kv_slots=512,
    )
    be.HEAD_ROWS = 4
    _, _, ids, tok = _two(tiny.config.vocab_size)
    args.clear()
    plain = be.packed(ids, tok, [8, 14], [-1, -1])
    base = [e for e, _, _ in args]
    args.clear()
    st, h = be.packed(ids, tok, [8, 14], [-1, -1], hidden=np.arange(15))
    entries = [e for e, _, _ in args]
    assert entries[: len(base)] == base and st.shape == plain.shape
    extra = entries[len(base) :]
    assert extra == ["rmsnorm_rows_f32_f32"] * 4  # 15 rows, 4 at a time, nothing else
    assert [g for e, g, _ in args if e == "rmsnorm_rows_f32_f32"] == [(4,), (4,), (4,), (3,)]
    assert h.shape == (15, tiny.config.d_model) and h.dtype == np.float32
    args.clear()
    st, h = be.packed(ids, tok, [], [], hidden=[14])  # embeddings: no LM head at all
    entries = [e for e, _, _ in args]
    assert st.shape == (0, 4) and h.shape == (1, tiny.config.d_model)
    assert "row_stats_f32" not in entries and "rmsnorm_rows_f32_f16" not in entries
    assert entries.count("rmsnorm_rows_f32_f32") == 1
    args.clear()
    with pytest.raises(BadInput, match="hidden must be"):
        be.packed(ids, tok, [], [], hidden=[15])
    assert not args
