"""The Python API: many prompts through one loaded model.

    import minfer
    engine = minfer.Engine("model.gguf", backend="cuda", gemm="auto")
    for r in engine.prefill(["The capital of France is", "2 + 2 ="], n_predict=8):
        print(r.text, r.tokens)
    scores = engine.prefill(docs, n_predict=0, logprobs=True)   # r.logprob_sum: log-likelihood

A prompt is a string (plain completion, or the chat template with chat=True), a list of token
ids, or {"messages": [...]} (the chat template). `Engine.run` is the streaming form `minfer
prefill --prompts FILE` uses: (key, ids) pairs in, Results out in input order through a
callback, never the whole file in memory. The backend is built at the first call with a KV cache
sized for that call's prompts and what the GPU's free memory holds (plan.fit_kv_slots); prompts
beyond it run in waves (minfer.batch.run).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from minfer.batch import run as runner
from minfer.batch.schedule import footprint
from minfer.errors import BadInput, GPUError

UBATCH = {"cuda": 2048, "cpu": 256}   # packed tokens per forward
CPU_SLOTS = 8192                      # the CPU reference's KV slots at most (host memory)
CUDA_SLOTS = 32768                    # the GPU's KV slots at least, where memory allows


@dataclass
class Completion:
    """One prompt's result (Engine.prefill)."""
    index: int                       # the prompt's position in the call
    id: object                       # a dict prompt's "id", else the index
    prompt_tokens: int
    tokens: list[int]                # greedy ids
    text: str                        # their text
    eos: bool                        # stopped at an end-of-generation id
    logprobs: list[float] | None     # log p of prompt token p + 1 given the tokens before it
    margins: list[float]             # top1 - top2 logit at each greedy step

    @property
    def logprob_sum(self) -> float | None:
        return None if self.logprobs is None else float(math.fsum(self.logprobs))


