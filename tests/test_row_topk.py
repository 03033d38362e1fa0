"""CPU: the top log-probs of a packed forward (packed(..., top=k)): ops.row_topk, the twin of the
CUDA kernel row_topk_f32, against a brute-force sort (ragged shapes, planted ties, -inf logits,
k = 1 .. 20), check_top's refusals, ReferenceBackend.packed(top=k) against a sort of the very
logits its LM head produced and of window_logits, and the row_topk launcher's validation on
fake device arrays. The kernel itself: tests/gpu/test_packed.py."""

from __future__ import annotations

import numpy as np
import pytest
from topk_data import brute_topk, lse_of, planted

from minfer.batch.layout import check_top
from minfer.errors import BadInput
from minfer.reference import ops


@pytest.mark.parametrize("V", [1, 3, 20, 21, 130, 1031])
@pytest.mark.parametrize("m", [1, 5])
def test_row_topk_against_a_full_sort(m, V):
    x = planted(m, V, seed=V * 10 + m)
    lse = lse_of(x)
    for k in sorted({1, 5, 20, V} & set(range(1, min(ops.TOP_MAX, V) + 1))):
        ids, lp = ops.row_topk(x, lse, k)
        ref_ids, ref_lp = brute_topk(x, lse, k)
        assert ids.dtype == np.int32 and lp.dtype == np.float32 and ids.shape == (m, k)
        assert np.array_equal(ids, ref_ids), (k, ids, ref_ids)
        assert np.array_equal(lp.view(np.uint32), ref_lp.view(np.uint32))  # one f32 rounding
        # row_stats' [m, 4] rows give the same (column 3)
        st = np.zeros((m, 4), np.float32)
        st[:, 3] = lse
        ids4, lp4 = ops.row_topk(x, st, k)
        assert np.array_equal(ids4, ids) and np.array_equal(lp4.view(np.uint32), lp.view(np.uint32))


def test_row_topk_ties_go_to_the_smaller_id():
    x = np.array([[1.0, 3.0, 2.0, 3.0, -np.inf, 2.0, 3.0, -np.inf, -0.0, 0.0]], np.float32)
    ids, lp = ops.row_topk(x, np.zeros(1, np.float32), 10)
    assert ids.tolist() == [[1, 3, 6, 2, 5, 0, 8, 9, 4, 7]]  # -0.0 == 0.0: by index too
    assert lp[0, :3].tolist() == [3.0, 3.0, 3.0] and np.isneginf(lp[0, -2:]).all()
    ids, _ = ops.row_topk(x, np.zeros(1, np.float32), 2)  # a tie across the k-th place
    assert ids.tolist() == [[1, 3]]


def test_row_topk_refusals():
    x = np.zeros((2, 30), np.float32)
    for k in (0, 21):
        with pytest.raises(ValueError, match="outside"):
            ops.row_topk(x, np.zeros(2, np.float32), k)
    with pytest.raises(ValueError, match="outside"):
        ops.row_topk(x[:, :4], np.zeros(2, np.float32), 5)  # k <= V
    with pytest.raises(ValueError, match="lse"):
        ops.row_topk(x, np.zeros(3, np.float32), 1)


def test_check_top():
    assert check_top(0, 50) == 0 and check_top(np.int64(20), 50) == 20
    assert check_top(7, 7) == 7
    for bad in (-1, 21, 2.0, True, "3", None):
        with pytest.raises(BadInput, match="top must be an integer"):
            check_top(bad, 50)
    with pytest.raises(BadInput, match=r"\[0, 7\]"):
        check_top(8, 7)


# -- ReferenceBackend.packed(top=k) -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("topk"), seed=3, n_ctx=256))


