"""CPU: ReferenceBackend.packed (many sequences in one forward, issue 34) against the
one-sequence-at-a-time forward it must equal, copy_kv prefix sharing, its refusals, and
ops.row_stats against a direct computation.

The oracle chain: forward()/window_logits() are checked against llama.cpp by the golden tests;
packed() is checked here against them; the GPU's packed prefill and batched decode are checked
against packed() (tests/gpu). Models: the tiny synthetic llama (Q4_K_M, n_ctx 256, so the packed
slots run past the context), qwen3 (q/k norms, NEOX RoPE) and gemma3 (a sliding window of 32 on
5 of its 6 layers: the 45-token prompt crosses it, applied on positions, not slots), each in
float32 (the default, llama.cpp's numerics: f16 KV) and float64 (the oracle mode).

Tolerance: tests/tolerance.py's rule, one absolute tolerance per model and dtype for log-probs,
logsumexps and margins. float64: a few f32 ulps of the logit scale (the outputs' rounding);
float32: 4x the f32 forward's own error against the f64 oracle on these prompts, measured on this
machine's BLAS (another GEMM shape can flip f16 roundings of the KV cache or of gemma3's GELU
table, which moves a logit by up to that error). An argmax may differ only where the reference's
top two are within the tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tolerance
from families_data import synth_family
from synth_data import small_parts, tiny_model, write_small

from minfer.errors import BadInput, NumericError
from minfer.reference import ops
from minfer.reference.forward import ReferenceBackend

LENGTHS = (1, 2, 7, 13, 45)  # ragged; 45 crosses gemma3's window of 32
ALIGN = 128  # base_i = 128 * i


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen3", "tiny-gemma3"])
def gguf(request, tmp_path_factory):
    from minfer.gguf.loader import load_model

    d = tmp_path_factory.mktemp("packed")
    if request.param == "tiny":
        return load_model(tiny_model(d, seed=3, n_ctx=256))
    return load_model(synth_family(request.param, d))


class Model:
    """A model and the ReferenceBackend options of one test run (dtype)."""

    def __init__(self, model, dtype):
        self.model, self.config, self.dtype = model, model.config, dtype

    def backend(self, dtype=None) -> ReferenceBackend:
        return ReferenceBackend(self.model, dtype=dtype or self.dtype)


@pytest.fixture(scope="module", params=[np.float32, np.float64], ids=["f32", "f64"])
def model(request, gguf):
    return Model(gguf, request.param)


@pytest.fixture(scope="module")
def prompts(model):
    rng = np.random.default_rng(11)
    return [rng.integers(0, model.config.vocab_size, n).astype(np.int32) for n in LENGTHS]


def _one_at_a_time(model, prompts, dtype=None):
    """Per prompt, on a fresh backend each: (forward()'s last logits, window_logits' log_softmax
    [L, V], window_logits [L, V])."""
    out = []
    for p in prompts:
        be = model.backend(dtype)
        last = be.forward(p, 0)
        w = be.window_logits(p, 0).astype(np.float64)
        out.append((last, w - _lse(w)[:, None], w))
    return out


@pytest.fixture(scope="module")
def alone(model, prompts):
    return _one_at_a_time(model, prompts)


@pytest.fixture(scope="module")
def tol(model, prompts, alone):
    """tests/tolerance.py's rule: float64 from the logit scale; float32 from this BLAS's f32
    error on these prompts (each alone, against the f64 oracle)."""
    oracle = alone if model.dtype == np.float64 else _one_at_a_time(model, prompts, np.float64)
    s = max(tolerance.scale(w) for _, _, w in oracle)
    err = tolerance.f32_err([(a[k], b[k]) for a, b in zip(alone, oracle) for k in (0, 1)])
    return tolerance.tol(model.dtype, model.config, s, err)


def _lse(x):
    x = np.asarray(x, np.float64)
    mx = x.max(axis=-1)
    return mx + np.log(np.exp(x - mx[..., None]).sum(axis=-1))


def _backend(model, n_seqs):
    be = model.backend()
    be.reserve_slots(ALIGN * n_seqs)
    return be


def _layout(prompts):
    """The packed layout of whole prompts: ids [T], tok [T, 2], targets [T] (the next prompt
    token, -1 on each prompt's last), owner (seq index, position) per token."""
    ids, tok, tgt, own = [], [], [], []
    for i, p in enumerate(prompts):
        base = ALIGN * i
        for j, t in enumerate(p):
            ids.append(t)
            tok.append((base + j, base))
            tgt.append(p[j + 1] if j + 1 < len(p) else -1)
            own.append((i, j))
    return (np.array(ids, np.int32), np.array(tok, np.int32), np.array(tgt, np.int32), own)


def _same_argmax(got: int, logits: np.ndarray, tol: float) -> None:
    """got is the reference's argmax, or (a near-tie) an id within tol of its max."""
    want = int(np.argmax(logits))
    if got != want:
        assert logits[want] - logits[got] <= tol, (got, want)


def _check_against_alone(st, own, tgt, prompts, alone, tol):
    """st [T, 4]: one row per prompt token (rows = every token): the last rows' stats equal
    forward()'s, the other rows' log-probs equal window_logits' log_softmax."""
    assert st.shape == (len(own), 4) and st.dtype == np.float32
    for r, (i, j) in enumerate(own):
        last, logp, _ = alone[i]
        if j == len(prompts[i]) - 1:
            srt = np.sort(last.astype(np.float64))
            _same_argmax(int(st[r, 0]), last, tol)
            assert st[r, 3] == pytest.approx(_lse(last), rel=0, abs=tol), (i, j)
            assert st[r, 1] == pytest.approx(srt[-1] - srt[-2], rel=0, abs=tol), (i, j)
            assert np.isnan(st[r, 2])
        else:
            assert st[r, 2] == pytest.approx(logp[j, tgt[r]], rel=0, abs=tol), (i, j)
            _same_argmax(int(st[r, 0]), logp[j], tol)


@pytest.mark.identity
def test_packed_equals_one_at_a_time(model, prompts, alone, tol):
    ids, tok, tgt, own = _layout(prompts)
    T = ids.size
    be = _backend(model, len(prompts))
    if model.config.n_ctx < be.kv_slots:  # the llama's slots run past its context of 256
        assert be.kv_slots == ALIGN * len(prompts) > model.config.n_ctx
    st = be.packed(ids, tok, np.arange(T, dtype=np.int32), tgt)
    _check_against_alone(st, own, tgt, prompts, alone, tol)

    # rows in any order, repeated: the same stats, row for row
    rows = np.array([T - 1, 0, 5, 5, 17, 3], np.int32)
    again = _backend(model, len(prompts)).packed(ids, tok, rows, tgt[rows])
    _check_against_alone(again, [own[r] for r in rows], tgt[rows], prompts, alone, tol)

    # the same tokens over 4 calls split at arbitrary boundaries (prompts spanning calls: a
    # later call attends to the rows an earlier one wrote)
    be = _backend(model, len(prompts))
    parts = []
    for s, e in zip((0, 2, 14, 31), (2, 14, 31, T)):
        parts.append(be.packed(ids[s:e], tok[s:e], np.arange(e - s, dtype=np.int32), tgt[s:e]))
    _check_against_alone(np.concatenate(parts), own, tgt, prompts, alone, tol)


@pytest.mark.identity
def test_attending_across_sequences_is_caught(model, prompts, alone, tol):
    """The tolerance still sees a real bug: the same prompts packed as one sequence (every row
    attends to the prompts before its own, at shifted positions) move the later prompts'
    log-probs far beyond it."""
    ids, _, tgt, own = _layout(prompts)
    T = ids.size
    tok = np.c_[np.arange(T), np.zeros(T)].astype(np.int32)  # slot r, lo 0: one sequence
    st = _backend(model, len(prompts)).packed(ids, tok, np.arange(T, dtype=np.int32), tgt)
    moved = max(
        abs(st[r, 2] - alone[i][1][j, tgt[r]])
        for r, (i, j) in enumerate(own)
        if i > 0 and j + 1 < len(prompts[i])
    )
    assert moved > 10 * tol, (moved, tol)


@pytest.mark.identity
def test_batched_decode_equals_engine_greedy(model, prompts, tol):
    from minfer.batch import single
    from minfer.tools.gates import compare_greedy

    n_steps = 8
    runs = [single.run(model.backend(), p, n_greedy=n_steps + 1, warmup=False) for p in prompts]
    ids, tok, _, own = _layout(prompts)
    last = np.array([r for r, (i, j) in enumerate(own) if j == len(prompts[i]) - 1], np.int32)
    be = _backend(model, len(prompts))
    st = be.packed(ids, tok, last, np.full(last.size, -1, np.int32))
    got = [[int(g)] for g in st[:, 0]]
    n = len(prompts)
    for step in range(n_steps):
        ids = np.array([g[-1] for g in got], np.int32)
        tok = np.array(
            [(ALIGN * i + len(p) + step, ALIGN * i) for i, p in enumerate(prompts)], np.int32
        )
        if step % 2:  # the runner pads a step by repeating its last row (same slot and token)
            ids, tok = np.r_[ids, ids[-1], ids[-1]], np.r_[tok, tok[-1:], tok[-1:]]
        st = be.packed(ids, tok, np.arange(n, dtype=np.int32), np.full(n, -1, np.int32))
        for i in range(n):
            got[i].append(int(st[i, 0]))
    for g, r in zip(got, runs):  # equal ids up to the first near-tie within tol
        v = compare_greedy(g, r.greedy_ids, r.step_margins, tol)
        assert v.ok, v.describe()


@pytest.mark.identity
def test_copy_kv_prefix_sharing(model, tol):
    """b, sharing a's first 20 rows through copy_kv, equals b alone (tol: the module's rule,
    this model's f32 error measured on `prompts`)."""
    rng = np.random.default_rng(5)
    V = model.config.vocab_size
    a = rng.integers(0, V, 30).astype(np.int32)
    b = np.r_[a[:20], rng.integers(0, V, 9)].astype(np.int32)
    ref = model.backend()
    last_b = ref.forward(b, 0)
    wb = ref.window_logits(b, 0).astype(np.float64)
    logp_b = wb - _lse(wb)[:, None]

    be = _backend(model, 2)
    n = a.size
    be.packed(
        a,
        np.c_[np.arange(n), np.zeros(n)].astype(np.int32),
        np.array([n - 1], np.int32),
        np.array([-1], np.int32),
    )
    be.copy_kv(0, ALIGN, 20)
    own = b[20:]
    tok = np.c_[ALIGN + np.arange(20, b.size), np.full(own.size, ALIGN)].astype(np.int32)
    tgt = np.r_[b[21:], -1].astype(np.int32)
    st = be.packed(own, tok, np.arange(own.size, dtype=np.int32), tgt)
    _same_argmax(int(st[-1, 0]), last_b, tol)
    assert st[-1, 3] == pytest.approx(_lse(last_b), rel=0, abs=tol)
    np.testing.assert_allclose(
        st[:-1, 2], logp_b[np.arange(20, b.size - 1), b[21:]], rtol=0, atol=tol
    )


# -- the rest on one model: the tiny llama ---------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from minfer.gguf.loader import load_model

    return load_model(tiny_model(tmp_path_factory.mktemp("packed_llama"), seed=3, n_ctx=256))


def test_refusals(llama):
    c = llama.config
    be = ReferenceBackend(llama)
    be.reserve_slots(c.n_ctx + 64)
    assert be.kv_slots == c.n_ctx + 64
    one, m1 = np.array([0], np.int32), np.array([-1], np.int32)

    def packed(ids=(1,), tok=((0, 0),), rows=(0,), targets=(-1,)):
        return be.packed(np.asarray(ids), np.asarray(tok), np.asarray(rows), np.asarray(targets))

    packed()  # runs
    with pytest.raises(BadInput, match="position 256 past the model's context of 256"):
        packed(tok=((c.n_ctx, 0),))
    packed(tok=((c.n_ctx + 1, 2),))  # a slot past n_ctx at position n_ctx - 1: runs
    with pytest.raises(BadInput, match=f"slot < {c.n_ctx + 64}"):
        packed(tok=((c.n_ctx + 64, c.n_ctx + 64),))
    with pytest.raises(BadInput, match=r"rows must be in \[0, 1\)"):
        packed(rows=(1,))
    with pytest.raises(BadInput, match="rows must be"):
        packed(rows=(-1,))
    for bad in ([[0, 0, 0]], [[0, 0], [1, 0]], [0, 0]):
        with pytest.raises(BadInput, match=r"tok .*expected \[T, 2\]"):
            packed(tok=bad)
    with pytest.raises(BadInput, match="expected"):
        packed(rows=(0, 0), targets=(-1,))
    with pytest.raises(BadInput, match="non-empty"):
        packed(ids=np.zeros(0, np.int32), tok=np.zeros((0, 2), np.int32), rows=(), targets=())
    with pytest.raises(BadInput, match="token id out of range"):
        packed(ids=(c.vocab_size,))
    with pytest.raises(BadInput, match="targets"):
        packed(targets=(c.vocab_size,))
    with pytest.raises(BadInput, match="targets"):
        packed(targets=(-2,))
    with pytest.raises(BadInput, match="integers"):
        packed(ids=(1.0,))
    with pytest.raises(BadInput, match="lo <= slot"):
        packed(tok=((3, 4),))
    with pytest.raises(BadInput, match="non-decreasing"):
        packed(ids=(1, 2), tok=((5, 0), (4, 0)), rows=one, targets=m1)
    with pytest.raises(BadInput, match="repeated slot"):
        packed(ids=(1, 2), tok=((5, 0), (5, 0)), rows=one, targets=m1)
    with pytest.raises(BadInput, match="copy_kv"):
        be.copy_kv(0, c.n_ctx + 60, 8)  # past the cache
    with pytest.raises(BadInput, match="copy_kv"):
        be.copy_kv(0, 4, 8)  # overlapping
    be.copy_kv(0, 4, 0)  # nothing to copy


def test_forward_after_reserve_slots_and_reset_keeps_rows(llama):
    """forward() and packed() share the cache: reserve_slots past n_ctx keeps forward()
    working and bit-identical; reset() clears no rows (copy_kv copies what forward wrote)."""
    ids = np.arange(3, 20, dtype=np.int32)
    plain = ReferenceBackend(llama).forward(ids, 0)
    be = ReferenceBackend(llama)
    be.reserve_slots(2 * llama.config.n_ctx)
    assert np.array_equal(be.forward(ids, 0), plain)
    be.reset()
    be.copy_kv(0, 300, ids.size)
    assert np.array_equal(be._k[1][300 : 300 + ids.size], be._k[1][: ids.size])
    assert np.abs(be._k[1][: ids.size]).sum() > 0
    assert be.n_past == 0


def test_non_finite_names_layer_and_slot(tmp_path):
    from minfer.gguf.loader import load_model

    meta, tensors = small_parts()
    tensors = [
        (n, q, s, np.full_like(d, 1e30) if n == "blk.1.ffn_norm.weight" else d)
        for n, q, s, d in tensors
    ]
    be = ReferenceBackend(load_model(write_small(tmp_path / "m.gguf", meta, tensors)))
    be.reserve_slots(300)
    with pytest.raises(
        NumericError,
        match=r"layer 1 \(blk.1\) at position 0 \(slot 200, "
        r"token id 7\)",
    ):
        be.packed(
            np.array([7, 8], np.int32),
            np.array([[200, 200], [201, 200]], np.int32),
            np.array([1], np.int32),
            np.array([-1], np.int32),
        )


# -- ops.row_stats ---------------------------------------------------------------------------
def _row_stats_loop(x, t):
    out = []
    for row, tg in zip(np.asarray(x, np.float64), t):
        vals = list(row)
        i1 = vals.index(max(vals))  # the first index of the max
        rest = vals[:i1] + vals[i1 + 1 :]
        m2 = max(rest) if rest else -math.inf
        mx = max(vals)
        lse = mx + math.log(sum(math.exp(v - mx) for v in vals))
        lp = vals[tg] - lse if 0 <= tg < len(vals) else math.nan
        out.append((i1, np.float32(vals[i1]) - np.float32(m2), lp, lse))
    return np.array(out, np.float64)


def test_row_stats_against_direct():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((70, 97)) * 4).astype(np.float32)  # 70 rows: two f64 blocks
    x[0, 10] = x[0, 3] = x[0].max() + 1  # a tie: index 3, margin 0
    x[1, :] = 2.5  # all equal: index 0
    x[2] += np.float32(3e4)  # large logits: lse stable
    x[3, 96] = x[3].max() + 0.25  # max at the last index
    t = rng.integers(0, 97, 70).astype(np.int32)
    t[[0, 5, 69]] = -1
    got = ops.row_stats(x, t)
    want = _row_stats_loop(x, t)
    assert got.shape == (70, 4) and got.dtype == np.float32
    assert np.array_equal(got[:, 0], want[:, 0])
    assert got[0, 0] == 3 and got[0, 1] == 0 and got[1, 0] == 0 and got[1, 1] == 0
    assert got[3, 0] == 96 and got[3, 1] == pytest.approx(0.25, abs=1e-3)
    assert np.array_equal(got[:, 1], want[:, 1].astype(np.float32))
    assert np.array_equal(np.isnan(got[:, 2]), t < 0)
    ok = t >= 0
    np.testing.assert_allclose(got[ok, 2], want[ok, 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[:, 3], want[:, 3], rtol=1e-7)
    assert got[2, 3] > 3e4 and np.isfinite(got).sum() == got.size - 3

    # edge shapes: no rows; a vocabulary of one (margin +inf, log-prob 0)
    assert ops.row_stats(np.zeros((0, 5), np.float32), np.zeros(0, np.int32)).shape == (0, 4)
    one = ops.row_stats(np.array([[1.5]], np.float32), np.array([0], np.int32))
    assert one[0, 0] == 0 and one[0, 1] == np.inf and one[0, 2] == 0 and one[0, 3] == 1.5
