"""The runner of many prompts: waves of packed prefill chunks, then batched greedy decode, on any
backend with `packed(ids, tok, rows, targets) -> [m, 4]` (and, asked for top-k, `packed(...,
top=k) -> ([m, 4], ids [m, k], log-probs [m, k])`) and `copy_kv(src, dst, n)` (CUDA, and the
CPU reference that checks it).

  for each group of `group` consecutive prompts (all of them when None), for each wave in it
  (schedule.waves: as many prompts, in input order, as the KV slots hold):
    prefill: schedule.prefill_chunks packs the prompts' tokens into chunks of <= ubatch
             (a prompt may span chunks; a shared prefix is computed once by its owner and
             copied with copy_kv); each chunk is one packed() call returning, per row that
             needs it, (greedy id, margin, log-prob of the next prompt token, logsumexp)
    decode:  one packed() call per step over every live sequence (padded to a bucket size so
             the CUDA graphs stay few), each at its own slot and position, until its EOS (a
             stop id) or n_predict ids
    results: one Result per prompt, handed to `emit` in input order (waves are consecutive
             runs of the input, emitted whole, sorted by key)

Groups: the GEMMs' and the attention's sums run in an order that depends on the rows beside
them (stream-K splits, BLAS kernels), so a prompt's numbers are a function of its wave. Waves
cut at fixed groups of prompts are the same wherever a group runs (alone on a Ray actor, or in
a file's single process), so the records are too (docs/batch.md, "Same records").

Timing: prefill_s and decode_s are wall clocks around the two phases (packed() returns host
numbers, so each call's device work is inside them); the CUDA graph captures of new chunk
sizes fall inside too, as a user's run pays them (bench warms them up first).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Iterator

import numpy as np

from minfer.batch import schedule
from minfer.errors import GPUError, NumericError
from minfer.host.progress import bar as progress_bar

GROUP = 2048  # prompts a group by default (`minfer prefill --prompts --group`, a Ray batch)
# decode step sizes: few CUDA graphs, at most a third of a step padding past 64
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


@dataclass
class Result:
    key: int  # the prompt's index in the input
    n_prompt: int  # prompt tokens
    greedy: list[int]  # greedy ids (the first from the prompt's last row)
    margins: list[float]  # top1 - top2 logit at each greedy step (the tie-aware gate)
    eos: bool  # stopped at a stop id (the last of `greedy`)
    logprobs: np.ndarray | None = None  # f32 [n_prompt - 1]: log p(ids[p + 1] | ids[:p + 1])
    # (NaN where not scored: with logprobs every row is, for a continuation rows first-1..)
    ids: np.ndarray | None = None  # int32 [n_prompt] the prompt's ids
    first: int | None = None  # a continuation's first token, else None
    argmax: np.ndarray | None = None  # int32 [n_prompt - 1]: argmax at row p (-1 unscored)
    top_ids: np.ndarray | None = None  # int32 [n_prompt - 1, top] (with top >= 1)
    top_logprobs: np.ndarray | None = None  # f32 [n_prompt - 1, top], descending
    continuation_logprob: float | None = None  # sum of logprobs[first - 1:]
    is_greedy: bool | None = None  # argmax[first - 1:] == ids[first:]

    def top_rows(self, every_row: bool) -> list[list[tuple[int, float]]] | None:
        """[(id, log-prob)] * top at each scored token: every prompt token after the first
        (every_row: a logprobs run), else a continuation's tokens; None without top-k."""
        if self.top_ids is None:
            return None
        lo = 0 if every_row or self.first is None else self.first - 1
        return [
            [(int(t), float(v)) for t, v in zip(a, b)]
            for a, b in zip(self.top_ids[lo:].tolist(), self.top_logprobs[lo:].tolist())
        ]


@dataclass
class Totals:
    prompts: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0  # prompt tokens run through the model (shared prefixes once)
    generated: int = 0  # greedy ids, the first (from the prefill) included
    decode_tokens: int = 0  # tokens fed back in decode steps (padding excluded)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    waves: int = 0
    chunks: int = 0
    decode_steps: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


