"""The server's KV cache bookkeeping: slot blocks for sequences, and the prefix cache.

A sequence owns a contiguous range of slots starting at a multiple of ALIGN (the batch
scheduler's rule: its attention tiles are those of a lone run), footprint = prompt + generated
tokens - 1, rounded up. When it finishes, its prompt's rows stay in the cache as a prefix
entry (LRU), with the prompt rows' statistics when they were computed: a later prompt that
starts with the same tokens copies those rows (copy_kv) instead of computing them. Entries are
evicted, least recently used first, when a new sequence needs their blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from minfer.batch.schedule import ALIGN


def blocks(n_slots: int) -> int:
    """ALIGN-slot blocks that n_slots need."""
    return max(1, -(-int(n_slots) // ALIGN))


class SlotMap:
    """Which of the cache's blocks are taken; first fit over contiguous runs."""

    def __init__(self, kv_slots: int):
        self.n = int(kv_slots) // ALIGN
        self.used = np.zeros(self.n, bool)
        self.free_blocks = self.n

    def alloc(self, nblk: int) -> int | None:
        """The first slot of nblk free contiguous blocks (now taken), or None. Too few free
        blocks fail at once (the scheduler evicts one entry and asks again, per admission)."""
        if nblk > self.free_blocks:
            return None
        c = np.concatenate([[0], np.cumsum(~self.used)])  # free blocks before each index
        fits = np.flatnonzero(c[nblk:] - c[:-nblk] == nblk)  # windows wholly free
        if not fits.size:
            return None
        s = int(fits[0])
        self.used[s : s + nblk] = True
        self.free_blocks -= nblk
        return s * ALIGN

    def release(self, base: int, nblk: int) -> None:
        s = base // ALIGN
        assert self.used[s : s + nblk].all(), "releasing blocks that are not taken"
        self.used[s : s + nblk] = False
        self.free_blocks += nblk


@dataclass(eq=False)
class Rows:
    """Computed prompt rows in the KV cache: ids [n] at slots base..base+n-1 (the first `done`
    of them written or in a forward on its way, the first `handed` of them back), and per
    row p < n - 1 that was scored: argmax id, log-prob of ids[p + 1],
    and (when top > 0) the top ids and log-probs. A running sequence and a prefix entry both
    are Rows, so a new prompt can share from either."""

    ids: np.ndarray
    base: int
    nblk: int
    done: int = 0
    top: int = -1  # -1: no row statistics; else the top-k width kept
    argmax: np.ndarray | None = None  # int32 [n - 1]
    logprob: np.ndarray | None = None  # f32 [n - 1]
    top_ids: np.ndarray | None = None  # int32 [n - 1, top]
    top_lp: np.ndarray | None = None  # f32 [n - 1, top]
    freed: bool = False  # its blocks went back: nothing to copy from
    pins: int = 0  # sharers waiting to copy from it (no eviction)
    extra: dict = field(default_factory=dict)
    # the first `handed` rows' numbers are back on the host (done counts rows packed into a
    # forward, which may still run: the scheduler's overlap); a sharer copies handed rows only
    handed: int = 0

    def alloc_stats(self, top: int) -> None:
        m = max(len(self.ids) - 1, 0)
        self.top = top
        self.argmax = np.full(m, -1, np.int32)
        self.logprob = np.full(m, np.nan, np.float32)
        self.top_ids = np.zeros((m, top), np.int32)
        self.top_lp = np.zeros((m, top), np.float32)


def head_key(ids: np.ndarray, k: int) -> bytes | None:
    """The prefix search's key: a prompt's first k tokens (k: the least a share may be; two
    prompts can share that many only with equal keys), None when it is shorter than k."""
    return np.ascontiguousarray(ids[:k], np.int32).tobytes() if len(ids) >= k else None


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """Finished prompts' rows kept in the KV cache, least recently used first out. key_len:
    the least a share may be (the scheduler's min_share); entries are found by their first
    key_len tokens (head_key), so a search never scans prompts that merely start alike (every
    prompt's BOS)."""

    def __init__(self, max_entries: int = 4096, enabled: bool = True, key_len: int = 1):
        self.entries: OrderedDict[int, Rows] = OrderedDict()
        self.max_entries = max_entries
        self.enabled = enabled
        self.key_len = max(1, int(key_len))
        self.hits = 0
        self.hit_tokens = 0
        self.blocks = 0  # the entries' blocks
        self._heads: dict[bytes, set[int]] = {}  # head_key -> entry keys (the search's index)

    def __len__(self) -> int:
        return len(self.entries)

    def with_head(self, key: bytes | None):
        """The entries whose prompt starts with the tokens of key (head_key; no other can share
        key_len tokens)."""
        return [self.entries[k] for k in self._heads.get(key, ())] if key is not None else []

    def add(self, rows: Rows) -> bool:
        """Keep a finished prompt's rows (False: not kept, the caller frees its blocks; a
        prompt shorter than key_len could never be shared)."""
        key = head_key(rows.ids, self.key_len)
        if not self.enabled or self.max_entries <= 0 or key is None:
            return False
        for e in self.with_head(key):  # already held, whole or inside a longer entry
            if common_prefix(e.ids, rows.ids) == len(rows.ids) and e.top >= rows.top:
                self.entries.move_to_end(id(e))
                return False
        self.entries[id(rows)] = rows
        self._heads.setdefault(key, set()).add(id(rows))
        self.blocks += rows.nblk
        return True

    def evict(self) -> Rows | None:
        """The least recently used entry no sharer is waiting on, taken out (or None)."""
        for k, e in self.entries.items():
            if e.pins == 0:
                del self.entries[k]
                key = head_key(e.ids, self.key_len)
                keys = self._heads[key]
                keys.discard(k)
                if not keys:
                    del self._heads[key]
                self.blocks -= e.nblk
                return e
        return None

    def over(self) -> bool:
        return len(self.entries) > self.max_entries