def test_reference_packed_top(tiny):
    """Two ragged sequences in one chunk, every row asked: top=k's ids and log-probs are a sort
    of the logits the LM head gave (exact) and of window_logits (within the packed-vs-alone
    tolerance of tests/test_packed_reference.py); the stats equal top=0's bit for bit."""
    from minfer.reference.forward import ReferenceBackend

    V = tiny.config.vocab_size
    rng = np.random.default_rng(4)
    lengths = (3, 11)
    prompts = [rng.integers(0, V, n).astype(np.int32) for n in lengths]
    ids = np.concatenate(prompts)
    tok = np.array([(p, 0) for p in range(3)] + [(128 + p, 128) for p in range(11)], np.int32)
    rows = np.array([13, 0, 2, 5, 7], np.int32)  # any order, ragged
    targets = np.r_[ids[1:], -1][rows].astype(np.int32)
    be = ReferenceBackend(tiny)
    be.reserve_slots(256)
    heads = []
    real = be._head
    be._head = lambda x: heads.append(real(x)) or heads[-1]
    st0 = be.packed(ids, tok, rows, targets)
    for k in (1, 5, 20):
        heads.clear()
        st, top_ids, top_lp = be.packed(ids, tok, rows, targets, top=k)
        assert np.array_equal(st.view(np.uint32), st0.view(np.uint32))
        assert top_ids.shape == top_lp.shape == (len(rows), k)
        logits = np.concatenate(heads).astype(np.float32)
        ref_ids, ref_lp = brute_topk(logits, st[:, 3], k)
        assert np.array_equal(top_ids, ref_ids)
        assert np.array_equal(top_lp.view(np.uint32), ref_lp.view(np.uint32))
        assert np.array_equal(top_ids[:, 0], st[:, 0].astype(np.int32))  # top 1 = greedy
    # the same rows run alone (window_logits): equal up to the packed-vs-alone tolerance
    alone = []
    for p, r0 in zip(prompts, (0, 3)):
        w = ReferenceBackend(tiny).window_logits(p, 0)
        alone += [(r0 + j, w[j]) for j in range(len(p))]
    alone = dict(alone)
    tol = 1e-4
    for i, r in enumerate(rows):
        row = alone[int(r)].astype(np.float32)
        ref_ids, ref_lp = brute_topk(row[None], lse_of(row[None]), 20)
        s = np.sort(row.astype(np.float64))[::-1]
        clear = np.abs(np.diff(s[:21])) > 2 * tol * max(1.0, np.abs(s[0]))  # no near-tie
        n = int(np.argmin(clear)) if not clear.all() else 20  # ids equal before a near-tie
        assert np.array_equal(top_ids[i, :n], ref_ids[0, :n])
        np.testing.assert_allclose(top_lp[i], ref_lp[0], atol=1e-3)


def test_reference_packed_top_refusals(tiny):
    from minfer.reference.forward import ReferenceBackend

    be = ReferenceBackend(tiny)
    ids = np.array([1, 2], np.int32)
    tok = np.array([(0, 0), (1, 0)], np.int32)
    for bad in (21, -1, 1.5):
        with pytest.raises(BadInput, match="top"):
            be.packed(ids, tok, [1], [-1], top=bad)
    st, i, lp = be.packed(ids, tok, np.zeros(0, np.int32), np.zeros(0, np.int32), top=3)
    assert st.shape == (0, 4) and i.shape == lp.shape == (0, 3)


# -- the launcher's validation (fake device arrays; the kernel runs in tests/gpu) ---------------
class _Rt:
    def __init__(self):
        self.launches = []

    def function(self, name, entry):
        return name, entry

    def launch(self, fn, grid, block, args):
        self.launches.append((fn, grid, block, args))


def test_row_topk_launcher(monkeypatch):
    from fake_gpuarray import FakeGPUArray, install

    from minfer.cuda.ops import layers as L
    from minfer.errors import GPUError

    install(monkeypatch)
    ptr = iter(range(1 << 20, 1 << 30, 1 << 16))

    def arr(shape, dtype):
        return FakeGPUArray(shape, dtype, gpudata=next(ptr))

    rt = _Rt()
    m, V = 7, 1031
    logits, stats = arr((m, V), np.float32), arr((m, 4), np.float32)
    ids, lp = arr((m, 5), np.int32), arr((m, 5), np.float32)
    L.row_topk(rt, ids, lp, logits, stats, 5)
    ((fn, grid, block, args),) = rt.launches
    assert fn == ("layers", "row_topk_f32") and grid == (m,) and block == (L.TOPK_THREADS,)
    assert int(args[3]) == int(stats.gpudata) + 12 and int(args[4]) == 4  # column 3
    assert (int(args[5]), int(args[6])) == (V, 5)
    lse = arr((m,), np.float32)
    L.row_topk(rt, ids, lp, logits, lse, 5)
    assert int(rt.launches[-1][3][3]) == int(lse.gpudata) and int(rt.launches[-1][3][4]) == 1
    for bad, msg in (
        ((ids, lp, logits, stats, 0), "outside"),
        ((ids, lp, logits, stats, 21), "outside"),
        ((ids, lp, logits, stats, True), "outside"),
        ((ids, lp, arr((m, 3), np.float32), stats, 5), "outside"),  # k > V
        ((ids, lp, logits, arr((m, 3), np.float32), 5), "lse"),
        ((ids, lp, logits, arr((m + 1,), np.float32), 5), "lse"),
        ((arr((m, 4), np.int32), lp, logits, stats, 5), "ids"),
        ((ids, arr((m, 5), np.float64), logits, stats, 5), "lp"),
        ((lp, lp, logits, stats, 5), "ids"),
        ((ids, lp, arr((m, V), np.float16), stats, 5), "logits"),
    ):
        with pytest.raises(GPUError, match=msg):
            L.row_topk(rt, *bad)
    # a strided [m, k] view of a wider buffer would be written as if contiguous: refused
    wide = arr((m, 8), np.int32)
    strided = FakeGPUArray((m, 5), np.int32, gpudata=wide.gpudata, strides=(32, 4))
    with pytest.raises(GPUError, match="contiguous"):
        L.row_topk(rt, strided, lp, logits, stats, 5)
    assert len(rt.launches) == 2