def run(
    backend,
    prompts: Iterable[tuple[int, np.ndarray]],
    n_predict: int,
    *,
    kv_slots: int,
    ubatch: int,
    logprobs: bool = False,
    share: bool = True,
    stop_ids: Collection[int] = (),
    emit: Callable[[Result], None] = lambda r: None,
    progress: bool = False,
    n_prompts: int | None = None,
    describe: Callable[[int], str] | None = lambda k: f"prompt {k}",
    top: int = 0,
    group: int | None = None,
) -> Totals:
    """Run every (key, ids) prompt of `prompts` (keys increasing: the input order) and hand
    each Result to `emit` in input order; -> Totals. n_predict greedy ids each (fewer after a
    stop id); logprobs: each prompt token's log-probability after the first. A (key, ids,
    first) prompt is a continuation from token first: its rows first-1.. are scored
    (continuation_logprob, is_greedy). top >= 1: the top most likely ids and log-probs of
    every scored row (packed(top=k), only in chunks that score). A GPU fault or
    non-finite numbers in a forward re-raise naming the prompts of that forward (describe(key):
    how a prompt is named, e.g. its line in the file; None: as they are, minfer.batch.single's
    one prompt). group: waves never span two groups of that many consecutive prompts."""
    tot = Totals()
    bar = progress_bar(progress, total=n_prompts, desc="prompts", unit="prompt")
    try:
        # with logprobs a sharer takes one row less (the owner's last shared row scores the
        # owner's next token, not the sharer's): schedule.waves plans it so
        for part in _groups(prompts, group):
            for wave in schedule.waves(part, kv_slots, n_predict, share, logprobs=logprobs):
                results = _wave(
                    backend, wave, n_predict, ubatch, logprobs, stop_ids, tot, bar, describe, top
                )
                for key in sorted(results):
                    emit(results[key])
                tot.waves += 1
    finally:
        if bar is not None:
            bar.close()
    return tot


def _groups(prompts: Iterable, group: int | None) -> Iterator[Iterable]:
    """prompts as consecutive groups of `group` (one group: all of them), each read lazily."""
    if group is None:
        yield prompts
        return
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    it = iter(prompts)
    while True:
        part = list(itertools.islice(it, group))
        if not part:
            return
        yield part


def _named(describe, keys, what: str, call):
    """call(), its GPUError / NumericError re-raised with the prompts it ran named."""
    if describe is None:
        return call()
    try:
        return call()
    except (GPUError, NumericError) as e:
        ks = sorted(set(keys))
        names = ", ".join(describe(k) for k in ks[:3]) + (
            f" and {len(ks) - 3} more" if len(ks) > 3 else ""
        )
        raise type(e)(f"{e} [{what} of {names}]") from None


def _result(s, logprobs: bool, top: int) -> Result:
    """An empty Result; per-row arrays only for a prompt whose rows are scored."""
    n = len(s.ids)
    r = Result(s.key, n, [], [], False, ids=s.ids, first=s.first)
    if logprobs or s.first is not None:
        r.logprobs = np.full(n - 1, np.nan, np.float32)
        r.argmax = np.full(n - 1, -1, np.int32)
        if top:
            r.top_ids = np.full((n - 1, top), -1, np.int32)
            r.top_logprobs = np.full((n - 1, top), np.nan, np.float32)
    return r


