"""The plan of a many-prompt run (issue 34): which prompts share the KV cache at once (waves),
where each one lives in it, how their tokens are packed into prefill chunks, and the layout of
one batched decode step. Pure: numpy only, no model, no GPU (minfer.batch.run drives a backend
with it).

The backend call it plans for: `packed(ids int32 [T], tok int32 [T, 2], rows int32 [m],
targets int32 [m]) -> f32 [m, 4]`. Token t writes KV row tok[t, 0] (its slot), sits at position
tok[t, 0] - tok[t, 1] (tok[t, 1] = lo, its sequence's first slot) and attends rows lo..slot;
within one call slot and lo never decrease. `copy_kv(src, dst, n)` copies KV rows between calls.

- A wave (`waves`, `plan_wave`) is a run of consecutive prompts of the input whose footprints
  (`footprint`: prompt + decoded tokens, rounded up to ALIGN slots) fit the cache together.
  Inside it the sequences are ordered by their ids (lexicographically, ties by key) so prompts
  with a common prefix are neighbours; bases (first slots, multiples of ALIGN so a sequence's
  attention tiles are those of a lone run) increase in that order, footprints disjoint.
- Prefix sharing: a sequence whose longest common prefix p with its predecessor in that order
  is at least min_share takes share = min(p, n - 1) rows (min(p - 1, n - 1) when log-probs are
  wanted) from the predecessor's slots by copy_kv and computes positions share..n-1 only; the
  predecessor's rows may themselves be partly copied (a chain), which is as good: they hold the
  same keys and values. A sequence always computes its last position (its logits are needed).
- `prefill_chunks` cuts the stream of every sequence's own tokens (wave order) into chunks of
  at most ubatch tokens, a sequence spanning chunks as it must; a sharer's copy is put before
  the chunk of its first own token, once the rows it copies are written (the chunk holding its
  owner's last shared row is cut short when needed).
- Log-probs (`logprobs=True`): every computed position p gives log p(ids[p + 1] | ids[:p + 1]);
  a sharer's first `share` ones are its owner's (`copy_shared_logprobs`), which is why a wave
  planned for log-probs shares one row less: the owner's row share - 1 must predict the same
  next token as the sharer's. The runner copies its other per-row arrays (argmax ids, top-k)
  the same way.
- Continuations (a prompt given as (key, ids, first)): without logprobs only rows first-1..n-1
  are scored (they predict tokens first..n-1, and the last row the greedy id); a sharer shares
  at most first - 1 rows, so its scored rows are its own and nothing is copied.
- Decode (`decode_layout`, `pad_to_bucket`): a sequence with n tokens in the cache (prompt +
  ids fed back so far) feeds its newest greedy id at slot base + n, lo = base.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

ALIGN = 128  # a sequence's first slot is a multiple of this (the attention key tile)
MIN_SHARE = 16  # shorter common prefixes are recomputed, not copied
BUCKETS = tuple(1 << i for i in range(17))  # decode step sizes: 1, 2, 4, ..., 65536


@dataclass(frozen=True, eq=False)
class Seq:
    """One prompt placed in the KV cache (eq=False: ids is an array; compare fields)."""

    key: int  # the caller's key (its index in the input)
    ids: np.ndarray  # int32 [n] prompt ids
    base: int  # first slot, a multiple of ALIGN
    share: int = 0  # leading rows taken from `owner`'s slots by copy_kv (0: none)
    owner: int | None = None  # key of the Seq (earlier in the wave) whose slots hold them
    slots: int = 0  # its footprint: slots base..base+slots-1 are its own (0: not known)
    first: int | None = None  # a continuation's first token: rows first-1.. are scored


@dataclass
class Chunk:
    """One packed() call of the prefill, and the copies to run before it."""

    copies: list[tuple[int, int, int]]  # copy_kv(src, dst, n), in order, BEFORE the forward
    ids: np.ndarray  # int32 [T] token ids
    tok: np.ndarray  # int32 [T, 2] (slot, lo)
    rows: np.ndarray  # int32 [m] row indices (into the T tokens) to score
    targets: np.ndarray  # int32 [m] next prompt token, or -1 (the last)
    owners: list[tuple[int, int]] = field(default_factory=list)  # per row: (key, position)


def footprint(n: int, n_predict: int) -> int:
    """KV slots a prompt of n tokens needs: its n rows and the n_predict - 1 decoded ones
    (the last greedy id is never fed back), rounded up to ALIGN."""
    need = n + max(n_predict - 1, 0)
    return -(-need // ALIGN) * ALIGN


def _ids(key, ids) -> np.ndarray:
    a = np.asarray(ids)
    if a.dtype != np.int32:
        a = a.astype(np.int32)
    a = a.reshape(-1)
    if a.size == 0:
        raise ValueError(f"prompt {key}: 0 tokens")
    return a


def _item(item) -> tuple[int, np.ndarray, int | None]:
    """(key, ids, first) of a (key, ids) or (key, ids, first) prompt; first: the index of a
    continuation's first token (1 <= first < n), whose log-prob and later ones are scored."""
    key, ids, first = item if len(item) == 3 else (*item, None)
    ids = _ids(key, ids)
    if first is not None and not 1 <= first < ids.size:
        raise ValueError(f"prompt {key}: continuation from token {first} of {ids.size}")
    return key, ids, first


