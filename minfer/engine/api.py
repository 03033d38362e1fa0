"""The Python API: many prompts through one loaded model.

    import minfer
    engine = minfer.Engine("model.gguf", backend="cuda", gemm="auto")
    for r in engine.prefill(["The capital of France is", "2 + 2 ="], n_predict=8):
        print(r.text, r.tokens)
    scores = engine.prefill(docs, n_predict=0, logprobs=True)   # r.logprob_sum: log-likelihood

Prefill-only jobs (no LM head for rows nobody asked for; minfer.batch.pooling, run through the
server's scheduler: minfer.batch.jobs): engine.embed(texts) -> f32 [n, d]; engine.score(query,
items, label_token_ids) -> per item the labels' probabilities (SGLang's); engine.rerank(query,
documents) -> [{index, relevance_score, document}] best first (Qwen3-Reranker's yes/no).

A prompt is a string (plain completion, or the chat template with chat=True), a list of token
ids, or a dict of minfer.batch.records' forms: {"prompt": ...}, {"messages": [...]} (the chat
template), {"context": ..., "continuation": ...} (a continuation scored: continuation_logprob,
is_greedy). Every argument is checked first (batch.records: the prompt file's checks); BadInput
names it. `Engine.run` is the streaming form `minfer prefill --prompts FILE` uses: (key, ids)
pairs in, Results out in input order through a callback, never the whole file in memory. The backend is built at the first call with a KV cache
sized for that call's prompts and what the GPU's free memory holds (plan.fit_kv_slots); prompts
beyond it run in waves (minfer.batch.run).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from minfer.batch import run as runner
from minfer.batch.records import (
    Record,
    RecordError,
    check_fits,
    check_record,
    check_text,
    record_ids,
)
from minfer.batch.schedule import footprint
from minfer.errors import BadInput, GPUError
from minfer.host.words import plural
from minfer.reference.ops import TOP_MAX

UBATCH = {"cuda": 2048, "cpu": 256}  # packed tokens per forward


def context_size(ctx_size: int, model_ctx: int, n_prompt: int, n_predict: int) -> int:
    """The context the run may use: -c/--ctx-size (0: the model's), at most the model's."""
    if ctx_size == 0:
        return model_ctx
    if ctx_size > model_ctx:
        raise BadInput(f"-c/--ctx-size {ctx_size} exceeds the model's context of {model_ctx}")
    if n_prompt + n_predict > ctx_size:
        raise BadInput(
            f"prompt of {plural(n_prompt, 'token')} + {n_predict} generated tokens = "
            f"{n_prompt + n_predict} exceeds -c/--ctx-size {ctx_size}"
        )
    return ctx_size


CPU_SLOTS = 8192  # the CPU reference's KV slots at most (host memory)
CUDA_SLOTS = 32768  # the GPU's KV slots at least, where memory allows


@dataclass
class Completion:
    """One prompt's result (Engine.prefill)."""

    index: int  # the prompt's position in the call
    id: object  # a dict prompt's "id", else the index
    prompt_tokens: int
    tokens: list[int]  # greedy ids
    text: str  # their text
    eos: bool  # stopped at an end-of-generation id
    logprobs: list[float] | None  # log p of prompt token p + 1 given the tokens before it
    margins: list[float]  # top1 - top2 logit at each greedy step
    n_context: int | None = None  # a continuation: the context's tokens (prompt_ids[:n])
    continuation_logprob: float | None = None  # sum of the continuation tokens' log-probs
    is_greedy: bool | None = None  # every continuation token was the argmax
    top_logprobs: list | None = None  # per scored token: [(id, text, logprob)] * top_logprobs
    prompt_ids: list[int] | None = None  # with prompt_ids=True

    @property
    def logprob_sum(self) -> float | None:
        return None if self.logprobs is None else float(math.fsum(self.logprobs))


def _show(v) -> str:
    return f"{repr(v)[:40]} ({type(v).__name__})"


def _flag(name: str, v) -> bool:
    """A bool argument (numpy's too), else BadInput: a truthy 1 or "no" is not a flag."""
    if not isinstance(v, (bool, np.bool_)):
        raise BadInput(f"{name} must be True or False, not {_show(v)}")
    return bool(v)


def _int(name: str, v, lo: int, hi: int | None = None) -> int:
    """An int argument in [lo, hi] (Python's or numpy's; not bool, not float), else BadInput."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise BadInput(f"{name} must be an integer, not {_show(v)}")
    if v < lo or (hi is not None and v > hi):
        raise BadInput(
            f"{name} must be "
            + (f">= {lo}" if hi is None else f"in [{lo}, {hi}]")
            + f", got {int(v)}"
        )
    return int(v)


def _system(v) -> str | None:
    try:
        return None if v is None else check_text(v, "system")
    except RecordError as e:
        raise BadInput(str(e)) from None


def _label_list(v) -> list[int]:
    """label_token_ids: a non-empty list of integers (range: LabelHead checks), else BadInput."""
    if (
        isinstance(v, (str, bytes))
        or not isinstance(v, (list, tuple, np.ndarray))
        or len(v) == 0
        or any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) for x in v)
    ):
        raise BadInput(f"label_token_ids must be a non-empty list of token ids, not {_show(v)}")
    return [int(x) for x in v]


def _prompt_list(prompts) -> list:
    """prefill's prompts as a list: a string or a dict is one prompt."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray, memoryview, set, frozenset)) or prompts is None:
        raise BadInput(f"prompts must be a prompt or a list of prompts, not {_show(prompts)}")
    try:
        return list(prompts)
    except TypeError:
        raise BadInput(
            f"prompts must be a prompt or a list of prompts, not {_show(prompts)}"
        ) from None


def kv_plan(lengths: Sequence[int], n_predict: int) -> tuple[int, int, int]:
    """Engine.prepare's (need, want, positions) for these prompts: the longest one's KV slots,
    every prompt's at once, and the longest sequence's positions. A Ray actor prepares with
    the whole job's (minfer.engine.ray): its cache is then the single process's, and a group
    runs in the same waves."""
    need = max(footprint(int(n), n_predict) for n in lengths)
    want = sum(footprint(int(n), n_predict) for n in lengths)
    return need, want, max(int(n) for n in lengths) + n_predict


def _on_gpu_thread(method):
    """On the cuda backend, the GPU's context current on the calling thread for the call
    (Runtime.on_thread): an Engine may be built on one thread and called on another, as Ray
    Data's actors are."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self.kind != "cuda":
            return method(self, *args, **kwargs)
        from minfer.cuda.runtime.runtime import get_runtime

        with get_runtime().on_thread():
            return method(self, *args, **kwargs)

    return call


class Engine:
    """A loaded model and its backend, for many prompts. model: a GGUF path (None: the default
    model, fetched once); backend: "cuda", "cpu" or None (cuda when a GPU is usable); gemm:
    the GEMM path ("auto", "f16", "blk", ...: `--gemm`'s names, docs/paths.md); ubatch: packed tokens per
    forward (None: 2048 on cuda, 256 on cpu); progress: bars on stderr (a terminal only);
    dtype: the CPU reference's precision ("f32" default, "f64": the float64 oracle); threads:
    BLAS threads for the process (None: the limit already set, as the CLI's -t sets it, else
    the physical cores this process may use: numpy's default of one a logical CPU ran a busy
    2-core machine ten times slower)."""

    def __init__(
        self,
        model=None,
        backend: str | None = None,
        gemm: str | None = "auto",
        ubatch: int | None = None,
        progress: bool = False,
        dtype: str | None = None,
        threads: int | None = None,
    ):
        from minfer.gguf.loader import load_model
        from minfer.host import threads as host_threads
        from minfer.text.tokenizer import Tokenizer

        if backend is not None and not isinstance(backend, str):
            raise BadInput(f'backend must be "cuda", "cpu" or None, not {_show(backend)}')
        ubatch = None if ubatch is None else _int("ubatch", ubatch, 1)
        self.progress = _flag("progress", progress)
        threads = None if threads is None else _int("threads", threads, 1)
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
        host_threads.set_threads(threads or host_threads.current() or host_threads.physical_cores())
        if model is None:
            from minfer.gguf.fetch import default_model_path

            model = default_model_path()
        self.model = load_model(str(model)) if not hasattr(model, "config") else model
        self.tok = Tokenizer.from_metadata(self.model.metadata)
        self.ubatch = ubatch or UBATCH[self.kind]
        self.gemm = None
        if self.kind == "cuda":  # a GemmChoice (the CLI's, resolved), or a path name
            from minfer.cuda.plan.config import GemmChoice, gemm_choice

            self.gemm = gemm if isinstance(gemm, GemmChoice) else gemm_choice(gemm)
        self.backend = None
        self.kv_slots = 0

    # -- prompts -----------------------------------------------------------------------------
    def _encoder(self, chat, system, special=True):
        from minfer.batch.prompts import make_encoder

        chat, special = _flag("chat", chat), _flag("special", special)
        return make_encoder(self.model.metadata, self.tok, chat or None, _system(system), special)

    def _record(self, where: str, prompt, enc) -> tuple[Record, np.ndarray, int | None]:
        """(record, int32 ids, n_context) of one prompt, or BadInput prefixed with `where`."""
        try:
            rec = check_record(prompt, self.model.config.vocab_size, bare_ids=True)
            ids, first = record_ids(rec, enc)
        except RecordError as e:
            raise BadInput(f"{where}: {e}") from None
        except BadInput as e:  # the encoder's (BadModel: a template that does not render)
            raise type(e)(f"{where}: {e}") from None
        return rec, ids, first

    def encode(
        self, prompt, chat: bool = False, system: str | None = None, special: bool = True
    ) -> np.ndarray:
        """int32 token ids of one prompt: text, token ids, or a dict ({"prompt": ...},
        {"messages": [...]}, {"context": ..., "continuation": ...}: the whole text's ids)."""
        return self._record("prompt", prompt, self._encoder(chat, system, special))[1]

    def prefill(
        self,
        prompts,
        n_predict: int = 32,
        logprobs: bool = False,
        share_prefix: bool = True,
        stop_at_eos: bool = False,
        chat: bool = False,
        system: str | None = None,
        top_logprobs: int = 0,
        prompt_ids: bool = False,
    ) -> list[Completion]:
        """One Completion per prompt, in order (a string or a dict alone: one prompt):
        n_predict greedy ids (fewer when stop_at_eos meets an end-of-generation id), and with
        logprobs each prompt token's log-probability after the first (logprob_sum: the
        log-likelihood an eval harness asks for). A {"context", "continuation"} prompt also
        gets continuation_logprob and is_greedy; top_logprobs=N (<= 20): the N most likely
        tokens at each scored token (the continuation's; every token's with logprobs);
        prompt_ids: the prompt's ids. BadInput (a ValueError) for any bad argument, naming
        it (prompts[i] for a prompt), before any work."""
        n_predict = _int("n_predict", n_predict, 0)
        logprobs, share_prefix = _flag("logprobs", logprobs), _flag("share_prefix", share_prefix)
        stop_at_eos, prompt_ids = _flag("stop_at_eos", stop_at_eos), _flag("prompt_ids", prompt_ids)
        top = _int("top_logprobs", top_logprobs, 0, min(TOP_MAX, self.model.config.vocab_size))
        enc = self._encoder(chat, system)
        prompts = _prompt_list(prompts)
        recs, items = [], []
        for i, p in enumerate(prompts):
            rec, ids, first = self._record(f"prompts[{i}]", p, enc)
            recs.append(rec)
            items.append((i, ids, first))
        self.check([len(ids) for _, ids, _ in items], n_predict)
        out: list[Completion] = []
        stop = self.tok.eog_ids if stop_at_eos else ()

        def emit(r: runner.Result) -> None:
            pid = recs[r.key].id
            c = Completion(
                r.key,
                r.key if pid is None else pid,
                r.n_prompt,
                r.greedy,
                self.tok.decode(r.greedy),
                r.eos,
                None if not logprobs else [float(x) for x in r.logprobs],
                r.margins,
                r.first,
            )
            if r.first is not None:
                c.continuation_logprob, c.is_greedy = r.continuation_logprob, r.is_greedy
            rows = r.top_rows(logprobs) if top else None
            if rows is not None:
                c.top_logprobs = [[(t, self.tok.piece(t), v) for t, v in row] for row in rows]
            if prompt_ids:
                c.prompt_ids = r.ids.tolist()
            out.append(c)

        self.run(
            items,
            [len(ids) for _, ids, _ in items],
            n_predict,
            emit,
            logprobs=logprobs,
            share=share_prefix,
            stop_ids=stop,
            top=top,
        )
        return out

    # -- prefill-only jobs (issue 52; minfer.batch.pooling) --------------------------------
    def _ids(self, where: str, v, eos: bool | None = None) -> np.ndarray:
        """int32 ids of a text (special tokens parsed; BOS / EOS as the metadata says, EOS
        never when eos is False) or of a list of token ids, else BadInput naming `where`."""
        from minfer.batch.records import check_ids

        if isinstance(v, str):
            ids = np.asarray(self.tok.encode(v, parse_special=True, add_eos=eos), np.int32)
            if ids.size == 0:
                raise BadInput(f"{where} is empty (0 tokens)")
            return ids
        try:
            return check_ids(v, where, self.model.config.vocab_size)
        except RecordError as e:
            raise BadInput(str(e)) from None

    def embed(
        self,
        texts,
        pooling: str | None = None,
        normalize: bool = True,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """f32 [n, dimensions or d_model]: one embedding per text (a string or token ids; a
        string alone: n = 1): the final-normed hidden state pooled (last token, mean or cls;
        None: the GGUF's pooling_type, else last), cut to `dimensions`, L2-normalised. No LM
        head runs. BadInput for a bad argument, before any work."""
        from minfer.batch import pooling as P

        pool = P.check_pooling(pooling) if pooling is not None else P.model_pooling(self.model)[0]
        normalize = _flag("normalize", normalize)
        dims = P.check_dims(dimensions, self.model.config.d_model)
        texts = _prompt_list(texts)
        ids = [self._ids(f"texts[{i}]", t) for i, t in enumerate(texts)]
        res = self.pooled(ids, pool, keep=False)
        d = dims or self.model.config.d_model
        out = np.empty((len(ids), d), np.float32)
        for i, r in enumerate(res):
            out[i] = P.finish(r.vec, dims, normalize)
        return out

    def score(
        self, query, items, label_token_ids, apply_softmax: bool = False, item_first: bool = False
    ) -> list[list[float]]:
        """SGLang's score: per item, the probabilities of label_token_ids as the next token
        after query + item (item + query with item_first; both text, or both token id
        lists): a softmax over the labels' logits, or (apply_softmax False) each label's
        full-vocabulary probability. The labels' logits come from the last row's hidden state
        (the full LM head runs only for the logsumexp, apply_softmax False)."""
        from minfer.batch import pooling as P
        from minfer.reference.heads import LabelHead

        apply_softmax, item_first = (
            _flag("apply_softmax", apply_softmax),
            _flag("item_first", item_first),
        )
        head = LabelHead(self.model, _label_list(label_token_ids))
        items = _prompt_list(items)
        if not items:
            raise BadInput("items is empty")
        if not isinstance(query, str):
            query = self._ids("query", query).tolist()
            items = [self._ids(f"items[{i}]", t).tolist() for i, t in enumerate(items)]
        elif not all(isinstance(t, str) for t in items):
            raise BadInput("query and items must both be text or both be token id lists")
        ids = [np.asarray(p, np.int32) for p in P.score_ids(self.tok, query, items, item_first)]
        for i, p in enumerate(ids):
            if p.size == 0:
                raise BadInput(f"items[{i}]: the prompt is 0 tokens")
        res = self.pooled(ids, "last", lse=not apply_softmax)
        logits = head(np.stack([r.vec for r in res]))
        return [P.label_probs(lg, r.lse, apply_softmax) for lg, r in zip(logits, res)]

    def rerank(
        self, query: str, documents, top_n: int | None = None, template: str | None = None
    ) -> list[dict]:
        """[{"index", "relevance_score", "document"}] best first (top_n of them): each
        document's P(yes) under the rerank template (pooling.Reranker: the GGUF's, else
        Qwen3-Reranker's; `template` text with {query} and {document} overrides). The
        documents share the query's prefix: computed once."""
        from minfer.batch import pooling as P
        from minfer.reference.heads import LabelHead

        if not isinstance(query, str):
            raise BadInput(f"query must be text, not {_show(query)}")
        docs = _prompt_list(documents)
        if not docs:
            raise BadInput("documents is empty (0 documents)")
        for i, d in enumerate(docs):
            if not isinstance(d, str):
                raise BadInput(f"documents[{i}] must be text, not {_show(d)}")
        top_n = len(docs) if top_n is None else _int("top_n", top_n, 1)
        rr = P.Reranker(self.model, self.tok, template)
        ids = [np.asarray(rr.ids(query, d), np.int32) for d in docs]
        res = self.pooled(ids, "last")
        logits = LabelHead(self.model, rr.labels)(np.stack([r.vec for r in res]))
        scores = [rr.relevance(lg) for lg in logits]
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
        return [{"index": i, "relevance_score": scores[i], "document": docs[i]} for i in order]

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
        n_predict = _int("n_predict", n_predict, 0)
        for i, n in enumerate(lengths):
            try:
                if n < 1:
                    raise RecordError("the prompt is 0 tokens")
                check_fits(int(n), n_predict, self.model.config.n_ctx)
            except RecordError as e:
                raise BadInput(f"prompts[{i}]: {e}") from None

    @_on_gpu_thread
    def run(
        self,
        prompts: Iterable[tuple],
        lengths: Sequence[int],
        n_predict: int,
        emit: Callable[[runner.Result], None],
        *,
        logprobs: bool = False,
        share: bool = True,
        stop_ids=(),
        top: int = 0,
        describe: Callable[[int], str] = lambda k: f"prompt {k}",
        group: int | None = None,
    ) -> runner.Totals:
        """Every (key, ids) or (key, ids, n_context) of `prompts` (lengths: their token counts,
        in the same order, read first: the KV cache and the waves are planned from them;
        n_context: a continuation's first token, whose log-probs are scored) -> emit(Result)
        per prompt in input order; returns the run's Totals. top: the most likely ids and
        log-probs at each scored row (runner.run). describe(key) names a prompt in a GPU
        fault's or a NaN's message. group: waves cut at every `group` consecutive prompts
        (runner.run; the records then equal a run of each group alone)."""
        self.check(lengths, n_predict)
        if not len(lengths):
            return runner.Totals()
        self.prepare(*kv_plan(lengths, n_predict))
        return runner.run(
            self.backend,
            prompts,
            n_predict,
            kv_slots=self.kv_slots,
            ubatch=self.ubatch,
            logprobs=logprobs,
            share=share,
            stop_ids=stop_ids,
            emit=emit,
            progress=self.progress,
            n_prompts=len(lengths),
            describe=describe,
            top=top,
            group=group,
        )

    @_on_gpu_thread
    def pooled(self, ids: list[np.ndarray], pool: str, **kw) -> list:
        """int32 id arrays -> a scheduler.Pooled per prompt, in order (batch.jobs.run_pooled;
        kw: its lse, share, keep, overlap): the GPU entry of embed, score and rerank."""
        from minfer.batch.jobs import run_pooled

        return run_pooled(self, ids, pool, **kw)

    @_on_gpu_thread
    def prepare(self, need: int, want: int, positions: int | None = None) -> None:
        # (kv_plan(lengths, n_predict) gives the three for a set of prompts)
        """The backend, with at least `need` KV slots (the longest prompt's) and up to `want`
        (every prompt at once) as memory allows, for sequences of `positions` tokens at most
        (default: the context); built once, rebuilt when a call needs more."""
        c = self.model.config
        positions = min(positions or c.n_ctx, c.n_ctx)
        cpu_grows = self.kind == "cpu" and self.kv_slots < min(want, CPU_SLOTS)  # (cheap)
        if (
            self.backend is not None
            and need <= self.kv_slots
            and not cpu_grows
            and positions <= getattr(self.backend, "max_tokens", c.n_ctx)
        ):
            return
        from minfer.engine.backends import make_backend

        if self.kind == "cpu":  # one set of dequantized weights, the cache grown in place
            slots = max(need, min(want, CPU_SLOTS), self.kv_slots)
            if self.backend is None:
                self.backend = make_backend(
                    "cpu",
                    self.model,
                    max_tokens=min(128, c.n_ctx),
                    dtype=self.dtype,
                    progress=self.progress,
                )
            self.backend.reserve_slots(slots)
        else:
            from minfer.cuda.plan.plan import fit_kv_slots
            from minfer.cuda.runtime.runtime import get_runtime

            choice = self.gemm
            self.backend = None  # the old cache's memory back first
            rt = get_runtime()
            head = 2 * 128 * c.vocab_size * 4  # the LM head's rows, outside the plan
            # room for later calls too (a rebuild re-uploads the weights), as memory allows
            slots = fit_kv_slots(
                self.model, choice, rt, self.ubatch, max(want, CUDA_SLOTS), extra=head
            )
            if slots < need:
                raise GPUError(
                    f"GPU out of memory for the KV cache: the longest prompt needs "
                    f"{need} slots, the free memory holds {slots} beside the model "
                    "(try a smaller --ubatch, or fewer -n tokens)"
                )
            # positions: what the calls need, at least a chunk's worth (a sliding-window model
            # runs on the GPU only within its window: CudaBackend refuses more)
            pos = max(positions, min(self.ubatch, c.n_ctx, c.sliding_window or c.n_ctx))
            self.backend = make_backend(
                "cuda", self.model, choice, pos, self.ubatch, progress=self.progress, kv_slots=slots
            )
            self.backend.warmup(sorted({min(self.ubatch, pos), 1}))
        self.kv_slots = slots