def _wave(
    backend,
    wave: list,
    n_predict: int,
    ubatch: int,
    logprobs: bool,
    stop_ids,
    tot: Totals,
    bar,
    describe,
    top: int = 0,
) -> dict[int, Result]:
    seqs = {s.key: s for s in wave}
    res = {s.key: _result(s, logprobs, top) for s in wave}
    backend.synchronize()
    t0 = time.perf_counter()
    for ch in schedule.prefill_chunks(wave, ubatch, logprobs):
        for src, dst, n in ch.copies:
            backend.copy_kv(src, dst, n)
        keys = _chunk_keys(wave, ch)
        # top-k only where a row is scored: the default path's call is unchanged
        k = top if top and any(res[key].argmax is not None for key, _ in ch.owners) else 0
        out = _named(
            describe,
            keys,
            "the prefill chunk",
            lambda: (
                backend.packed(ch.ids, ch.tok, ch.rows, ch.targets, top=k)
                if k
                else backend.packed(ch.ids, ch.tok, ch.rows, ch.targets)
            ),
        )
        st, t_ids, t_lp = out if k else (out, None, None)
        tot.chunks += 1
        tot.computed_tokens += len(ch.ids)
        done = 0
        for i, (key, p) in enumerate(ch.owners):
            r = res[key]
            if r.logprobs is not None and p < r.n_prompt - 1:
                r.logprobs[p] = st[i, 2]
                r.argmax[p] = int(st[i, 0])
                if r.top_ids is not None:
                    r.top_ids[p], r.top_logprobs[p] = t_ids[i], t_lp[i]
            if p == r.n_prompt - 1 and n_predict > 0:
                r.greedy.append(int(st[i, 0]))
                r.margins.append(float(st[i, 1]))
                done += 1
        if bar is not None and done:
            bar.update(done)
    if logprobs:  # a sharer's prefix rows are its owner's (the same tokens before them)
        for name in ("logprobs", "argmax", "top_ids", "top_logprobs"):
            if top or not name.startswith("top"):
                schedule.copy_shared_logprobs(wave, {k: getattr(r, name) for k, r in res.items()})
    for s in wave:  # (without logprobs a continuation's scored rows are its own: schedule)
        if s.first is not None:
            r = res[s.key]
            r.continuation_logprob = math.fsum(r.logprobs[s.first - 1 :].tolist())
            r.is_greedy = bool(np.array_equal(r.argmax[s.first - 1 :], s.ids[s.first :]))
    tot.prefill_s += time.perf_counter() - t0
    tot.prompts += len(wave)
    tot.prompt_tokens += sum(len(s.ids) for s in wave)

    # batched greedy decode: every live sequence feeds its newest id at its next slot
    t0 = time.perf_counter()
    cur = {k: len(s.ids) for k, s in seqs.items()}  # tokens in the cache
    live = []
    for k in sorted(seqs, key=lambda k: seqs[k].base):
        r = res[k]
        if r.greedy and r.greedy[-1] in stop_ids:
            r.eos = True
        elif n_predict > 1:
            live.append(k)
    while live:
        tot.decode_steps += 1
        for g in range(0, len(live), ubatch):
            grp = live[g : g + ubatch]
            n = len(grp)
            ids = np.array([res[k].greedy[-1] for k in grp], np.int32)
            tok = np.array([(seqs[k].base + cur[k], seqs[k].base) for k in grp], np.int32)
            pad = (
                schedule.bucket(n, DECODE_BUCKETS, ubatch) - n
            )  # repeats of the last row: the same slot, same values
            if pad:
                ids = np.concatenate([ids, np.repeat(ids[-1:], pad)])
                tok = np.concatenate([tok, np.repeat(tok[-1:], pad, axis=0)])
            st = _named(
                describe,
                grp,
                f"decode step {len(res[grp[0]].greedy)}",
                lambda: backend.packed(
                    ids, tok, np.arange(n, dtype=np.int32), np.full(n, -1, np.int32)
                ),
            )
            tot.decode_tokens += n
            for i, k in enumerate(grp):
                cur[k] += 1
                res[k].greedy.append(int(st[i, 0]))
                res[k].margins.append(float(st[i, 1]))
        nxt = []
        for k in live:
            r = res[k]
            if r.greedy[-1] in stop_ids:
                r.eos = True
            elif len(r.greedy) < n_predict:
                nxt.append(k)
        live = nxt
    backend.synchronize()
    tot.decode_s += time.perf_counter() - t0
    tot.generated += sum(len(r.greedy) for r in res.values())
    return res


def _chunk_keys(wave: list, ch) -> list[int]:
    """The keys of the sequences whose tokens a chunk holds (by their lo: a sequence's base)."""
    by_base = {s.base: s.key for s in wave}
    return [by_base[int(b)] for b in np.unique(ch.tok[:, 1])]