class Engine:
    """A loaded model and its backend, for many prompts. model: a GGUF path (None: the default
    model, fetched once); backend: "cuda", "cpu" or None (cuda when a GPU is usable); gemm:
    the GEMM path ("auto", "f16", "blk", ...: `minfer paths`); ubatch: packed tokens per
    forward; progress: bars on stderr (a terminal only); dtype: the CPU reference's precision
    ("f32" default, "f64": the float64 oracle)."""

    def __init__(self, model=None, backend: str | None = None, gemm: str | None = "auto",
                 ubatch: int | None = None, progress: bool = False, dtype: str | None = None):
        from minfer.gguf.loader import load_model
        from minfer.text.tokenizer import Tokenizer

        if backend is None:
            from minfer.cuda.runtime.runtime import gpu_available

            backend = "cuda" if gpu_available() else "cpu"
        self.kind = str(backend).lower()
        if self.kind not in ("cuda", "cpu"):
            raise BadInput(f"backend {backend!r}: expected cuda or cpu")
        if self.kind == "cpu" and getattr(gemm, "path", gemm) not in (None, "auto"):
            raise BadInput(f"gemm {gemm!r} is a GPU path; the cpu backend runs the reference")
        if dtype not in (None, "f32", "f64") or (dtype and self.kind != "cpu"):
            raise BadInput(f"dtype {dtype!r}: f32 or f64, on the cpu backend only")
        self.dtype = dtype
        if model is None:
            from minfer.tools.fetch import default_model_path

            model = default_model_path()
        self.model = load_model(str(model)) if not hasattr(model, "config") else model
        self.tok = Tokenizer.from_metadata(self.model.metadata)
        self.ubatch = int(ubatch or UBATCH[self.kind])
        if self.ubatch < 1:
            raise BadInput(f"ubatch must be >= 1, got {self.ubatch}")
        self.gemm = None
        if self.kind == "cuda":   # a GemmChoice (the CLI's, resolved), or a path name
            from minfer.cuda.plan.config import GemmChoice

            self.gemm = gemm if isinstance(gemm, GemmChoice) else GemmChoice.resolve(
                os.environ, gemm)
        self.progress = progress
        self.backend = None
        self.kv_slots = 0

    # -- prompts -----------------------------------------------------------------------------
    def encode(self, prompt, chat: bool = False, system: str | None = None,
               special: bool = True) -> np.ndarray:
        """int32 token ids of a prompt (str, ids, or {"messages": [...]}/{"prompt": str})."""
        from minfer.batch.prompts import make_encoder

        enc = make_encoder(self.model.metadata, self.tok, chat or None, system, special)
        if isinstance(prompt, dict):
            if set(prompt) - {"prompt", "messages", "id"} or ("prompt" in prompt) == (
                    "messages" in prompt):
                raise BadInput('a prompt dict has "prompt" or "messages" (and optionally "id")')
            ids = enc(prompt.get("prompt"), prompt.get("messages"))
        elif isinstance(prompt, str):
            ids = enc(prompt, None)
        else:
            ids = list(prompt)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise BadInput("a prompt of 0 tokens")
        if ids.min() < 0 or ids.max() >= self.model.config.vocab_size:
            raise BadInput(f"token id out of range [0, {self.model.config.vocab_size})")
        return ids.astype(np.int32)

    def prefill(self, prompts: Sequence, n_predict: int = 32, logprobs: bool = False,
                share_prefix: bool = True, stop_at_eos: bool = False, chat: bool = False,
                system: str | None = None) -> list[Completion]:
        """One Completion per prompt, in order: n_predict greedy ids (fewer when stop_at_eos
        meets an end-of-generation id), and with logprobs each prompt token's log-probability
        after the first (logprob_sum: the log-likelihood an eval harness asks for)."""
        prompts = list(prompts)
        ids = [self.encode(p, chat, system) for p in prompts]
        out: list[Completion] = []
        stop = self.tok.eog_ids if stop_at_eos else ()

        def emit(r: runner.Result) -> None:
            p = prompts[r.key]
            pid = p.get("id", r.key) if isinstance(p, dict) else r.key
            out.append(Completion(r.key, pid, r.n_prompt, r.greedy, self.tok.decode(r.greedy),
                                  r.eos, None if r.logprobs is None else
                                  [float(x) for x in r.logprobs], r.margins))

        self.run(enumerate(ids), [len(i) for i in ids], n_predict, emit, logprobs=logprobs,
                 share=share_prefix, stop_ids=stop)
        return out

    def close(self) -> None:
        """Free the backend (its GPU memory: weights, KV cache); the next call builds it anew."""
        self.backend, self.kv_slots = None, 0
        import gc

        gc.collect()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the streaming form ------------------------------------------------------------------
    def check(self, lengths: Sequence[int], n_predict: int) -> None:
        """BadInput for a prompt that cannot run: empty, or past the context with n_predict."""
        n_ctx = self.model.config.n_ctx
        if n_predict < 0:
            raise BadInput(f"n_predict must be >= 0, got {n_predict}")
        for i, n in enumerate(lengths):
            if n < 1:
                raise BadInput(f"prompt {i}: 0 tokens")
            if n + n_predict > n_ctx:
                raise BadInput(f"prompt {i}: {n} tokens + {n_predict} generated tokens = "
                               f"{n + n_predict} exceeds the model's context of {n_ctx}")

    def run(self, prompts: Iterable[tuple[int, np.ndarray]], lengths: Sequence[int],
            n_predict: int, emit: Callable[[runner.Result], None], *, logprobs: bool = False,
            share: bool = True, stop_ids=(),
            describe: Callable[[int], str] = lambda k: f"prompt {k}") -> runner.Totals:
        """Every (key, ids) of `prompts` (lengths: their token counts, in the same order, read
        first: the KV cache and the waves are planned from them) -> emit(Result) per prompt in
        input order; returns the run's Totals. describe(key) names a prompt in a GPU fault's
        or a NaN's message."""
        self.check(lengths, n_predict)
        if not len(lengths):
            return runner.Totals()
        need = max(footprint(int(n), n_predict) for n in lengths)
        want = sum(footprint(int(n), n_predict) for n in lengths)
        self.prepare(need, want, max(int(n) for n in lengths) + n_predict)
        return runner.run(self.backend, prompts, n_predict, kv_slots=self.kv_slots,
                          ubatch=self.ubatch, logprobs=logprobs, share=share,
                          stop_ids=stop_ids, emit=emit, progress=self.progress,
                          n_prompts=len(lengths), describe=describe)

    def prepare(self, need: int, want: int, positions: int | None = None) -> None:
        """The backend, with at least `need` KV slots (the longest prompt's) and up to `want`
        (every prompt at once) as memory allows, for sequences of `positions` tokens at most
        (default: the context); built once, rebuilt when a call needs more."""
        c = self.model.config
        positions = min(positions or c.n_ctx, c.n_ctx)
        cpu_grows = self.kind == "cpu" and self.kv_slots < min(want, CPU_SLOTS)   # (cheap)
        if self.backend is not None and need <= self.kv_slots and not cpu_grows and \
                positions <= getattr(self.backend, "max_tokens", c.n_ctx):
            return
        from minfer.engine import make_backend

        if self.kind == "cpu":   # one set of dequantized weights, the cache grown in place
            slots = max(need, min(want, CPU_SLOTS), self.kv_slots)
            if self.backend is None:
                self.backend = make_backend("cpu", self.model, max_tokens=min(128, c.n_ctx),
                                            dtype=self.dtype, progress=self.progress)
            self.backend.reserve_slots(slots)
        else:
            from minfer.cuda.plan.plan import fit_kv_slots
            from minfer.cuda.runtime.runtime import get_runtime

            choice = self.gemm
            self.backend = None   # the old cache's memory back first
            rt = get_runtime()
            head = 2 * 128 * c.vocab_size * 4   # the LM head's rows, outside the plan
            # room for later calls too (a rebuild re-uploads the weights), as memory allows
            slots = fit_kv_slots(self.model, choice, rt, self.ubatch, max(want, CUDA_SLOTS),
                                 extra=head)
            if slots < need:
                raise GPUError(f"GPU out of memory for the KV cache: the longest prompt needs "
                               f"{need} slots, the free memory holds {slots} beside the model "
                               "(try a smaller --ubatch, or fewer -n tokens)")
            # positions: what the calls need, at least a chunk's worth (a sliding-window model
            # runs on the GPU only within its window: CudaBackend refuses more)
            pos = max(positions, min(self.ubatch, c.n_ctx, c.sliding_window or c.n_ctx))
            self.backend = make_backend("cuda", self.model, choice, pos, self.ubatch,
                                        progress=self.progress, kv_slots=slots)
            self.backend.warmup(sorted({min(self.ubatch, pos), 1}))
        self.kv_slots = slots
