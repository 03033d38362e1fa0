"""One prompt: `minfer prefill`'s timed prefill and greedy loop, the one-prompt case of the
runner of many (minfer.batch.run): the same waves, chunks, decode steps and clocks.

A lone prompt runs on a backend's single-sequence protocol (`Backend`: forward(ids, pos0) -> the
last position's logits), which the CUDA backend answers faster than packed() (its last chunk
takes only its last row through the last layer, the LM head one row) and which the small test
backends alone offer. `_Lone` shows it to the runner as packed(): each call one forward() at
slot = position, the one row's greedy id and margin read from the host logits (argmax, first
index on ties; top1 - top2). So a prompt makes exactly the backend calls, in the order, it made
before the runner was shared: reserve, warm-up, reset, the ubatch chunks, a token per decode
step.

Validation comes before any work; logits are checked after the prefill and after every decode
step (NaN/inf: NumericError, exit 3, never an argmax over NaN). Clocks are read after
synchronize(), so device work is inside the measured interval. Progress (progress=True, stderr,
only on a terminal): prefill by layer when the backend offers a `layer_hook` (the CPU
reference), else by ubatch chunk; decode by token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Protocol, Sequence, runtime_checkable

import numpy as np

from minfer.batch import run as runner
from minfer.batch import schedule
from minfer.errors import BadInput, NumericError
from minfer.host.progress import bar as progress_bar


@runtime_checkable
class Backend(Protocol):
    name: str

    def reset(self) -> None:
        """Empty the KV cache."""

    def forward(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        """ids: int32 [T] at positions pos0..pos0+T-1 (appended to the KV cache) ->
        float32 logits [vocab] of the last position (host numpy array)."""

    def synchronize(self) -> None:
        """Wait for device work (timing)."""


@dataclass
class RunResult:
    prompt_ids: list[int]
    greedy_ids: list[int]
    last_logits: np.ndarray  # float32 [vocab]: logits at the last PROMPT position
    prefill_s: float
    decode_s: float
    step_margins: list[float] = field(default_factory=list)  # top1 - top2 at each greedy step
    warmup_s: float = 0.0  # backend.warmup before the timed prefill (kernel builds, graphs)

    @property
    def prefill_tok_s(self) -> float:
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tok_s(self) -> float:
        # each greedy id after the first costs one single-token forward
        n = max(len(self.greedy_ids) - 1, 0)
        if n == 0:
            return float("nan")
        return n / self.decode_s if self.decode_s > 0 else float("inf")


def margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def check_logits(logits: np.ndarray, backend_name: str, pos: int, what: str) -> None:
    """NumericError (exit 3) when the logits of position `pos` hold NaN or inf."""
    logits = np.asarray(logits)
    if np.isfinite(logits).all():
        return
    n_bad = int(logits.size - np.count_nonzero(np.isfinite(logits)))
    raise NumericError(
        f"non-finite logits after {what} ({n_bad} of {logits.size} NaN/inf at "
        f"position {pos}, backend {backend_name})"
    )


def validate(n_prompt: int, n_greedy: int, ubatch: int = 512, n_ctx: int | None = None) -> None:
    """Raise BadInput for a request that cannot run (before any work is done)."""
    if n_prompt <= 0:
        raise BadInput("empty prompt: at least one token is needed")
    if n_greedy < 0:
        raise BadInput(f"--greedy must be >= 0, got {n_greedy}")
    if ubatch < 1:
        raise BadInput(f"--ubatch must be >= 1, got {ubatch}")
    # the last greedy id is never fed back, but like llama.cpp we require the whole sequence
    # (prompt + greedy ids) to fit the context
    if n_ctx is not None and n_prompt + n_greedy > n_ctx:
        raise BadInput(
            f"prompt of {n_prompt} tokens + {n_greedy} greedy tokens = "
            f"{n_prompt + n_greedy} exceeds the model's context of {n_ctx}"
        )


class _Lone:
    """A backend's single-sequence protocol as the runner's packed() (see the module docstring),
    for one sequence of n_prompt tokens at slots 0.. (lo = 0: a token's slot is its position).
    It keeps the last prompt position's logits and drives the progress bars."""

    def __init__(self, backend: Backend, n_prompt: int, n_greedy: int, bar, progress: bool):
        self.be, self.name, self.n = backend, backend.name, n_prompt
        self.n_greedy, self.progress = n_greedy, progress
        self.hook = backend if bar is not None and hasattr(backend, "layer_hook") else None
        self.bar = bar  # the prefill's, then the decode's
        self.prompt_logits = None  # the last prompt position's, as the backend gave them

    def synchronize(self) -> None:
        self.be.synchronize()

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        raise AssertionError("one prompt shares no prefix")

    def packed(self, ids, tok, rows, targets):
        pos0 = int(tok[0, 0])
        logits = self.be.forward(ids, pos0)
        end = pos0 + len(ids)
        if end < self.n:  # a prefill chunk before the last: no row of it is scored
            if self.bar is not None and self.hook is None:
                self.bar.update()
        elif end == self.n:
            self.be.synchronize()  # (the prefill's clock stops after it, as it always did)
            self._prefill_done()
            check_logits(logits, self.name, self.n - 1, "prefill")
            self.prompt_logits = np.array(logits)  # (a copy: a backend may reuse its array)
        else:
            check_logits(logits, self.name, pos0, f"decode step {pos0 - self.n + 1}")
            if self.bar is not None:
                self.bar.update()
        out = np.full((len(rows), 4), np.nan)  # float64: a margin as the logits' dtype gives it
        assert len(rows) <= 1 and (not len(rows) or rows[0] == len(ids) - 1)
        if len(rows):
            out[0, 0] = int(np.argmax(logits))
            # the prefill's margin is taken after the run (run(): outside both clocks, as the
            # single-sequence loop never timed it in the prefill)
            out[0, 1] = np.nan if end == self.n else margin(logits)
        return out

    def _prefill_done(self) -> None:
        if self.hook is not None:
            self.hook.layer_hook = None
        if self.bar is not None and self.hook is None:
            self.bar.update()
        self.close()
        n = self.n_greedy
        self.bar = progress_bar(self.progress and n > 1, total=n - 1, desc="decode", unit="tok")

    def close(self) -> None:
        if self.hook is not None:
            self.hook.layer_hook = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _prefill_bar(backend: Backend, n_chunks: int, progress: bool):
    """Per layer on a backend with a layer_hook (a single chunk can take minutes on CPU), else
    per ubatch chunk when there are several; hooked here."""
    n_layers = getattr(getattr(backend, "cfg", None), "n_layers", 0)
    if hasattr(backend, "layer_hook") and n_layers:
        bar = progress_bar(progress, total=n_chunks * n_layers, desc="prefill", unit="layer")
        if bar is not None:
            backend.layer_hook = bar.update
        return bar
    return progress_bar(progress and n_chunks > 1, total=n_chunks, desc="prefill", unit="ubatch")


def run(
    backend: Backend,
    prompt_ids: Sequence[int],
    n_greedy: int = 32,
    ubatch: int = 512,
    progress: bool = False,
    n_ctx: int | None = None,
    stop_ids: Collection[int] = (),
    warmup: bool = True,
) -> RunResult:
    """Prefill prompt_ids in ubatch chunks, then up to n_greedy greedy ids (argmax, first index
    on ties). stop_ids: decoding ends after emitting one of them (EOS/EOT for chat); empty, it
    runs through EOS, as the identity gates need. n_ctx: the context limit (default: the
    backend's model's). warmup: a backend with warmup(lengths) (CUDA) first builds and loads
    every kernel of the run's chunk lengths and records their graphs, outside the timing."""
    ids = np.asarray(list(prompt_ids), dtype=np.int64)
    if n_ctx is None:
        model = getattr(backend, "model", None)
        n_ctx = model.config.n_ctx if model is not None else None
    validate(int(ids.size), n_greedy, ubatch, n_ctx)
    if hasattr(backend, "reserve"):
        backend.reserve(int(ids.size + max(n_greedy - 1, 0)))
    warmup_s = 0.0
    if warmup and hasattr(backend, "warmup"):
        t0 = time.perf_counter()
        backend.warmup(
            sorted(
                {min(ubatch, ids.size - s) for s in range(0, ids.size, ubatch)}
                | ({1} if n_greedy > 1 else set())
            )
        )
        warmup_s = time.perf_counter() - t0
    backend.reset()

    n_chunks = -(-int(ids.size) // ubatch)
    lone = _Lone(
        backend, int(ids.size), n_greedy, _prefill_bar(backend, n_chunks, progress), progress
    )
    got = []
    try:
        tot = runner.run(
            lone,
            [(0, ids)],
            n_greedy,
            kv_slots=schedule.footprint(int(ids.size), n_greedy),
            ubatch=ubatch,
            share=False,
            stop_ids=stop_ids,
            emit=got.append,
            describe=None,  # errors name no prompt: there is one
        )
    finally:
        lone.close()
    (r,) = got
    margins = list(r.margins)
    if margins:
        margins[0] = margin(lone.prompt_logits)
    return RunResult(
        [int(i) for i in ids],
        list(r.greedy),
        np.asarray(lone.prompt_logits, dtype=np.float32).copy(),
        tot.prefill_s,
        tot.decode_s,
        margins,
        warmup_s,
    )
