"""The server's KV bookkeeping (minfer.batch.slots): SlotMap's first fit against a brute-force
model, the prefix cache's key index against a scan of every entry, its block count."""

from __future__ import annotations

import numpy as np

from minfer.batch.scheduler import Job, Scheduler
from minfer.batch.slots import PrefixCache, Rows, SlotMap, common_prefix, head_key


def _first_fit(used: np.ndarray, nblk: int) -> int | None:
    for s in range(len(used) - nblk + 1):
        if not used[s : s + nblk].any():
            return s
    return None


def test_slot_map_is_first_fit_and_counts_free_blocks():
    rng = np.random.default_rng(0)
    m = SlotMap(64 * 128)
    held: list[tuple[int, int]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            base, n = held.pop(int(rng.integers(len(held))))
            m.release(base, n)
        else:
            n = int(rng.choice([1, 1, 1, 2, 3, 7]))
            want = _first_fit(m.used, n)
            got = m.alloc(n)
            assert (got is None) == (want is None)
            if got is not None:
                assert got == want * 128
                held.append((got, n))
        assert m.free_blocks == m.n - int(m.used.sum())


def _rows(ids, nblk=1) -> Rows:
    return Rows(np.asarray(ids, np.int32), 0, nblk)


def test_the_cache_index_finds_what_a_scan_of_every_entry_finds():
    """Entries sharing at least key_len tokens with a prompt are exactly those with its key;
    a prompt shorter than key_len is never kept (it could not be shared); blocks counts."""
    rng = np.random.default_rng(1)
    k = 4
    c = PrefixCache(64, key_len=k)
    kept = []
    for _ in range(200):
        n = int(rng.integers(1, 9))
        ids = np.concatenate([[1], rng.integers(2, 4, n - 1)]).astype(np.int32)  # BOS, few ids
        r = _rows(ids, int(rng.integers(1, 3)))
        if c.add(r):
            kept.append(r)
            assert len(ids) >= k
        elif len(ids) < k:
            assert head_key(ids, k) is None
        while c.over():
            e = c.evict()
            kept.remove(e)
        assert c.blocks == sum(e.nblk for e in c.entries.values())
        probe = np.concatenate([[1], rng.integers(2, 4, 7)]).astype(np.int32)
        found = {id(e) for e in c.with_head(head_key(probe, k))}
        scan = {id(e) for e in c.entries.values() if common_prefix(e.ids, probe) >= k}
        assert found == scan


class _Be:
    def packed(self, ids, tok, rows, targets, top=0, hidden=None):
        st = np.zeros((len(rows), 4), np.float32)
        return (
            (st, np.zeros((len(rows), top), np.int32), np.zeros((len(rows), top), np.float32))
            if top
            else st
        )

    def copy_kv(self, src, dst, n):
        pass


def test_a_shared_head_is_found_among_prompts_that_start_alike():
    """Every prompt starts with the same token (a BOS); the one that shares 20 tokens with a
    running prompt copies them, the others copy nothing."""
    s = Scheduler(_Be(), 1 << 14, 256, min_share=16)
    rng = np.random.default_rng(2)
    base = np.concatenate([[1], rng.integers(5, 900, 40)]).astype(np.int32)
    others = [np.concatenate([[1], rng.integers(5, 900, 40)]).astype(np.int32) for _ in range(5)]
    twin = np.concatenate([base[:20], rng.integers(5, 900, 10)]).astype(np.int32)
    s.submit([Job(p, 0, lambda k, v: None) for p in [base, *others]])
    s._admit()
    s.submit([Job(twin, 0, lambda k, v: None)])
    s._admit()
    assert [q.share for q in s.running] == [0] * 6 + [20]
