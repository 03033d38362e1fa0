"""Packed many-sequence chunks on the GPU (issue 34): the device token layout (slot, lo) in both
attention kernels against the numpy twin and against each sequence run alone (bit for bit at
128-aligned starts), rmsnorm_rows, row_stats against ops.row_stats, row_topk bit for bit against
ops.row_topk, and CudaBackend.packed (top=0 and top=k) / copy_kv against single-sequence
forwards and the CPU reference's packed()."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err

pytestmark = pytest.mark.gpu


def _layout(lengths, align=128):
    """tok int32 [sum, 2] of sequences at bases 0, align*k, ... (each rounded up)."""
    rows, base = [], 0
    for n in lengths:
        rows += [(base + p, base) for p in range(n)]
        base += -(-n // align) * align
    return np.array(rows, np.int32), base


@pytest.mark.parametrize("impl", ["mma", "wg", "tok"])
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 4, 2), (128, 32, 8)])
def test_packed_attention(rt, impl, D, Hq, Hkv):
    from minfer.cuda.ops.attention import attention
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    if impl == "wg" and rt.arch != "sm_90":
        pytest.skip("the wgmma attention needs sm_90")
    lengths = [5, 200, 1, 37, 129]
    tok, S = _layout(lengths)
    T = len(tok)
    rng = np.random.default_rng(D + Hq)
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    kd, vd = da.to_device(rt, k), da.to_device(rt, v)
    o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    attention(rt, o, da.to_device(rt, q), kd, vd, 0, da.to_device(rt, tok), S, impl=impl)
    got = o.get()
    t0 = 0
    for n in lengths:
        b = int(tok[t0, 1])
        ref = ops.attention(
            q[t0 : t0 + n].astype(np.float64),
            k[b : b + n].astype(np.float64),
            v[b : b + n].astype(np.float64),
            0,
        )
        assert rel_err(got[t0 : t0 + n], ref) < 2e-3, f"sequence of {n} at slot {b}"
        # alone: the same rows at positions 0.. of a cache holding only them, bit for bit
        alone = da.to_device(rt, np.full((n, Hq, D), np.nan, np.float16))
        attention(
            rt,
            alone,
            da.to_device(rt, q[t0 : t0 + n]),
            da.to_device(rt, k[b : b + n]),
            da.to_device(rt, v[b : b + n]),
            0,
            impl=impl,
        )
        assert np.array_equal(alone.get().view(np.uint16), got[t0 : t0 + n].view(np.uint16)), (
            f"{impl}: sequence of {n} at slot {b} differs from its lone run"
        )
        t0 += n


@pytest.mark.parametrize("D,Hq,Hkv", [(64, 9, 3), (128, 32, 8), (128, 64, 8), (128, 16, 1)])
def test_decode_step_attention(rt, D, Hq, Hkv):
    """A decode step's layout (one token per sequence, each at the end of its own keys, the
    last row repeated as the runner pads): attention_tok.cu, groups of 3 / 4 / 8 (two blocks
    per token) / 16, key ranges 1 .. 3,000, against the numpy twin and the tile kernel."""
    from minfer.cuda.ops.attention import attention, per_token_pays
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    lengths = [1, 130, 3000, 17, 128, 255, 64, 2, 2]
    tok_all, S = _layout(lengths)
    ends = np.cumsum(lengths) - 1
    tok = np.concatenate([tok_all[ends], tok_all[ends[-1:]]])  # the runner's padding row
    assert per_token_pays(tok) and not per_token_pays(tok_all)
    T = len(tok)
    rng = np.random.default_rng(D * Hq + Hkv)
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    q[-1] = q[-2]  # the padding row repeats its token, query included
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    kd, vd, qd, td = (da.to_device(rt, a) for a in (k, v, q, tok))
    out = {}
    for impl in ("tok", "mma"):
        o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
        attention(rt, o, qd, kd, vd, 0, td, S, impl=impl)
        out[impl] = o.get()
    ref = ops.attention_packed(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), tok
    )
    assert np.all(np.isfinite(out["tok"]))
    assert rel_err(out["tok"], ref) < 1e-3, rel_err(out["tok"], ref)  # f32 p: tighter
    assert rel_err(out["mma"], ref) < 2e-3
    assert np.array_equal(out["tok"][-1].view(np.uint16), out["tok"][-2].view(np.uint16))


def test_rmsnorm_rows(rt):
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    rows = np.array([39, 0, 7, 7, 21], np.int32)
    y = da.to_device(rt, np.full((5, 576), np.nan, np.float16))
    L.rmsnorm_rows(rt, y, da.to_device(rt, x), da.to_device(rt, rows), da.to_device(rt, w), 1e-5)
    full = da.to_device(rt, np.full((40, 576), np.nan, np.float16))
    L.rmsnorm(rt, full, da.to_device(rt, x), da.to_device(rt, w), 1e-5)
    assert np.array_equal(y.get(), full.get()[rows])  # the same kernel body, gathered
    assert rel_err(y.get(), ops.rmsnorm(x[rows], w, 1e-5)) < 1e-3


@pytest.mark.parametrize("V", [1, 7, 49152, 128256])
def test_row_stats(rt, V):
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    rng = np.random.default_rng(V)
    m = 6
    x = (rng.standard_normal((m, V)) * 4).astype(np.float32)
    if V > 2:
        x[1, V // 3] = x[1, V - 1] = x[1].max() + 1  # a tie: the first index, margin 0
    tg = rng.integers(0, V, m).astype(np.int32)
    tg[2] = -1
    out = da.to_device(rt, np.full((m, 4), np.nan, np.float32))
    L.row_stats(rt, out, da.to_device(rt, x), da.to_device(rt, tg))
    got, ref = out.get(), ops.row_stats(x, tg)
    assert np.array_equal(got[:, 0], ref[:, 0])
    np.testing.assert_allclose(got[:, 1], ref[:, 1], atol=1e-5)
    assert np.isnan(got[2, 2]) and np.isnan(ref[2, 2])
    np.testing.assert_allclose(got[:, 2:], ref[:, 2:], rtol=1e-5, atol=1e-5)


def _topk_run(rt, logits, lse, k, shift=False):
    """(ids, log-probs) of L.row_topk on host logits f32 [m, V] (outputs poisoned first);
    shift: the logits at a 4-byte offset (not 16-byte aligned: the scalar load path)."""
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da

    m, V = logits.shape
    if shift:
        buf = da.to_device(rt, np.concatenate([np.float32([7]), logits.ravel()]))
        d = da.view(da.ptr(buf) + 4, (m, V), np.float32, base=buf)
    else:
        d = da.to_device(rt, logits)
    ids = da.to_device(rt, np.full((m, k), -7, np.int32))
    lp = da.to_device(rt, np.full((m, k), np.nan, np.float32))
    L.row_topk(rt, ids, lp, d, lse, k)
    return ids.get(), lp.get()


@pytest.mark.parametrize("V", [32000, 49152, 128256, 262144])
@pytest.mark.parametrize("m", [1, 7, 256])
def test_row_topk_bitwise(rt, m, V):
    """The kernel against its twin bit for bit, k = 1, 5, 20, the logsumexp from row_stats' rows
    on the device: planted ties (at the maximum, inside the top 25, across the k-th place),
    -inf entries, an all-equal row, an ascending row, a row of 3 finite logits; both load paths
    (16-byte rows and a 4-byte offset) give the same."""
    from topk_data import planted, same_bits

    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    x = planted(m, V, seed=m * 7 + V)
    stats = da.to_device(rt, np.full((m, 4), np.nan, np.float32))
    L.row_stats(rt, stats, da.to_device(rt, x), da.to_device(rt, np.full(m, -1, np.int32)))
    st = stats.get()
    for k in (1, 5, 20):
        ids, lp = _topk_run(rt, x, stats, k)
        ref_ids, ref_lp = ops.row_topk(x, st, k)
        assert np.array_equal(ids, ref_ids), (k, np.argwhere(ids != ref_ids)[:5])
        assert same_bits(lp, ref_lp), (k, np.argwhere(lp != ref_lp)[:5])
        if k == 20 or m == 256:  # the scalar path on the same rows (m 256: once, it is slow)
            s_ids, s_lp = _topk_run(rt, x, stats, k, shift=True)
            assert np.array_equal(s_ids, ids) and same_bits(s_lp, lp)
    if m > 3:
        assert ids[1].tolist() == list(range(20))  # all tied: by index
        assert ids[2].tolist() == list(range(V - 1, V - 21, -1))  # ascending row
        assert ids[3, :3].tolist() == [V // 2, V - 1, 0] and np.isneginf(lp[3, 3:]).all()


@pytest.mark.parametrize("V", [1, 3, 20, 21, 511, 513, 1031, 32003])
def test_row_topk_ragged(rt, V):
    """V below k's 20, not a multiple of 4 (the scalar path) or of the block; the lse as f32 [m];
    a row of NaNs among -inf: the kernel never picks a NaN (id -1, NaN past the real entries)."""
    from topk_data import lse_of, planted, same_bits

    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    m = 6
    x = planted(m, V, seed=V)
    lse = lse_of(x)
    for k in sorted({1, 5, 20, V} & set(range(1, min(20, V) + 1))):
        ids, lp = _topk_run(rt, x, da.to_device(rt, lse), k)
        ref_ids, ref_lp = ops.row_topk(x, lse, k)
        assert np.array_equal(ids, ref_ids) and same_bits(lp, ref_lp), k
    if V >= 4:
        y = np.full((1, V), np.nan, np.float32)
        y[0, [1, 3]] = [2.0, -np.inf]
        k = min(5, V)
        ids, lp = _topk_run(rt, y, da.to_device(rt, np.zeros(1, np.float32)), k)
        assert ids[0].tolist() == [1, 3] + [-1] * (k - 2)
        assert lp[0, 0] == 2.0 and np.isneginf(lp[0, 1]) and np.isnan(lp[0, 2:]).all()


@pytest.mark.parametrize("k", [1, 4, 20])
def test_row_topk_time(rt, k):
    """m = 256 rows of V = 128,256 (a Llama-3 vocabulary): k = 20 around 1 ms (every element
    meets a 20-entry list), k = 1 (lm-eval's logprobs: 1) near the read of the rows."""
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da

    m, V = 256, 128256
    rng = np.random.default_rng(0)
    x = da.to_device(rt, (rng.standard_normal((m, V)) * 3).astype(np.float32))
    up = da.to_device(rt, np.tile(np.arange(V, dtype=np.float32), (m, 1)))  # worst case
    lse = da.to_device(rt, np.zeros(m, np.float32))
    ids, lp = (da.empty(rt, (m, k), t) for t in (np.int32, np.float32))
    ms = {}
    for name, logits in (("random", x), ("ascending", up)):
        L.row_topk(rt, ids, lp, logits, lse, k)  # load the kernel
        a, b = rt.drv.Event(), rt.drv.Event()
        a.record()
        for _ in range(10):
            L.row_topk(rt, ids, lp, logits, lse, k)
        b.record()
        b.synchronize()
        ms[name] = b.time_since(a) / 10
    print(
        f"\nrow_topk m {m} V {V} k {k}: random {ms['random'] * 1e3:.0f} us, ascending "
        f"(every element inserted) {ms['ascending'] * 1e3:.0f} us"
    )
    assert ms["random"] < {1: 0.3, 4: 0.5, 20: 1.5}[k]


def _prompts(model, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.config.vocab_size, n).astype(np.int32) for n in lengths]