def _fits(key, n: int, kv_slots: int, n_predict: int) -> int:
    need = footprint(n, n_predict)
    if need > kv_slots:
        raise ValueError(
            f"prompt {key}: {n} tokens + {max(n_predict - 1, 0)} decoded need "
            f"{need} KV slots ({ALIGN}-slot aligned), the cache holds {kv_slots}"
        )
    return need


def _sort_key(ids: np.ndarray) -> bytes:
    """Bytes ordered as the ids are lexicographically (a prefix first)."""
    return (ids.astype(np.int64) + (1 << 31)).astype(">u4").tobytes()


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    m = min(a.size, b.size)
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def plan_wave(
    prompts: Sequence[tuple[int, np.ndarray]],
    kv_slots: int,
    n_predict: int,
    share: bool,
    min_share: int = MIN_SHARE,
    *,
    logprobs: bool = False,
    max_seqs: int | None = None,
) -> tuple[list[Seq], list[tuple[int, np.ndarray]]]:
    """(wave, rest): the longest leading run of `prompts` ((key, ids) in input order) whose
    footprints fit kv_slots (at most max_seqs of them) placed in the cache, and the prompts
    left over. ValueError naming its key for a first prompt that cannot fit alone."""
    if n_predict < 0:
        raise ValueError(f"n_predict must be >= 0, got {n_predict}")
    if max_seqs is not None and max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    taken: list[tuple[int, np.ndarray, int, int | None]] = []
    used = 0
    for i, item in enumerate(prompts):
        key, ids, first = _item(item)
        need = footprint(ids.size, n_predict)
        if (max_seqs is not None and len(taken) >= max_seqs) or used + need > kv_slots:
            if not taken:
                _fits(key, ids.size, kv_slots, n_predict)
            return _place(taken, share, min_share, logprobs), list(prompts[i:])
        taken.append((key, ids, need, first))
        used += need
    return _place(taken, share, min_share, logprobs), []


def _place(
    taken: list[tuple[int, np.ndarray, int, int | None]],
    share: bool,
    min_share: int,
    logprobs: bool,
) -> list[Seq]:
    keys = [t[0] for t in taken]
    if len(set(keys)) != len(keys):
        raise ValueError("prompt keys repeat within a wave")
    if share:  # neighbours by ids: a common prefix is shared with the one just before
        taken = sorted(taken, key=lambda t: (_sort_key(t[1]), t[0]))
    out: list[Seq] = []
    base = 0
    prev = None
    min_share = max(int(min_share), 1)
    for key, ids, need, first in taken:
        n_share, owner = 0, None
        if share and prev is not None:
            p = common_prefix(prev.ids, ids)
            s = min(p - 1 if logprobs else p, ids.size - 1)
            if first is not None and not logprobs:  # its scored rows are its own to compute
                s = min(s, first - 1)
            if s >= min_share:
                n_share, owner = s, prev.key
        seq = Seq(key, ids, base, n_share, owner, need, first)
        out.append(seq)
        prev = seq
        base += need
    return out


