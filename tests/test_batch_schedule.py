"""CPU: the plan of a many-prompt run (minfer.batch.schedule): waves that fit the KV slots, read
lazily from the input; bases and footprints; prefix sharing; prefill chunks checked by a KV-cache
simulation (every row a token attends holds exactly its sequence's prefix, copies included);
rows and targets with and without log-probs; the decode layout and its bucket padding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minfer.batch.schedule import (
    ALIGN,
    BUCKETS,
    MIN_SHARE,
    Chunk,
    Seq,
    bucket,
    copy_shared_logprobs,
    decode_layout,
    footprint,
    pad_to_bucket,
    plan_wave,
    prefill_chunks,
    waves,
)


def ids(*xs) -> np.ndarray:
    return np.array(xs, np.int32)


def pairs(prompts):
    return [(k, np.asarray(p, np.int32)) for k, p in enumerate(prompts)]


class Counting:
    """An iterator that counts what was taken from it."""

    def __init__(self, it):
        self.it, self.taken = iter(it), 0

    def __iter__(self):
        return self

    def __next__(self):
        x = next(self.it)
        self.taken += 1
        return x


def check_wave(wave: list[Seq], kv_slots: int, n_predict: int) -> None:
    """Bases aligned and increasing, footprints disjoint and inside the cache."""
    end = 0
    for s in wave:
        assert s.base % ALIGN == 0 and s.base >= end
        assert s.slots == footprint(len(s.ids), n_predict)
        end = s.base + s.slots
    assert end <= kv_slots


def simulate(wave: list[Seq], chunks: list[Chunk], ubatch: int, logprobs: bool):
    """Run the chunks on a model of the KV cache whose rows hold the prefix they encode; check
    every packed() constraint and what each row reads. -> {key: positions computed}."""
    by_base = {s.base: s for s in wave}
    kv: dict[int, tuple] = {}
    done: dict[int, list[int]] = {s.key: [] for s in wave}
    first_own: dict[int, int] = {}  # key -> chunk index of its first own token
    for ci, ch in enumerate(chunks):
        T = len(ch.ids)
        assert 1 <= T <= ubatch
        assert ch.ids.dtype == np.int32 and ch.tok.dtype == np.int32 and ch.tok.shape == (T, 2)
        assert ch.rows.dtype == np.int32 and ch.targets.dtype == np.int32
        assert np.all(np.diff(ch.tok[:, 0]) >= 0) and np.all(np.diff(ch.tok[:, 1]) >= 0)
        for src, dst, n in ch.copies:
            for i in range(n):
                assert src + i in kv, "a copy reads a row not yet written"
                kv[dst + i] = kv[src + i]
        for t in range(T):  # the forward: every token's row is written, then attention reads
            slot, lo = (int(x) for x in ch.tok[t])
            s = by_base[lo]
            p = slot - lo
            assert 0 <= p < len(s.ids) and ch.ids[t] == s.ids[p]
            kv[slot] = tuple(s.ids[: p + 1].tolist())
            done[s.key].append(p)
            first_own.setdefault(s.key, ci)
        for t in range(T):
            slot, lo = (int(x) for x in ch.tok[t])
            s = by_base[lo]
            for j in range(lo, slot + 1):
                assert kv.get(j) == tuple(s.ids[: j - lo + 1].tolist()), (s.key, slot, j)
        # rows and targets
        assert len(ch.rows) == len(ch.targets) == len(ch.owners)
        for r, tg, (key, p) in zip(ch.rows, ch.targets, ch.owners):
            slot, lo = (int(x) for x in ch.tok[r])
            s = by_base[lo]
            assert s.key == key and slot - lo == p
            assert tg == (s.ids[p + 1] if p < len(s.ids) - 1 else -1)
        if logprobs:  # every computed position
            assert list(ch.rows) == list(range(T))
        else:
            lasts = [
                r
                for r in range(T)
                if ch.tok[r, 0] - ch.tok[r, 1] == len(by_base[ch.tok[r, 1]].ids) - 1
            ]
            assert list(ch.rows) == lasts and set(ch.targets.tolist()) <= {-1}
    # every prompt token exactly once, less its shared prefix; copies before the first token
    for s in wave:
        assert sorted(done[s.key]) == list(range(s.share, len(s.ids)))
        if s.share:  # its copy in the chunk of its first own token, nowhere else
            copy = (next(o.base for o in wave if o.key == s.owner), s.base, s.share)
            assert [ci for ci, ch in enumerate(chunks) if copy in ch.copies] == [first_own[s.key]]
    return done


def run_plan(prompts, kv_slots, n_predict, share, ubatch, logprobs, **kw):
    out = []
    for wave in waves(pairs(prompts), kv_slots, n_predict, share, logprobs=logprobs, **kw):
        check_wave(wave, kv_slots, n_predict)
        chunks = prefill_chunks(wave, ubatch, logprobs)
        simulate(wave, chunks, ubatch, logprobs)
        out.append((wave, chunks))
    assert sorted(s.key for w, _ in out for s in w) == list(range(len(prompts)))
    return out


# -- waves -------------------------------------------------------------------------------------
def test_footprint():
    assert footprint(1, 0) == footprint(1, 1) == footprint(128, 1) == 128
    assert footprint(128, 2) == 256 and footprint(100, 29) == 128 and footprint(100, 30) == 256


def test_ragged_lengths_fill_waves_in_input_order():
    rng = np.random.default_rng(0)
    lens = [1, 5, 127, 128, 129, 300, 2, 1000, 17, 64]
    prompts = [rng.integers(0, 50, n) for n in lens]
    out = run_plan(prompts, 1024, 4, False, 100, False)
    keys = [[s.key for s in w] for w, _ in out]
    assert list(itertools.chain(*keys)) == list(range(len(lens)))  # consecutive runs
    for w, _ in out:  # each wave as full as the input allows
        used = sum(s.slots for s in w)
        nxt = max(s.key for s in w) + 1
        assert nxt == len(lens) or used + footprint(lens[nxt], 4) > 1024


def test_one_token_prompts():
    out = run_plan([[7]] * 20, 1024, 1, True, 3, True)
    assert [len(w) for w, _ in out] == [8, 8, 4]
    for w, chunks in out:
        assert all(s.share == 0 for s in w)  # one token: nothing to share
        assert [len(c.ids) for c in chunks] == ([3, 3, 2] if len(w) == 8 else [3, 1])
        assert all(list(c.targets) == [-1] * len(c.ids) for c in chunks)


def test_prompt_exactly_at_kv_slots():
    ((w, chunks),) = run_plan([np.arange(500)], 512, 13, True, 64, False)
    assert w[0].base == 0 and w[0].slots == 512
    ((w, chunks),) = run_plan([np.arange(512)], 512, 1, True, 512, True)
    assert len(chunks) == 1 and len(chunks[0].rows) == 512


def test_prompt_too_large_names_its_key():
    ok = [(0, np.arange(10)), (1, np.arange(20))]
    it = waves(ok + [(41, np.arange(500))] + ok, 512, 14, True)
    assert [s.key for s in next(it)] == [0, 1]  # the waves before it first
    with pytest.raises(ValueError, match="prompt 41: 500 tokens"):
        next(it)
    with pytest.raises(ValueError, match="prompt 9"):
        plan_wave([(9, np.arange(129))], 128, 1, False)
    with pytest.raises(ValueError, match="prompt 3: 0 tokens"):
        list(waves([(3, np.zeros(0, np.int32))], 128, 1, False))


def test_plan_wave_returns_the_rest():
    p = [(k, np.arange(100)) for k in range(5)]
    wave, rest = plan_wave(p, 300, 1, False)
    assert [s.key for s in wave] == [0, 1] and [k for k, _ in rest] == [2, 3, 4]
    wave, rest = plan_wave(p, 10_000, 1, False, max_seqs=4)
    assert len(wave) == 4 and [k for k, _ in rest] == [4]
    wave, rest = plan_wave(p, 10_000, 1, False)
    assert len(wave) == 5 and rest == []


def test_ten_thousand_tiny_prompts_lazily():
    n = 10_000
    src = Counting((k, np.array([k % 97, k % 5], np.int32)) for k in range(n))
    seen = 0
    count = 0
    for wave in waves(src, 128 * 300, 8, True):
        assert len(wave) == min(300, n - seen)
        seen += len(wave)
        count += 1
        assert src.taken <= seen + 1  # at most the one that did not fit
        chunks = prefill_chunks(wave, 256, False)
        assert sum(len(c.rows) for c in chunks) == len(wave)
    assert seen == n and count == -(-n // 300)
    src = Counting((k, np.array([1], np.int32)) for k in range(n))
    it = waves(src, 1 << 30, 1, False, max_seqs=64)
    assert len(next(it)) == 64 and src.taken == 64  # max_seqs: nothing read ahead
    assert sum(len(w) for w in it) == n - 64


# -- sharing -----------------------------------------------------------------------------------
def test_prefix_shared_by_all():
    rng = np.random.default_rng(1)
    head = rng.integers(0, 1000, 40)
    # distinct first suffix tokens: each neighbour's common prefix is the head exactly
    prompts = [np.concatenate([head, [1000 + k], rng.integers(0, 1000, k)]) for k in range(12)]
    prompts.append(head[:30])  # shorter than the head: the first, the owner of the chain
    prompts.append(head.copy())  # exactly the head
    for logprobs in (False, True):
        ((wave, chunks),) = run_plan(prompts, 1 << 16, 3, True, 50, logprobs)
        assert [s.key for s in wave] == [12, 13] + list(range(12))  # lexicographic order
        assert wave[0].share == 0 and wave[0].owner is None
        assert (wave[1].share, wave[1].owner) == (29 if logprobs else 30, 12)
        for a, b in zip(wave[1:], wave[2:]):
            p = 39 if logprobs else 40
            assert (b.share, b.owner) == (p, a.key)
        computed = sum(len(c.ids) for c in chunks)
        assert computed == sum(len(s.ids) - s.share for s in wave)


def test_prefix_shared_by_none():
    rng = np.random.default_rng(2)
    prompts = [np.concatenate([[k], rng.integers(0, 9, 50)]) for k in range(10)]
    for share in (False, True):
        ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, share, 128, False)
        assert all(s.share == 0 and s.owner is None for s in wave)
        assert all(c.copies == [] for c in chunks)
        assert sum(len(c.ids) for c in chunks) == 510


def test_min_share_and_identical_prompts():
    a = np.arange(40)
    prompts = [a, a, a[:20], np.concatenate([a[:15], [99]])]
    ((wave, _),) = run_plan(prompts, 1 << 16, 1, True, 16, False)
    got = {s.key: (s.share, s.owner) for s in wave}
    # a prefix sorts first; 99 > 15 puts a[:15] + [99] last
    assert [s.key for s in wave] == [2, 0, 1, 3]
    assert got == {2: (0, None), 0: (20, 2), 1: (39, 0), 3: (0, None)}  # 15 < MIN_SHARE
    ((wave, _),) = run_plan(prompts, 1 << 16, 1, True, 16, False, min_share=15)
    assert {s.key: s.share for s in wave}[3] == 15
    assert MIN_SHARE == 16


def test_copy_waits_for_the_owners_rows():
    a = np.arange(100)
    prompts = [a, np.concatenate([a[:90], [500, 501]])]
    ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, True, 64, False)
    # the owner's rows 0..63 in chunk 0, 64..99 in chunk 1 (cut short at its end), the copy
    # of 90 rows before chunk 2
    assert [len(c.ids) for c in chunks] == [64, 36, 2]
    assert chunks[1].copies == [] and chunks[2].copies == [(0, 128, 90)]
    # a copy that needs no cut: rows computed in an earlier chunk
    ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, True, 200, False)
    assert len(chunks) == 2 and chunks[1].copies == [(0, 128, 90)]


def test_chain_of_copies_in_one_chunk():
    a = np.arange(60)
    prompts = [a, a.copy(), a.copy(), a.copy()]
    ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, True, 256, False)
    # the owner's chunk, then one chunk: three chained copies, three last tokens
    assert [len(c.ids) for c in chunks] == [60, 3]
    assert chunks[1].copies == [(0, 128, 59), (128, 256, 59), (256, 384, 59)]
    # one token a chunk: each copy goes with its sharer's token, not with the chunk before
    ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, True, 1, False)
    assert len(chunks) == 63 and [c.copies for c in chunks[60:]] == [
        [(0, 128, 59)],
        [(128, 256, 59)],
        [(256, 384, 59)],
    ]


def test_rows_and_targets():
    p = [ids(5, 6, 7, 8), ids(9), ids(1, 2)]
    ((wave, chunks),) = run_plan(p, 1024, 1, False, 3, False)
    assert [c.ids.tolist() for c in chunks] == [[5, 6, 7], [8, 9, 1], [2]]
    assert [c.rows.tolist() for c in chunks] == [[], [0, 1], [0]]
    assert [c.owners for c in chunks] == [[], [(0, 3), (1, 0)], [(2, 1)]]
    assert chunks[1].tok.tolist() == [[3, 0], [128, 128], [256, 256]]
    ((wave, chunks),) = run_plan(p, 1024, 1, False, 3, True)
    assert [c.rows.tolist() for c in chunks] == [[0, 1, 2], [0, 1, 2], [0]]
    assert [c.targets.tolist() for c in chunks] == [[6, 7, 8], [-1, -1, 2], [-1]]


def test_logprobs_of_sharers_come_from_the_owner():
    rng = np.random.default_rng(3)
    head = rng.integers(0, 50, 30)
    prompts = [np.concatenate([head, rng.integers(0, 50, 5)]) for _ in range(6)]
    ((wave, chunks),) = run_plan(prompts, 1 << 16, 1, True, 32, True)
    lp = {s.key: np.full(len(s.ids) - 1, np.nan) for s in wave}
    by_base = {s.base: s for s in wave}
    for c in chunks:  # a fake log-prob: a hash of (context, target)
        for r, tg, (key, p) in zip(c.rows, c.targets, c.owners):
            s = by_base[int(c.tok[r, 1])]
            if tg >= 0:
                lp[key][p] = hash((tuple(s.ids[: p + 1].tolist()), int(tg))) % 1000
    copy_shared_logprobs(wave, lp)
    for s in wave:
        want = [
            hash((tuple(s.ids[: p + 1].tolist()), int(s.ids[p + 1]))) % 1000
            for p in range(len(s.ids) - 1)
        ]
        assert lp[s.key].tolist() == want
    # a wave planned without log-probs shares the owner's diverging row: refused for them
    ((wave, _),) = run_plan(prompts, 1 << 16, 1, True, 32, False)
    assert any(s.share for s in wave)
    with pytest.raises(ValueError, match="logprobs=True"):
        prefill_chunks(wave, 32, True)


def test_bad_waves_refused():
    a = np.arange(40, dtype=np.int32)
    with pytest.raises(ValueError, match="not a multiple"):
        prefill_chunks([Seq(0, a, 64)], 8, False)
    with pytest.raises(ValueError, match="owner 5 is not before"):
        prefill_chunks([Seq(0, a, 0, 20, 5)], 8, False)
    with pytest.raises(ValueError, match="not a common prefix"):
        prefill_chunks([Seq(0, a, 0), Seq(1, a + 1, 128, 20, 0)], 8, False)
    with pytest.raises(ValueError, match="ubatch"):
        prefill_chunks([Seq(0, a, 0)], 0, False)


# -- decode ------------------------------------------------------------------------------------
def test_decode_layout():
    w, _ = plan_wave(pairs([np.arange(10), np.arange(300), np.arange(1)]), 4096, 4, False)
    got_ids, tok = decode_layout(w, [11, 300, 3], [7, 8, 9])
    assert got_ids.dtype == np.int32 and got_ids.tolist() == [7, 8, 9]
    assert tok.dtype == np.int32 and tok.tolist() == [[11, 0], [128 + 300, 128], [512 + 3, 512]]
    with pytest.raises(ValueError, match="past its"):
        decode_layout(w[2:], [128], [1])
    with pytest.raises(ValueError, match="fewer than its prompt"):
        decode_layout(w[1:2], [299], [1])
    with pytest.raises(ValueError, match="increasing base"):
        decode_layout(w[::-1], [3, 300, 11], [1, 2, 3])


def test_bucket_padding():
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 129)] == [1, 2, 4, 8, 16, 256]
    assert bucket(5, cap=6) == 6 and bucket(7, cap=6) == 7 and bucket(70_000) == 70_000
    assert bucket(90, (1, 2, 64, 96, 128)) == 96 and BUCKETS[:4] == (1, 2, 4, 8)
    w, _ = plan_wave(pairs([np.arange(3)] * 5), 4096, 4, False)
    i, t = decode_layout(w, [3, 4, 5, 3, 3], [1, 2, 3, 4, 5])
    pi, pt, n = pad_to_bucket(i, t)
    assert n == 5 and len(pi) == 8 and pt.shape == (8, 2) and pi.dtype == np.int32
    assert pi.tolist() == [1, 2, 3, 4, 5, 5, 5, 5]
    assert pt[5:].tolist() == [t[-1].tolist()] * 3
    assert np.all(np.diff(pt, axis=0) >= 0)
    pi, pt, n = pad_to_bucket(i[:4], t[:4])
    assert n == 4 and len(pi) == 4 and pt.tolist() == t[:4].tolist()
    pi, pt, n = pad_to_bucket(i, t, cap=6)
    assert len(pi) == 6 and n == 5


# -- property ----------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=40), min_size=1, max_size=12),
    slots=st.integers(1, 8),
    odd=st.integers(0, 5),
    n_predict=st.sampled_from([0, 1, 2, 5, 30, 90, 120]),
    share=st.booleans(),
    ubatch=st.integers(1, 70),
    logprobs=st.booleans(),
    min_share=st.integers(1, 4),
    max_seqs=st.one_of(st.none(), st.integers(1, 5)),
)
def test_property_random_prompt_sets(
    prompts, slots, odd, n_predict, share, ubatch, logprobs, min_share, max_seqs
):
    kv_slots = slots * ALIGN + (odd - 1 if odd < 3 else 0)  # not always a multiple of ALIGN
    # a common head on some so that the chains are long
    prompts = [([2, 1, 0, 2, 1, 1, 0, 0] + p) if i % 3 else p for i, p in enumerate(prompts)]
    fits = all(footprint(len(p), n_predict) <= kv_slots for p in prompts)
    if not fits:
        bad = next(k for k, p in enumerate(prompts) if footprint(len(p), n_predict) > kv_slots)
        with pytest.raises(ValueError, match=f"prompt {bad}:"):
            run_plan(
                prompts,
                kv_slots,
                n_predict,
                share,
                ubatch,
                logprobs,
                min_share=min_share,
                max_seqs=max_seqs,
            )
        return
    out = run_plan(
        prompts,
        kv_slots,
        n_predict,
        share,
        ubatch,
        logprobs,
        min_share=min_share,
        max_seqs=max_seqs,
    )
    order = [s.key for w, _ in out for s in sorted(w, key=lambda s: s.key)]
    assert order == list(range(len(prompts)))
    for w, chunks in out:
        assert max_seqs is None or len(w) <= max_seqs
        for a, b in zip(w, w[1:]):
            if share:  # wave order is lexicographic, ties by key
                ta, tb = a.ids.tolist(), b.ids.tolist()
                assert (ta, a.key) < (tb, b.key)
            else:
                assert a.key < b.key
        for s in w:
            assert s.share == 0 or s.share >= min_share
            assert s.share <= len(s.ids) - 1
            if not share:
                assert s.share == 0
        if logprobs:
            lp = {s.key: np.empty(len(s.ids) - 1, dtype=object) for s in w}
            by_base = {s.base: s for s in w}
            for c in chunks:
                for r, tg, (key, p) in zip(c.rows, c.targets, c.owners):
                    if tg >= 0:
                        lp[key][p] = (tuple(by_base[int(c.tok[r, 1])].ids[: p + 1]), int(tg))
            copy_shared_logprobs(w, lp)
            for s in w:
                want = [(tuple(s.ids[: p + 1]), int(s.ids[p + 1])) for p in range(len(s.ids) - 1)]
                assert list(lp[s.key]) == want
        # decode: every live sequence one step at a time stays inside its footprint
        n = {s.key: len(s.ids) for s in w}
        for _ in range(max(n_predict - 1, 0)):
            i, t = decode_layout(w, [n[s.key] for s in w], [0] * len(w))
            assert np.all(np.diff(t, axis=0) >= 0)
            for s, (slot, lo) in zip(w, t.tolist()):
                assert lo == s.base and slot < s.base + s.slots
                n[s.key] += 1