def test_backend_packed_matches_lone_runs_and_the_reference(model):
    """Ragged prompts in two chunks (one spanning them), every prompt token's log-prob and the
    last row's greedy id: against each prompt alone on the GPU (window_logits) and the CPU
    reference's packed forward; then a shared prefix through copy_kv."""
    from minfer.cuda.backend import CudaBackend
    from minfer.reference import ops
    from minfer.reference.forward import ReferenceBackend

    lengths = [1, 9, 30, 2, 17]
    prompts = _prompts(model, lengths)
    tok, S = _layout(lengths)
    ids = np.concatenate(prompts)
    T = len(ids)
    ends = np.cumsum(lengths)
    nxt = np.concatenate([np.append(p[1:], -1) for p in prompts]).astype(np.int32)
    gpu = CudaBackend(model, max_tokens=64, ubatch=40, kv_slots=S + 256)
    cpu = ReferenceBackend(model, max_tokens=64)
    cpu.reserve_slots(S + 256)
    got, ref = [], []
    for s in range(0, T, 40):  # two chunks: the 30-token prompt spans them
        r = np.arange(s, min(s + 40, T))
        got.append(gpu.packed(ids[r], tok[r], r - s, nxt[r]))
        ref.append(cpu.packed(ids[r], tok[r], r - s, nxt[r]))
    got, ref = np.concatenate(got), np.concatenate(ref)
    lp, lp_ref = got[:, 2], ref[:, 2]
    assert np.array_equal(np.isnan(lp), nxt < 0)
    ok = nxt >= 0
    # GPU f16 vs the CPU reference: the f16 path's usual distance (a wrong position or a
    # sequence attending across another is nats off)
    d = np.abs(lp[ok] - lp_ref[ok])
    print(f"\npacked GPU vs CPU log-probs: max |d| {d.max():.4f}, mean {d.mean():.4f}")
    assert d.mean() < 0.03 and d.max() < 0.25
    worst_lse = worst_lp = 0.0
    for i, p in enumerate(prompts):  # the same prompt alone on the GPU
        rows = slice(ends[i] - len(p), ends[i])
        logits = gpu.window_logits(p, 0)
        alone = ops.row_stats(logits, nxt[rows])
        # the same kernels but for M-dependent GEMM variants (a lone 1-token prompt's LM head
        # is a GEMV): f16 rounding apart, ~1e-4 of the logsumexp
        worst_lse = max(worst_lse, float(np.abs(got[rows, 3] / alone[:, 3] - 1).max()))
        k = np.isfinite(alone[:, 2])
        if k.any():
            worst_lp = max(worst_lp, float(np.abs(got[rows, 2][k] - alone[k, 2]).max()))
        clear = alone[:, 1] > 1e-2  # greedy ids equal where the margin is not a near-tie
        assert np.array_equal(got[rows, 0][clear], alone[clear, 0])
    print(f"packed vs alone: logsumexp rel {worst_lse:.2e}, log-prob max |d| {worst_lp:.2e}")
    assert worst_lse < 5e-4 and worst_lp < 1e-2
    # a shared prefix: B = A[:20] + 6 own tokens; A's 20 rows copied, B's own tokens alone
    a = prompts[2]
    b = np.concatenate([a[:20], _prompts(model, [6], seed=5)[0]])
    bb = S  # B's base (128-aligned)
    gpu.copy_kv(int(tok[ends[1], 0]), bb, 20)  # A sits after the 1- and 9-token prompts
    own = np.arange(20, 26)
    shared = gpu.packed(b[own], np.stack([bb + own, np.full(6, bb)], 1), [5], [-1])
    alone = ops.row_stats(gpu.window_logits(b, 25), np.array([-1], np.int32))
    assert abs(shared[0, 3] / alone[0, 3] - 1) < 5e-4
    if alone[0, 1] > 1e-2:
        assert shared[0, 0] == alone[0, 0]