def waves(
    prompts: Iterable[tuple[int, np.ndarray]],
    kv_slots: int,
    n_predict: int,
    share: bool,
    max_seqs: int | None = None,
    *,
    min_share: int = MIN_SHARE,
    logprobs: bool = False,
) -> Iterator[list[Seq]]:
    """The prompts ((key, ids) pairs, or (key, ids, first) for a continuation from token
    first; input order) as consecutive waves, each a list of Seq in
    wave order (plan_wave), read lazily: a wave holds only the prompts that fit kv_slots (and at
    most max_seqs), and the iterator is read at most one prompt past the wave being yielded
    (the one that did not fit; none once max_seqs is reached). A prompt that cannot fit the
    cache alone: ValueError naming its key, after the waves before it."""
    if n_predict < 0:
        raise ValueError(f"n_predict must be >= 0, got {n_predict}")
    if max_seqs is not None and max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    it = iter(prompts)
    carry = None
    ended = False
    while True:
        batch: list[tuple[int, np.ndarray, int, int | None]] = []
        used = 0
        while max_seqs is None or len(batch) < max_seqs:
            if carry is not None:
                key, ids, first = carry
                carry = None
            else:
                if ended:
                    break
                try:
                    item = next(it)
                except StopIteration:
                    ended = True
                    break
                key, ids, first = _item(item)
            need = footprint(ids.size, n_predict)
            if used + need > kv_slots:
                if not batch:
                    _fits(key, ids.size, kv_slots, n_predict)
                carry = (key, ids, first)
                break
            batch.append((key, ids, need, first))
            used += need
        if not batch:
            return
        yield _place(batch, share, min_share, logprobs)


def _check_wave(wave: Sequence[Seq], logprobs: bool) -> dict[int, Seq]:
    """The wave's Seqs by key; ValueError for a layout prefill_chunks cannot pack."""
    by_key: dict[int, Seq] = {}
    end = 0
    for s in wave:
        n = s.ids.size
        if n < 1:
            raise ValueError(f"prompt {s.key}: 0 tokens")
        if s.key in by_key:
            raise ValueError(f"prompt {s.key} appears twice in the wave")
        if s.base % ALIGN or s.base < end:
            raise ValueError(
                f"prompt {s.key}: base {s.base} is not a multiple of {ALIGN} "
                f"past the previous sequence's slots (which end at {end})"
            )
        if s.slots and s.slots < n:
            raise ValueError(f"prompt {s.key}: {s.slots} slots for {n} tokens")
        end = s.base + max(s.slots, n)
        if s.share:
            o = by_key.get(s.owner)
            if o is None:
                raise ValueError(f"prompt {s.key}: its owner {s.owner} is not before it")
            if (
                not 1 <= s.share <= n - 1
                or s.share > o.ids.size
                or not np.array_equal(o.ids[: s.share], s.ids[: s.share])
            ):
                raise ValueError(
                    f"prompt {s.key}: shares {s.share} tokens, not a common "
                    f"prefix with {s.owner} shorter than itself"
                )
            if logprobs and (s.share >= o.ids.size or o.ids[s.share] != s.ids[s.share]):
                raise ValueError(
                    f"prompt {s.key}: with log-probs the owner's last shared row "
                    "must predict the sharer's next token: plan the wave with "
                    "logprobs=True (one row less shared)"
                )
            if not logprobs and s.first is not None and s.share > s.first - 1:
                raise ValueError(
                    f"prompt {s.key}: shares {s.share} rows, past its scored "
                    f"rows from {s.first - 1}"
                )
        by_key[s.key] = s
    return by_key


def prefill_chunks(wave: Sequence[Seq], ubatch: int, logprobs: bool) -> list[Chunk]:
    """The wave's prefill as packed() calls: every sequence's own tokens (positions
    share..n-1, wave order) in chunks of at most ubatch tokens, each sharer's copy
    (owner.base -> base, share rows) in the copies of the chunk holding its first own token,
    after the chunk that writes the last row it copies. Rows: without logprobs each sequence's
    last position (target -1), and a continuation's positions first-1.. (target ids[p + 1]);
    with logprobs every computed position p (target ids[p + 1], -1 for the last). `owners` names each row's (key, position)."""
    if ubatch < 1:
        raise ValueError(f"ubatch must be >= 1, got {ubatch}")
    by_key = _check_wave(wave, logprobs)
    chunks: list[Chunk] = []
    avail: dict[int, int] = {}  # key -> its leading rows usable by the next copies
    segs: list[tuple[Seq, int, int]] = []  # the open chunk: (seq, first position, end)
    copies: list[tuple[int, int, int]] = []
    used = 0

    def flush() -> None:
        nonlocal segs, copies, used
        if not segs:
            return
        chunks.append(_chunk(copies, segs, logprobs))
        for s, _, b in segs:
            avail[s.key] = max(avail.get(s.key, 0), b)
        segs, copies, used = [], [], 0

    for s in wave:
        n = s.ids.size
        if s.share:
            if used == ubatch:
                flush()
            if avail.get(s.owner, 0) < s.share:
                flush()  # the owner's rows are in the open chunk: run it first
            assert avail.get(s.owner, 0) >= s.share
            o = by_key[s.owner]
            copies.append((o.base, s.base, s.share))
            avail[s.key] = s.share
        p = s.share
        while p < n:
            if used == ubatch:
                flush()
            k = min(n - p, ubatch - used)
            segs.append((s, p, p + k))
            used += k
            p += k
    flush()
    return chunks


