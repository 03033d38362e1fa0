"""Prefill orchestration: prompt ids -> backend (in ubatch chunks) -> greedy loop, timed.

A backend (CPU reference, CUDA paths) only knows forward(ids, pos0) -> last-position logits.
The engine validates the request before any work, runs the prompt in chunks of `ubatch`
tokens (prefill, timed), then feeds back argmax tokens one at a time (decode, timed apart).
Clocks are read after backend.synchronize(), so device work is inside the measured interval.
Logits are checked after prefill and after every decode step: NaN/inf on any backend is a
NumericError (exit 3), never an argmax over NaN. Progress (progress=True, stderr, only on a
terminal): prefill by ubatch chunk, or by layer when the backend offers a `layer_hook` (the CPU
reference), and decode by token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Protocol, Sequence, runtime_checkable

import numpy as np

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


def _margin(logits: np.ndarray) -> float:
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

    chunks = range(0, ids.size, ubatch)
    hook_owner = backend if hasattr(backend, "layer_hook") else None
    n_layers = getattr(getattr(backend, "cfg", None), "n_layers", 0)
    if hook_owner is not None and n_layers:  # per layer: a single chunk can take minutes on CPU
        bar = progress_bar(progress, total=len(chunks) * n_layers, desc="prefill", unit="layer")
    else:
        bar = progress_bar(
            progress and len(chunks) > 1, total=len(chunks), desc="prefill", unit="ubatch"
        )
    if bar is not None and hook_owner is not None:
        hook_owner.layer_hook = bar.update
    try:
        backend.synchronize()
        t0 = time.perf_counter()
        logits = None
        for s in chunks:
            logits = backend.forward(ids[s : s + ubatch].astype(np.int32), int(s))
            if bar is not None and hook_owner is None:
                bar.update()
        backend.synchronize()
        prefill_s = time.perf_counter() - t0
    finally:
        if hook_owner is not None:
            hook_owner.layer_hook = None
        if bar is not None:
            bar.close()
    check_logits(logits, backend.name, int(ids.size) - 1, "prefill")
    last_logits = np.asarray(logits, dtype=np.float32).copy()

    greedy: list[int] = []
    margins: list[float] = []
    pos = int(ids.size)
    bar = progress_bar(progress and n_greedy > 1, total=n_greedy - 1, desc="decode", unit="tok")
    try:
        t0 = time.perf_counter()
        for step in range(n_greedy):
            tok = int(np.argmax(logits))
            greedy.append(tok)
            margins.append(_margin(logits))
            if tok in stop_ids:
                break
            if step + 1 < n_greedy:
                logits = backend.forward(np.array([tok], dtype=np.int32), pos)
                check_logits(logits, backend.name, pos, f"decode step {step + 1}")
                pos += 1
                if bar is not None:
                    bar.update()
        backend.synchronize()
        decode_s = time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.close()
    return RunResult(
        [int(i) for i in ids], greedy, last_logits, prefill_s, decode_s, margins, warmup_s
    )


def make_backend(
    kind: str,
    model,
    choice=None,
    max_tokens: int = 4096,
    ubatch: int | None = None,
    dtype: str | None = None,
    progress: bool = True,
    warmup: bool = False,
    kv_slots: int | None = None,
):
    """The one place a backend is built (prefill, perplexity, bench, check): 'cpu' (the numpy
    reference; dtype 'f64' for the float64 oracle, weights dequantized now) or 'cuda'
    (CudaBackend on `choice`, a resolved minfer.cuda.plan.config.GemmChoice; None: auto).
    warmup=False: no one-token warm-up (engine.run and bench warm up the lengths they run).
    kv_slots: the CUDA KV cache's rows for many sequences (minfer.batch; default max_tokens)."""
    if kind == "cpu":
        from minfer.reference.forward import ReferenceBackend

        be = ReferenceBackend(
            model, dtype=np.float64 if dtype == "f64" else np.float32, max_tokens=max_tokens
        )
        be.preload(progress=progress)
        return be
    if kind != "cuda":
        raise BadInput(f"backend {kind!r}: expected cuda or cpu")
    from minfer.cuda.backend import CudaBackend

    return CudaBackend(
        model,
        choice,
        max_tokens=max_tokens,
        ubatch=max_tokens if ubatch is None else ubatch,
        progress=progress,
        warmup=warmup,
        kv_slots=kv_slots,
    )