def test_backend_packed_top_matches_the_reference(model):
    """packed(..., top=k), k = 1, 5, 20, on ragged prompts in two chunks: bit for bit the twin
    ops.row_topk of the GPU's own logits rows (the head buffer, m <= HEAD_ROWS) and stats; the
    stats those of top=0; against the CPU reference's packed(top=20) (tie-aware): ids equal
    where the reference's logits around the place are further apart than tau (twice the
    largest logit difference measured between the engines on the ids both chose), log-probs
    within test_backend_packed_matches_lone_runs_and_the_reference's tolerance."""
    from topk_data import same_bits

    from minfer.cuda.backend import CudaBackend
    from minfer.reference import ops
    from minfer.reference.forward import ReferenceBackend

    lengths = [1, 9, 30, 2, 17]
    prompts = _prompts(model, lengths, seed=2)
    tok, S = _layout(lengths)
    ids = np.concatenate(prompts)
    T, V = len(ids), model.config.vocab_size
    nxt = np.concatenate([np.append(p[1:], -1) for p in prompts]).astype(np.int32)
    gpu = CudaBackend(model, max_tokens=64, ubatch=40, kv_slots=S + 256)
    cpu = ReferenceBackend(model, max_tokens=64)
    cpu.reserve_slots(S + 256)
    chunks = [np.arange(s, min(s + 40, T)) for s in range(0, T, 40)]
    heads = []
    real = cpu._head
    cpu._head = lambda x: heads.append(real(x)) or heads[-1]
    ref = [cpu.packed(ids[r], tok[r], r - r[0], nxt[r], top=20) for r in chunks]
    ref_st, ref_ids, ref_lp = (np.concatenate(a) for a in zip(*ref))
    ref_logits = np.concatenate(heads).astype(np.float32)
    plain = np.concatenate([gpu.packed(ids[r], tok[r], r - r[0], nxt[r]) for r in chunks])
    for k in (1, 5, 20):
        got = []
        for r in chunks:
            st, top_ids, top_lp = gpu.packed(ids[r], tok[r], r - r[0], nxt[r], top=k)
            assert len(r) <= gpu.HEAD_ROWS  # the head buffer holds every row's logits
            logits = gpu._head_out.get()[: len(r)]
            t_ids, t_lp = ops.row_topk(logits, st, k)
            assert np.array_equal(top_ids, t_ids) and same_bits(top_lp, t_lp)
            assert np.array_equal(top_ids[:, 0], st[:, 0].astype(np.int32))  # top 1: greedy
            got.append((st, top_ids, top_lp))
        st, g_ids, g_lp = (np.concatenate(a) for a in zip(*got))
        np.testing.assert_allclose(st, plain, rtol=1e-6, atol=1e-6)  # top 0's numbers
        # tie-aware: tau from the logits of the ids both engines put in their top k
        both = [
            (i, j, int(np.flatnonzero(ref_ids[i] == g_ids[i, j])[0]))
            for i in range(T)
            for j in range(k)
            if g_ids[i, j] in ref_ids[i]
        ]
        dlogit = [abs((g_lp[i, j] + st[i, 3]) - (ref_lp[i, c] + ref_st[i, 3])) for i, j, c in both]
        assert both  # (a GPU top 1 outside the reference's top 20 in every row: a bug)
        tau = 2 * max(dlogit)
        print(f"\npacked top={k} GPU vs CPU: max |dlogit| {max(dlogit):.4f} (tau {tau:.4f})")
        assert max(dlogit) < 0.3  # the f16 path's distance (log-probs within 0.25 above);
        #                             a wrong row or id is nats off
        srt = np.take_along_axis(ref_logits, ref_ids.astype(np.int64), 1)  # descending
        kth1 = np.sort(ref_logits, axis=1)[:, -(k + 1)] if V > k else np.full(T, -np.inf)
        nxt_v = np.concatenate([srt[:, 1:k], kth1[:, None]], axis=1)  # the value after place j
        prev_v = np.concatenate([np.full((T, 1), np.inf), srt[:, : k - 1]], axis=1)
        clear = (prev_v - srt[:, :k] > tau) & (srt[:, :k] - nxt_v > tau)
        assert np.array_equal(g_ids[clear], ref_ids[:, :k][clear])
        sets = srt[:, k - 1] - kth1 > tau  # the k-th and (k+1)-th apart: the same set
        for i in np.flatnonzero(sets):
            assert set(g_ids[i]) == set(ref_ids[i, :k])
        print(
            f"  ids compared at {int(clear.sum())} of {T * k} places, sets on "
            f"{int(sets.sum())} of {T} rows"
        )
        assert clear.any()  # the comparison is not vacuous
        d = np.abs(g_lp[clear] - ref_lp[:, :k][clear])
        assert d.mean() < 0.03 and d.max() < 0.25


def test_backend_packed_refusals(model):
    from minfer.cuda.backend import CudaBackend
    from minfer.errors import BadInput

    gpu = CudaBackend(model, max_tokens=32, ubatch=16, kv_slots=256, warmup=False)
    ids = np.zeros(4, np.int32)
    tok = np.stack([np.arange(4), np.zeros(4)], 1).astype(np.int32)
    for bad, msg in (
        ((ids, tok[::-1], [0], [-1]), "non-decreasing"),
        ((ids, tok + 300, [0], [-1]), "slots must"),
        ((ids, tok * [1, 0] + [40, 0], [0], [-1]), "position 43"),
        ((ids, tok, [4], [-1]), "rows"),
        ((np.zeros(17, np.int32), np.zeros((17, 2), np.int32), [], []), "1..16 tokens"),
    ):
        with pytest.raises(BadInput, match=msg):
            gpu.packed(*bad)
    with pytest.raises(BadInput, match="overlapping"):
        gpu.copy_kv(0, 10, 20)
