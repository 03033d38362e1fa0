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

    def alloc(self, nblk: int) -> int | None:
        """The first slot of nblk free contiguous blocks (now taken), or None."""
        if nblk > self.n:
            return None
        c = np.concatenate([[0], np.cumsum(~self.used)])  # free blocks before each index
        fits = np.flatnonzero(c[nblk:] - c[:-nblk] == nblk)  # windows wholly free
        if not fits.size:
            return None
        s = int(fits[0])
        self.used[s : s + nblk] = True
        return s * ALIGN

    def release(self, base: int, nblk: int) -> None:
        s = base // ALIGN
        assert self.used[s : s + nblk].all(), "releasing blocks that are not taken"
        self.used[s : s + nblk] = False

    @property
    def free_blocks(self) -> int:
        return int(self.n - self.used.sum())


@dataclass(eq=False)
class Rows:
    """Computed prompt rows in the KV cache: ids [n] at slots base..base+n-1 (the first `done`
    of them written), and per row p < n - 1 that was scored: argmax id, log-prob of ids[p + 1],
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

    def alloc_stats(self, top: int) -> None:
        m = max(len(self.ids) - 1, 0)
        self.top = top
        self.argmax = np.full(m, -1, np.int32)
        self.logprob = np.full(m, np.nan, np.float32)
        self.top_ids = np.zeros((m, top), np.int32)
        self.top_lp = np.zeros((m, top), np.float32)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """Finished prompts' rows kept in the KV cache, least recently used first out."""

    def __init__(self, max_entries: int = 4096, enabled: bool = True):
        self.entries: OrderedDict[int, Rows] = OrderedDict()
        self.max_entries = max_entries
        self.enabled = enabled
        self.hits = 0
        self.hit_tokens = 0
        self._first: dict[int, set[int]] = {}  # first token -> entry keys (the search's index)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def blocks(self) -> int:
        return sum(e.nblk for e in self.entries.values())

    def with_first(self, token: int):
        """The entries whose prompt starts with `token` (no other can share a prefix)."""
        return [self.entries[k] for k in self._first.get(token, ())]

    def add(self, rows: Rows) -> bool:
        """Keep a finished prompt's rows (False: not kept, the caller frees its blocks)."""
        if not self.enabled or self.max_entries <= 0:
            return False
        first = int(rows.ids[0])
        for e in self.with_first(first):  # already held, whole or inside a longer entry
            if common_prefix(e.ids, rows.ids) == len(rows.ids) and e.top >= rows.top:
                self.entries.move_to_end(id(e))
                return False
        self.entries[id(rows)] = rows
        self._first.setdefault(first, set()).add(id(rows))
        return True

    def evict(self) -> Rows | None:
        """The least recently used entry no sharer is waiting on, taken out (or None)."""
        for k, e in self.entries.items():
            if e.pins == 0:
                del self.entries[k]
                keys = self._first[int(e.ids[0])]
                keys.discard(k)
                if not keys:
                    del self._first[int(e.ids[0])]
                return e
        return None

    def over(self) -> bool:
        return len(self.entries) > self.max_entries