def _chunk(copies, segs, logprobs: bool) -> Chunk:
    ids, tok, rows, targets, owners = [], [], [], [], []
    t = 0
    for s, a, b in segs:
        n = s.ids.size
        k = b - a
        ids.append(s.ids[a:b])
        tk = np.empty((k, 2), np.int32)
        tk[:, 0] = np.arange(s.base + a, s.base + b, dtype=np.int32)
        tk[:, 1] = s.base
        tok.append(tk)
        lo = a if logprobs else max(a, s.first - 1) if s.first is not None else b
        if lo < b:  # scored rows lo..b-1 (every row with logprobs; a continuation's)
            rows.append(np.arange(t + lo - a, t + k, dtype=np.int32))
            tg = np.full(b - lo, -1, np.int32)
            m = min(b, n - 1) - lo  # positions lo..min(b, n-1)-1 have a next token
            tg[:m] = s.ids[lo + 1 : lo + 1 + m]
            targets.append(tg)
            owners.extend((s.key, p) for p in range(lo, b))
        elif b == n:
            rows.append(np.array([t + k - 1], np.int32))
            targets.append(np.array([-1], np.int32))
            owners.append((s.key, n - 1))
        t += k
    empty = np.zeros(0, np.int32)
    return Chunk(
        list(copies),
        np.concatenate(ids).astype(np.int32, copy=False),
        np.concatenate(tok),
        np.concatenate(rows) if rows else empty,
        np.concatenate(targets) if targets else empty,
        owners,
    )


def copy_shared_logprobs(wave: Sequence[Seq], logprobs: dict[int, np.ndarray]) -> None:
    """Fill each sharer's log-probs of positions 0..share-1 (log p(ids[p + 1] | ids[:p + 1]),
    arrays of n - 1 indexed by p; any per-row array [n - 1, ...] alike) from its owner's, in
    wave order (an owner's own shared ones first). The wave must have been planned with
    logprobs=True (prefill_chunks checks)."""
    for s in wave:
        if s.share:
            logprobs[s.key][: s.share] = logprobs[s.owner][: s.share]


def decode_layout(
    seqs: Sequence[Seq], lengths: Sequence[int], last_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """One batched decode step: (ids int32 [k], tok int32 [k, 2]) for k live sequences (in
    increasing base order, as the wave places them) where sequence i has lengths[i] tokens in
    the cache and feeds last_ids[i] at slot base + lengths[i] (position lengths[i]), lo = base.
    Rows to read back: 0..k-1, targets -1."""
    k = len(seqs)
    if len(lengths) != k or len(last_ids) != k:
        raise ValueError(f"{k} sequences, {len(lengths)} lengths, {len(last_ids)} ids")
    ids = np.asarray(last_ids, dtype=np.int32).reshape(k)
    tok = np.empty((k, 2), np.int32)
    prev = -1
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        n = int(n)
        if n < s.ids.size:
            raise ValueError(f"prompt {s.key}: {n} tokens in the cache, fewer than its prompt")
        if s.slots and n >= s.slots:
            raise ValueError(f"prompt {s.key}: slot {n} is past its {s.slots} slots")
        if s.base <= prev:
            raise ValueError("decode_layout: sequences must come in increasing base order")
        prev = s.base
        tok[i] = (s.base + n, s.base)
    return ids, tok


def bucket(n: int, buckets: Sequence[int] = BUCKETS, cap: int | None = None) -> int:
    """The smallest of `buckets` >= n, at most cap (n itself past the table)."""
    for b in buckets:
        if b >= n:
            return max(n, min(b, cap)) if cap is not None else b
    return n


def pad_to_bucket(
    ids: np.ndarray, tok: np.ndarray, buckets: Sequence[int] = BUCKETS, cap: int | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids, tok, n): the step padded to bucket(n) rows by repeating its last row (the same
    slot and id: a second write of the same values), n = the real rows (read rows 0..n-1)."""
    n = len(ids)
    if n == 0:
        return ids, tok, 0
    pad = bucket(n, buckets, cap) - n
    if pad:
        ids = np.concatenate([ids, np.repeat(ids[-1:], pad)])
        tok = np.concatenate([tok, np.repeat(tok[-1:], pad, axis=0)])
    return ids, tok, n
