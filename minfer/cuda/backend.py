"""CudaBackend: the whole llama forward on the GPU (Backend protocol, docs/CONTRACTS.md).

Construction (timed as `load_s`): every linear weight gets a route (routes.plan_routes, via
minfer.cuda.paths.choose_path: f16, blk or a raw int8 path; the path object's route runs it),
q/k/v and gate/up on one path are fused (fusion.plan_fusion), the memory plan is checked against the device's free memory, the weights are uploaded (f16 routes
dequantized on the GPU, MMQ routes kept as raw bytes) and the activations, the KV cache (f16
[max_tokens, Hkv, D] per layer) and the rope table are allocated: see minfer.cuda.load.
Kernels are compiled before anything is timed (minfer.cuda.load.prepare): the weight upload's
before the upload, the forward's before `warmup_s`, in which one token is pushed through (then
the cache is reset); `warmup(lengths)` does the same for prompt lengths (batch.single.run calls it
before the timed prefill). compile_s / n_compiled / capture_s add up what that took.

forward(ids, pos0) runs each chunk's launches through a `Forward` (minfer.cuda.forward: the
loop below, over the routes, weights and buffers made here), per layer, T tokens (f32
residual x, f16 GEMM operands):
  h16 = rmsnorm(x) * attn_norm;  qkv32 = h16 @ [Wq; Wk; Wv].T (one GEMM on the fused weight)
  (qwen3, gemma3: each head of q and k rmsnorm'd in the rope's launch; olmo2: all heads as one row)
  rope_qkv (one launch): q16 = rope(q);  cache_k[slot] = rope(k);  cache_v[slot] = v (f16)
  a16 = attention(q16, cache);  x += a16 @ Wo.T (GEMM epilogue accumulates)
  h16 = rmsnorm(x) * ffn_norm;  gu32 = h16 @ [Wg; Wu].T (one GEMM);  a16 = swiglu(gu32)
  (gate|up on f16 or blk: a16 straight from the GEMM's epilogue, fusion.plan_glu)
  x += a16 @ Wd.T
Fusion: when q, k, v (resp. gate, up) all run on f16, they are dequantized into row ranges of
one [Nq + 2 Nkv, K] (resp. [2 d_ff, K]) f16 buffer (self.w keeps per-weight row views) and run
as one GEMM: fewer launches and a wide N for the small k/v products. Otherwise (MMQ routes)
they run as separate GEMMs into separate f32 buffers; the same rope_qkv reads them.
Buffers are declared in minfer.cuda.load.buffers.DeviceBuffers (self.buf). The token layout lives on the
device (buf.tok: (KV slot, first slot of its sequence) per token; rope_qkv, the rope epilogue
and attention read it), so every launch of a chunk depends only on (T, last, per_token: a
decode step's layout runs the one-token-per-block attention): with `graphs` on (default;
MINFER_CUDA_DEBUG=nographs or debug mode turn it off) the first chunk of each shape runs
eagerly (kernels are built and loaded) and is then recorded into a CUDA graph (minfer.cuda.runtime.graph); every
later chunk of that shape replays it, at any pos0: one host launch per chunk instead of ~11 per layer.
Profiling runs eagerly (events need the launches one by one).
int8 weights: the activation is made once per distinct input into the operand its routes read
(their path's Operand), in one reused scratch buffer per operand (DeviceBuffers.operands; q, k,
v share h16's; gate, up share the FFN input's), then the route's kernel runs (attn_output /
ffn_down accumulate into x). Where the operand has those producers, the rmsnorm launch writes
the operand of the GEMMs after it (`_norm`, Operand.norm) and the wgmma attention
attn_output's from its epilogue (`_attn_operand`, Operand.attn), bit for bit the prepass's
bytes (tuning variant no-fused-prepass: separate launches).
`route_summary()` gives the one-line
"MMQ: n GEMMs (q4_K a, q6_K b), f16: m (...)" that bench and check print.
The last layer runs attention and the FFN for the last position only. Then
logits = (rmsnorm(x[-1]) * output_norm) @ W_out.T (GEMV), copied to the host; `argmax_last()`
gives the greedy token on the GPU. `window_logits(ids, first)` (perplexity) runs a fresh
sequence with every row through the last layer, then the same norm and LM head over rows
first.. (a GEMM, HEAD_ROWS rows at a time), copied to the host.
Many sequences (minfer.batch): `packed(ids, tok, rows, targets)` runs one chunk of tokens of
many sequences, each token at its own KV slot and position (tok), every row through the last
layer, then the norm, LM head and row_stats over the rows asked for (HEAD_ROWS at a time): the
host gets [m, 4] numbers (greedy id, margin, log-prob, logsumexp), never [m, vocab] logits;
with `top=k` also each row's k most likely ids and their log-probs (row_topk, [m, k] each).
`packed_launch(...)` is packed() without the wait (the scheduler's overlap: minfer.batch.launch):
the inputs go up from pinned host buffers by async copies on the legacy stream, the chunk and
its head are queued, the outputs come back by async copies into pinned buffers and an event
is recorded; nothing in it waits for the GPU, so forward N+1 is queued while N runs. Its
handle's wait() synchronizes that event and does packed()'s checks. The pinned buffers are
double (two sides): at most one launch is outstanding when another is made (asserted), and it
holds the other side. packed() is launch + wait. Order: launch N+1's uploads, eager kernels,
read-backs and copy_kv run on the legacy stream, which waits for all earlier work of the
blocking capture stream the graphs replay on (and it for the legacy stream's), so N+1's inputs
land in buf.ids / buf.tok only after N has read them, and a copy_kv queued after launch N
copies the rows N wrote.
`copy_kv(src, dst, n)` copies cache rows between sequences (a shared prefix computed once).
The cache then has `kv_slots` rows (fit_kv_slots: what the free memory holds), beyond n_ctx.

Memory: plan.make_plan decides before anything is allocated (`self.memory`, a
memory.MemoryPlan: `memory_line()` is what prefill / bench / check print); a forced --gemm path
that does not fit is refused naming the paths that would (MemoryPlan.refusal). The weights
stream from the memory map in chunks (`chunk` bytes, 64 MiB by default; load.weights):
`upload_bytes` of file in `upload_s`.

Faults: the memory plan is checked before anything is allocated (plan.sizes.check_memory). In
poison mode (the runtime's debug or poison flag; `minfer check` sets it) every output a kernel
is about to write (GEMM, dequant, embed, norms, rope's q, attention, SwiGLU, logits) is
NaN-filled first (da.poison), and forward() raises GPUError on non-finite logits, so a kernel
that did not run can never pass stale numbers off as a result.

Profiling (bench's per-op breakdown): with `self.profile = OpProfile(rt)`
(minfer.cuda.runtime.profile) every op is bracketed by CUDA events, labelled, with its FLOPs for GEMMs; the profile's
`begin_chunk` runs once a chunk's inputs are uploaded (an optional spin kernel there keeps the
host's launch rate out of the events).
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from minfer.cuda.forward import Forward
from minfer.cuda.load import prepare
from minfer.cuda.load.buffers import DeviceBuffers, alloc_buffers
from minfer.cuda.load.weights import load_weights
from minfer.cuda.ops import attention as attn_mod
from minfer.cuda.ops import layers as L
from minfer.cuda.paths import TABLE
from minfer.cuda.plan.config import GemmChoice
from minfer.cuda.plan.plan import make_plan
from minfer.cuda.plan.routes import plan_routes, summarize_routes
from minfer.cuda.plan.sizes import check_memory, operand_bytes
from minfer.cuda.runtime import devarray as da
from minfer.cuda.runtime.profile import OpProfile
from minfer.errors import BadInput, GPUError, Unsupported

# public names importers use (tests, bench, commands)
__all__ = ["CudaBackend", "OpProfile", "plan_routes", "summarize_routes"]


def moe_bytes_note(model) -> str:
    """'' for a dense model; for a MoE one its weight bytes, experts among them, and whether
    they would fit one GPU of the largest lent (H200, 141 GB)."""
    from minfer.cuda.plan.memory import gb
    from minfer.cuda.plan.sizes import expert_bytes, weight_bytes

    if not getattr(model.config, "n_expert", 0):
        return ""
    w, e = weight_bytes(model), expert_bytes(model)
    fit = "" if w <= H200_BYTES else f": more than one {gb(H200_BYTES)} GPU holds"
    return f"; its weights are {gb(w)}, {gb(e)} of them experts{fit}"


H200_BYTES = 141_000_000_000  # the largest single GPU minfer plans for


class CudaBackend:
    """Backend protocol on the GPU. See the module docstring for the dataflow."""

    HEAD_ROWS = 128  # LM head rows per launch in window_logits: [128, vocab] f32 on the device

    def __init__(
        self,
        model,
        cfg: GemmChoice | None = None,
        rt=None,
        max_tokens: int = 4096,
        ubatch: int = 2048,
        warmup: bool = True,
        progress: bool = False,
        graphs: bool | None = None,
        chunk: int | None = None,
        kv_slots: int | None = None,
    ):
        from minfer.cuda.runtime.runtime import get_runtime

        t0 = time.perf_counter()
        self.model = model
        self.c = c = model.config
        self.gcfg = cfg or GemmChoice()  # auto unless the caller resolved a choice
        self.rt = rt or get_runtime()
        label = self.gcfg.label()
        plain = label == "auto" or (label in TABLE and not TABLE[label].int8)  # f16
        self.name = "cuda" if plain else f"cuda-{label}"
        from minfer.gguf.arch_keys import gpu_unsupported

        if gpu_unsupported(c):  # (an architecture or head_dim the kernels lack)
            raise Unsupported(f"cuda backend: {gpu_unsupported(c)}{moe_bytes_note(model)}")
        if max_tokens > c.n_ctx:
            max_tokens = c.n_ctx
        if kv_slots is not None:  # many sequences: slots past the context, positions within it
            max_tokens = min(max_tokens, kv_slots)
        self.max_tokens = int(max_tokens)  # one sequence's positions
        self.kv_slots = int(kv_slots or max_tokens)  # KV cache rows
        self.ubatch = int(max(1, min(ubatch, self.kv_slots)))
        self.n_past = 0
        from minfer.cuda.runtime.upload import DEFAULT_CHUNK

        self.chunk = int(chunk or DEFAULT_CHUNK)  # upload chunk bytes
        # the plan, computed once (routes, fusion, epilogues, memory: minfer.cuda.plan.plan),
        # before anything is allocated
        self.plan = make_plan(model, self.gcfg, self.rt, self.kv_slots, self.ubatch, self.chunk)
        self.memory, self.routes = self.plan.memory, dict(self.plan.routes)
        if self.gcfg.path != "auto" and not self.memory.fits and self.memory.fitting():
            raise GPUError(self.memory.refusal())
        if graphs is None:
            from minfer.cuda.runtime.runtime import debug_flags

            graphs = "nographs" not in debug_flags()
        self.graphs = bool(graphs) and not self.rt.cfg.debug
        self._head_out = None  # window_logits' [HEAD_ROWS, vocab] f32 logits, made at first use
        self._cache_ptrs = None  # u64 [2 n_layers]: the K and V caches' addresses (copy_kv)
        self._hidden_out = None  # packed(hidden=)'s [HEAD_ROWS, d_model] f32 rows, likewise
        self._graphs: dict[tuple[int, bool, bool], object] = {}
        self._packed_seen: dict[int, int] = {}  # packed chunks run, by size
        self._pinned: dict[tuple[int, str], np.ndarray] = {}  # packed_launch's host buffers
        self._pending: list[_Launch] = []  # launched, not waited for (at most one at a launch)
        self.stream = None  # the capture / replay stream (made at the first capture)
        self.fused, self.glu, self.groups = self.plan.fused, self.plan.glu, self.plan.groups
        # each linear weight's route object (its path family's): operand, launch, epilogues
        self.lin = {
            n: TABLE[p].route(model.tensor(n).qtype, self.gcfg, n)
            for n, (p, _) in self.routes.items()
        }
        for gs in self.groups:  # one input's forms never share a scratch buffer
            for groups in gs.values():
                kinds = {self.lin[g.member].operand for g in groups} - {None}
                if len({k.scratch for k in kinds}) < len(kinds):
                    raise AssertionError(
                        f"forms {sorted(k.name for k in kinds)} of one input share a scratch"
                    )
        plan = self.plan.parts
        if getattr(c, "n_expert", 0):  # the experts' bytes named (minfer.cuda.load.moe)
            from minfer.cuda.plan import moe
            from minfer.cuda.plan.memory import MARGIN

            moe.check_fits(model, plan, self.rt.mem_info()[0], MARGIN, self.plan.moe)
        check_memory(self.rt, plan, self.kv_slots, self.ubatch)  # before any allocation
        self.progress, self.n_compiled, self.compile_s, self.capture_s = progress, 0, 0.0, 0.0
        self._add(prepare.prebuild(prepare.load_kernels(self.routes), self.rt.arch, progress))
        wts = load_weights(
            self.rt,
            model,
            self.routes,
            self.fused,
            plan["upload staging"] // 2,
            progress,
            frozenset(self.glu),
            self.gcfg.channels,
        )
        self.w, self.qtypes, self.emb, self.emb_qtype = wts.w, wts.qtypes, wts.emb, wts.emb_qtype
        self.upload_bytes, self.upload_s = wts.nbytes, wts.seconds  # file into ready weights
        self.moe = None  # a mixture-of-experts model's routers, experts and their buffers
        if getattr(c, "n_expert", 0):
            from minfer.cuda.load.moe import MoeLayers
            from minfer.cuda.plan.config import moe_kernel

            t_moe = time.perf_counter()
            kern = moe_kernel()  # the grouped GEMMs' kernel (MINFER_MOE_GEMM)
            self.moe = MoeLayers(
                self.rt, model, self.ubatch, self.chunk, kernel=kern, experts=self.plan.moe
            )
            self.upload_bytes += self.moe.nbytes
            self.upload_s += time.perf_counter() - t_moe
        self.buf: DeviceBuffers = alloc_buffers(
            self.rt,
            c,
            self.kv_slots,
            self.ubatch,
            operand_bytes(plan),
            self.plan.glu_all,
        )
        # fused q|k|v GEMMs that may rope into q16 and their layer's caches from the epilogue
        self.rope_epi = {}
        for g in sorted(self.plan.rope):
            il = int(g.split(".")[1])  # blk.<il>.attn_qkv.weight
            b = self.buf
            self.rope_epi[g] = L.QkvRope(
                self.rt, b.q16, b.kc[il], b.vc[il], b.rope, b.tok, c.rope_dim, c.rope_neox
            )
        self.fwd = Forward(
            self.rt, model, self.gcfg, self.lin, self.groups, self.glu, self.rope_epi, wts, self.buf
        )
        self.fwd.moe = self.moe
        self.rt.synchronize()
        self.load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if warmup:
            self.warmup([1])
        self.rt.synchronize()
        self.warmup_s = time.perf_counter() - t1

    @property
    def profile(self):
        """The per-op event profile (bench's breakdown; None: off), kept by the Forward."""
        return self.fwd.profile

    @profile.setter
    def profile(self, p) -> None:
        self.fwd.profile = p

    def _plan(self) -> dict[str, int]:
        """part -> bytes of the plan's memory (what the tiers were compared by; tests/gpu
        compare it with the device's use)."""
        return dict(self.plan.parts)

    def warmup(self, lengths) -> "prepare.Prep":
        """Compile (in parallel) and load every kernel forwards of `lengths` tokens need and
        record their CUDA graphs, untimed; the KV cache is left empty."""
        return self._add(prepare.warmup(self, lengths, self.progress))

    def _add(self, p: "prepare.Prep") -> "prepare.Prep":
        self.n_compiled += p.n_compiled
        self.compile_s += p.compile_s
        self.capture_s += p.capture_s
        return p

    # -- protocol -------------------------------------------------------------------------------
    def reset(self) -> None:
        self.n_past = 0

    def synchronize(self) -> None:
        self.rt.synchronize()

    def memory_line(self) -> str:
        """The memory plan line (memory.MemoryPlan.line): what each tier needs, what is free,
        what runs."""
        return self.memory.line()

    def route_summary(self) -> str:
        """One line: which GEMMs run on MMQ (by type) and which on f16 (and why); a MoE
        model's experts after it (minfer.cuda.load.moe: the plan's expert GEMMs, f16 or blk
        int8)."""
        s = summarize_routes(self.model, self.routes)
        if getattr(self, "moe", None) is not None:
            c = self.c
            s += (
                f"; experts: {self.moe.experts.label} grouped GEMMs "
                f"({c.n_layers} layers x {c.n_expert} experts, "
                f"{c.n_expert_used} used)"
            )
        return s

    def forward(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        """ids int32 [T] at positions pos0..; -> host float32 logits [vocab] of the last one.
        GPUError (never a silent wrong number) when a kernel failed or the logits are not
        finite (NaN poison from a kernel that did not run, or an overflow)."""
        self.forward_device(ids, pos0)
        try:
            out = self.buf.logits.get().reshape(-1).astype(np.float32, copy=False)
        except self.rt.drv.Error as e:  # an earlier kernel failed asynchronously
            raise GPUError(
                f"GPU error while reading the logits ({e}); rerun with "
                "MINFER_CUDA_DEBUG=1 to name the kernel that failed"
            ) from None
        bad = out.size - int(np.count_nonzero(np.isfinite(out)))
        if bad:
            T = len(np.asarray(ids))
            where = self._first_nonfinite(ids, pos0)
            raise GPUError(
                f"non-finite logits from the CUDA path ({bad} of {out.size} NaN/inf "
                f"at positions {pos0}..{pos0 + T - 1}, backend {self.name}; first "
                f"non-finite: {where}); run `minfer check` or MINFER_CUDA_DEBUG=1 "
                "to find the kernel"
            )
        return out

    def _first_nonfinite(self, ids: np.ndarray, pos0: int) -> str:
        """Where forward(ids, pos0)'s numbers first went NaN/inf (_locate)."""
        try:
            return self._locate(lambda: self.forward_device(ids, pos0), pos0)
        finally:
            self.n_past = pos0 + len(np.asarray(ids))

    def _locate(self, rerun, n_past: int = 0) -> str:
        """Where a forward's numbers first went NaN/inf: rerun() (the forward again) eagerly,
        the residual read back after the embedding and after every layer (only on this error
        path: it syncs per layer)."""

        class Found(Exception):
            pass

        seen = set()

        def probe(il: int, rows) -> None:
            self.rt.synchronize()
            if not np.isfinite(rows.get()).all():
                raise Found("the token embedding" if il < 0 else f"layer {il} (blk.{il})")
            seen.add(il)

        graphs, self.graphs, self.fwd.probe, self.n_past = self.graphs, False, probe, n_past
        try:
            rerun()
        except Found as e:
            return str(e)
        except Exception as e:  # best effort: never hide the error it would explain
            return f"not located ({type(e).__name__} in the rerun)"
        finally:
            self.graphs, self.fwd.probe = graphs, None
        if self.c.n_layers - 1 in seen:  # every layer's output finite: the norm or LM head
            return "the output layer (final norm or LM head)"
        return "not located (the rerun was finite)"

    def argmax_last(self) -> int:
        """Greedy token of the last forward's logits, computed on the GPU."""
        da.poison(self.rt, self.buf.amax)
        L.argmax(self.rt, self.buf.amax, da.reshape(self.buf.logits, (self.c.vocab_size,)))
        return int(self.buf.amax.get()[0])

    def _checked_ids(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        """ids as int32 [T], or BadInput when they cannot run at pos0."""
        c = self.c
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.shape[0] == 0:
            raise BadInput(f"forward: ids must be a non-empty 1-D array, got shape {ids.shape}")
        T = int(ids.shape[0])
        if pos0 != self.n_past:
            raise BadInput(f"forward: pos0 {pos0} but the KV cache holds {self.n_past} positions")
        if pos0 + T > self.max_tokens:
            raise BadInput(
                f"forward: {pos0 + T} positions exceed the backend's max_tokens {self.max_tokens}"
            )
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise BadInput(f"forward: token id out of range [0, {c.vocab_size})")
        return ids.astype(np.int32)

    def window_logits(self, ids: np.ndarray, first: int) -> np.ndarray:
        """ids int32 [T] as a fresh sequence (the cache is reset, positions 0..T-1) -> host
        float32 logits [T - first, vocab] of positions first..T-1 (perplexity's scored rows).
        Each ubatch chunk runs as a non-final chunk (every row through the last layer), then
        the output norm and the LM head run over its rows >= first, HEAD_ROWS at a time.
        GPUError on non-finite logits, as forward."""
        self.reset()
        ids = self._checked_ids(ids, 0)
        T, V = int(ids.shape[0]), self.c.vocab_size
        if not 0 <= first < T:
            raise BadInput(f"window_logits: first {first} outside [0, {T})")
        out = np.empty((T - first, V), np.float32)
        for s in range(0, T, self.ubatch):
            n = min(self.ubatch, T - s)
            self._forward_chunk(ids[s : s + n], s, last=False)
            self.n_past = s + n
            for r in range(max(first, s), s + n, self.HEAD_ROWS):
                m = min(self.HEAD_ROWS, s + n - r)
                try:
                    out[r - first : r - first + m] = self._head(r - s, m).get()
                except self.rt.drv.Error as e:  # an earlier kernel failed asynchronously
                    raise GPUError(
                        f"GPU error while reading the logits ({e}); rerun with "
                        "MINFER_CUDA_DEBUG=1 to name the kernel that failed"
                    ) from None
        bad = out.size - int(np.count_nonzero(np.isfinite(out)))
        if bad:
            raise GPUError(
                f"non-finite logits from the CUDA path ({bad} of {out.size} NaN/inf "
                f"in a window of {T} tokens, backend {self.name}); run `minfer check` "
                "or MINFER_CUDA_DEBUG=1 to find the kernel"
            )
        return out

    def packed(
        self,
        ids: np.ndarray,
        tok: np.ndarray,
        rows: np.ndarray,
        targets: np.ndarray,
        top: int = 0,
        hidden=None,
    ):
        """One chunk of many sequences' tokens: ids int32 [T] (T <= ubatch), tok int32 [T, 2]
        (KV slot, first slot of the token's sequence: position slot - lo, keys lo..slot; both
        non-decreasing in t), rows int32 [m] (chunk rows that need logits, m <= T), targets
        int32 [m] (each row's next token, or -1) -> host float32 [m, 4]: (greedy id, top1 -
        top2, log-prob of the target (NaN for -1), logsumexp) per row (ops.row_stats).
        top in 1..min(ops.TOP_MAX, vocab): -> (that, ids int32 [m, top], log-probs f32
        [m, top]): each row's top largest logits, descending, ties to the smaller id, minus
        its logsumexp (row_topk on the device after row_stats; top 0 runs exactly as before).
        hidden int [h] (chunk rows, h <= T): -> (that, host f32 [h, d_model]: the rows' final
        hidden states after the output norm, rmsnorm_rows into f32, HEAD_ROWS at a time, no
        LM head; issue 52's embeddings and label logits).
        Every row goes through every layer; the LM head runs HEAD_ROWS rows at a time.
        Numpy twin: ReferenceBackend.packed. GPUError on non-finite logits."""
        return self.packed_launch(ids, tok, rows, targets, top=top, hidden=hidden).wait()

    def packed_launch(
        self,
        ids: np.ndarray,
        tok: np.ndarray,
        rows: np.ndarray,
        targets: np.ndarray,
        top: int = 0,
        hidden=None,
    ) -> "_Launch":
        """packed()'s work queued on the GPU without waiting for it -> a handle whose wait()
        returns what packed() returns (or raises its errors). BadInput at once for arguments
        that cannot run. At most one other launch may be outstanding (not yet waited for)."""
        from minfer.batch.layout import check_hidden, check_top

        ids, tok, rows, targets = self._checked_packed(ids, tok, rows, targets)
        top = check_top(top, self.c.vocab_size)
        hidden = check_hidden(hidden, ids.shape[0])
        if len(self._pending) > 1:
            raise AssertionError("packed_launch: two launches outstanding (wait for one first)")
        side = 1 - self._pending[0].side if self._pending else 0  # (the other's buffers)
        T, m = ids.shape[0], rows.shape[0]
        self.n_past = 0  # the single-sequence protocol starts over after a batch
        one = attn_mod.per_token_pays(tok)  # a decode step: attention one token per block
        seen = self._packed_seen.get((T, one), 0)  # a graph from a shape's second chunk on
        self._packed_seen[(T, one)] = seen + 1
        h = _Launch(self, side, ids, tok, m, top)
        try:
            b = self.buf
            self._htod(da.rows(b.ids, 0, T), self._stage(side, "ids", ids))
            self._htod(da.rows(b.tok, 0, T), self._stage(side, "tok", tok))
            hi = int(tok[-1, 0]) + 1
            self._run_chunk(ids, tok, hi, last=False, capture=seen > 0, per_token=one, staged=True)
            self._packed_head(h, rows, targets, top)
            if hidden is not None:
                self._hidden_rows(h, hidden)
            h.event = self.rt.drv.Event()
            h.event.record(self.rt.stream)
        except self.rt.drv.Error as e:  # an earlier kernel failed asynchronously
            raise GPUError(
                f"GPU error while queueing a packed chunk ({e}); rerun with "
                "MINFER_CUDA_DEBUG=1 to name the kernel that failed"
            ) from None
        except BaseException:
            with contextlib.suppress(Exception):  # what was queued ends before a retry
                self.rt.synchronize()
            raise
        self._pending.append(h)
        return h

    def _stage(self, side: int, key: str, a: np.ndarray) -> np.ndarray:
        """a copied into side's pinned host buffer `key` (grown as needed): the source of an
        async upload, left alone until this side's launch is waited for."""
        buf = self._pinned_view(side, key, a.shape, a.dtype)
        buf[...] = a
        return buf

    def _pinned_view(self, side: int, key: str, shape, dtype) -> np.ndarray:
        """A C-contiguous [shape] view of side's pinned host buffer `key`."""
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buf = self._pinned.get((side, key))
        if buf is None or buf.nbytes < n:
            size = max(n, 4096, 0 if buf is None else 2 * buf.nbytes)
            buf = self._pinned[(side, key)] = self.rt.drv.pagelocked_empty((size,), np.uint8)
        return buf[:n].view(dtype).reshape(shape)

    def _htod(self, dev, host: np.ndarray) -> None:
        """host (pinned) -> device array dev, queued on the launch stream (no host wait)."""
        if host.size:
            self.rt.drv.memcpy_htod_async(da.ptr(dev), host, self.rt.stream)

    def _dtoh(self, host: np.ndarray, dev) -> None:
        """device array dev -> host (pinned), queued on the launch stream (no host wait)."""
        if host.size:
            self.rt.drv.memcpy_dtoh_async(host, da.ptr(dev), self.rt.stream)

    def _packed_wait(self, h: "_Launch"):
        """_Launch.wait: its event waited for, its numbers copied out of the pinned buffers
        and checked as packed() does."""
        if h not in self._pending:
            raise AssertionError("packed_launch: a handle waited for twice")
        self._pending.remove(h)
        try:
            h.event.synchronize()
        except self.rt.drv.Error as e:  # an earlier kernel failed asynchronously
            raise GPUError(
                f"GPU error while reading the logits ({e}); rerun with "
                "MINFER_CUDA_DEBUG=1 to name the kernel that failed"
            ) from None
        m, top, T = h.m, h.top, h.ids.shape[0]
        out = h.stats.copy()
        bad = m - int(np.count_nonzero(np.isfinite(out[:, 3])))
        if bad:
            tok, hi = h.tok, int(h.tok[-1, 0]) + 1
            one = attn_mod.per_token_pays(tok)

            def rerun():  # (its inputs again: a later launch may have replaced them)
                da.rows(self.buf.ids, 0, T).set(h.ids)
                da.rows(self.buf.tok, 0, T).set(tok)
                self.fwd.chunk(T, hi, False, one)

            where = self._locate(rerun)
            raise GPUError(
                f"non-finite logits from the CUDA path ({bad} of {m} rows of a "
                f"packed chunk of {T} tokens, slots {int(tok[0, 0])}..{hi - 1}, "
                f"backend {self.name}; first non-finite: {where}); run `minfer "
                "check` or MINFER_CUDA_DEBUG=1 to find the kernel"
            )
        res = (out, h.top_ids.copy(), h.top_lp.copy()) if top else out
        if h.hidden is None:
            return res
        hid = h.hidden.copy()
        bad = hid.shape[0] - int(np.count_nonzero(np.isfinite(hid).all(axis=1)))
        if bad:
            raise GPUError(
                f"non-finite hidden states from the CUDA path ({bad} of {hid.shape[0]} rows, "
                f"slots {int(h.tok[0, 0])}..{int(h.tok[-1, 0])}, backend {self.name}); "
                "run `minfer check` or MINFER_CUDA_DEBUG=1 to find the kernel"
            )
        return res, hid

    def _packed_head(self, h: "_Launch", rows, targets, top: int) -> None:
        """packed()'s LM head part over the chunk just queued (see packed): row_stats (and
        row_topk) HEAD_ROWS rows at a time, their results queued back into h's pinned views."""
        m, b, side = rows.shape[0], self.buf, h.side
        h.stats = self._pinned_view(side, "stats", (m, 4), np.float32)
        if top:
            h.top_ids = self._pinned_view(side, "top_ids", (m, top), np.int32)
            h.top_lp = self._pinned_view(side, "top_lp", (m, top), np.float32)
        if m == 0:
            return
        R = da.rows
        self._htod(R(b.rows, 0, m), self._stage(side, "rows", rows))
        self._htod(R(b.targets, 0, m), self._stage(side, "targets", targets))
        # [m, top] row-major views of the [ubatch * TOP_MAX] buffers (m <= T <= ubatch)
        tops = (
            [da.reshape(R(a, 0, m * top), (m, top)) for a in (b.top_ids, b.top_lp)] if top else None
        )
        if top:
            da.poison(self.rt, *tops)  # (poison mode: a row_topk that did not run reads NaN)
        for r in range(0, m, self.HEAD_ROWS):
            k = min(self.HEAD_ROWS, m - r)
            logits = self._head(0, k, R(b.rows, r, k))
            L.row_stats(self.rt, R(b.stats, r, k), logits, R(b.targets, r, k))
            if top:
                L.row_topk(
                    self.rt, R(tops[0], r, k), R(tops[1], r, k), logits, R(b.stats, r, k), top
                )
        self._dtoh(h.stats, R(b.stats, 0, m))
        if top:
            self._dtoh(h.top_ids, tops[0])
            self._dtoh(h.top_lp, tops[1])

    def _hidden_rows(self, h: "_Launch", hidden) -> None:
        """rmsnorm(x[hidden]) * output_norm of the chunk just queued, into an f32 [HEAD_ROWS,
        d_model] device buffer (made at first use, 2 MB at d 4096) a block at a time, each
        block queued back into h's pinned [len(hidden), d_model] view; the row indices go
        through buf.rows (after the head has used it)."""
        n_h, d, R, side = hidden.shape[0], self.c.d_model, da.rows, h.side
        h.hidden = self._pinned_view(side, "hidden", (n_h, d), np.float32)
        idx_all = self._stage(side, "hidden rows", hidden.astype(np.int32))
        if self._hidden_out is None:
            self._hidden_out = da.empty(
                self.rt, (min(self.HEAD_ROWS, self.ubatch), d), np.float32, "hidden rows"
            )
        n = self._hidden_out.shape[0]
        for r in range(0, n_h, n):
            k = min(n, n_h - r)
            idx = R(self.buf.rows, 0, k)
            self._htod(idx, idx_all[r : r + k])
            y = R(self._hidden_out, 0, k)
            da.poison(self.rt, y)
            L.rmsnorm_rows(
                self.rt, y, self.buf.x, idx, self.w["output_norm.weight"], self.c.rms_eps
            )
            self._dtoh(h.hidden[r : r + k], y)

    def _checked_packed(self, ids, tok, rows, targets):
        """packed()'s arguments as int32 arrays, or BadInput naming what cannot run."""
        from minfer.batch.layout import check_packed

        ids, tok, rows, targets = check_packed(
            ids,
            tok,
            rows,
            targets,
            vocab=self.c.vocab_size,
            kv_slots=self.kv_slots,
            n_pos=self.max_tokens,
            what_pos=f"the backend's {self.max_tokens} positions",
            max_tokens=self.ubatch,
            max_rows=True,
        )
        i32 = np.int32
        return (
            ids.astype(i32),
            np.ascontiguousarray(tok, i32),
            rows.astype(i32),
            targets.astype(i32),
        )

    def thread_context(self):
        """The runtime's context current on the calling thread while inside (Runtime.on_thread:
        the server's engine thread runs every call of this backend inside one)."""
        return self.rt.on_thread()

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        """KV cache rows src..src+n-1 copied to dst..dst+n-1 in every layer (a shared prefix,
        computed once, given to another sequence). Ordered after the chunks before it."""
        if n <= 0:
            return
        if min(src, dst) < 0 or max(src, dst) + n > self.kv_slots or abs(src - dst) < n:
            raise BadInput(
                f"copy_kv: rows {src}+{n} -> {dst}+{n} outside the cache's "
                f"{self.kv_slots} rows or overlapping"
            )
        row = self.c.n_kv_heads * self.c.head_dim * 2  # bytes of one f16 cache row
        caches = (*self.buf.kc, *self.buf.vc)
        if row % 16:  # (no model seen has such a row: 16-byte copies need it)
            for cache in caches:
                base = int(da.ptr(cache))
                self.rt.drv.memcpy_dtod(base + dst * row, base + src * row, n * row)
            return
        if self._cache_ptrs is None:  # every layer's K and V cache, for one launch a copy
            ptrs = np.array([int(da.ptr(c)) for c in caches], np.uint64)
            self._cache_ptrs = da.to_device(self.rt, ptrs, "KV cache addresses")
        L.copy_rows(self.rt, self._cache_ptrs, src * row, dst * row, n * row)

    def _head(self, row0: int, m: int, rows=None):
        """Device f32 logits [m, vocab] of residual rows row0.. of the chunk just run, or of
        the rows the int32 device array `rows` [m] names (Forward.head); the output buffer
        is allocated at first use (outside the memory plan: HEAD_ROWS rows, 25 MB at vocab
        49152) and reused."""
        if self._head_out is None:
            n = min(self.HEAD_ROWS, self.ubatch)
            self._head_out = da.empty(self.rt, (n, self.c.vocab_size), np.float32, "logits rows")
        logits = da.rows(self._head_out, 0, m)
        self.fwd.head(row0, m, logits, rows)
        return logits

    def forward_device(self, ids: np.ndarray, pos0: int) -> None:
        ids = self._checked_ids(ids, pos0)
        T = int(ids.shape[0])
        for s in range(0, T, self.ubatch):
            chunk = ids[s : s + self.ubatch]
            self._forward_chunk(chunk, pos0 + s, last=s + len(chunk) == T)
        self.n_past = pos0 + T

    def _forward_chunk(self, ids: np.ndarray, pos0: int, last: bool) -> None:
        self._run_chunk(ids, L.tok_layout(pos0, len(ids)), pos0 + len(ids), last)

    def _run_chunk(
        self,
        ids: np.ndarray,
        tok: np.ndarray,
        hi: int,
        last: bool,
        capture: bool = True,
        per_token: bool | None = None,
        staged: bool = False,
    ) -> None:
        """One chunk: ids int32 [T] with their layout tok int32 [T, 2] uploaded, then the
        chunk's launches (a graph replay after the first of its shape (T, last, per_token));
        hi: one past the largest slot (host-side checks). capture False: no graph is recorded
        for a new shape (a packed batch's odd chunk sizes: one eager run costs less than a
        capture). per_token: Forward.chunk's (None: T == 1). staged: ids and tok are already
        on their way to the device (packed_launch's async copies), else uploaded here."""
        T = len(ids)
        per_token = T == 1 if per_token is None else bool(per_token)
        key = (T, bool(last), per_token)
        if not staged:
            da.rows(self.buf.ids, 0, T).set(ids)
            da.rows(self.buf.tok, 0, T).set(tok)
        if self.profile is not None:
            self.profile.begin_chunk()
        if self.graphs and self.profile is None:
            g = self._graphs.get(key)
            if g is not None:
                g.launch(self.stream)
                return
            # first sighting: run eagerly (kernels get built and loaded outside any capture),
            # then record the graph for the next chunk of this shape (recording runs nothing)
            self.fwd.chunk(T, hi, last, per_token)
            if capture:
                self._capture(T, hi, last, per_token)
            return
        self.fwd.chunk(T, hi, last, per_token)

    def _capture(self, T: int, hi: int, last: bool, per_token: bool):
        """Capture Forward.chunk(T, ...) into a graph (cached by (T, last, per_token)); None
        (graphs turned off, one notice) if the driver refuses."""
        from minfer.cuda.runtime import graph

        rt = self.rt
        if self.stream is None:
            self.stream = rt.drv.Stream()
        rt.synchronize()  # the capture stream syncs with the legacy one: leave it idle first
        rt.stream = self.stream
        try:
            g = graph.capture(self.stream, lambda: self.fwd.chunk(T, hi, last, per_token))
        except Exception as e:  # driver refusal (a real input error re-raises eagerly)
            print(
                f"cuda backend: CUDA graph capture failed ({e}); running without graphs",
                file=sys.stderr,
            )
            self.graphs = False
            return None
        finally:
            rt.stream = None
        self._graphs[(T, bool(last), per_token)] = g
        return g


class _Launch:
    """CudaBackend.packed_launch's handle: the call's host inputs (the error path's rerun),
    its side of the pinned buffers and the views its outputs arrive in, the event after them."""

    def __init__(self, be: CudaBackend, side: int, ids, tok, m: int, top: int):
        self.be, self.side, self.ids, self.tok, self.m, self.top = be, side, ids, tok, m, top
        self.stats = self.top_ids = self.top_lp = self.hidden = None  # pinned views
        self.event = None

    def wait(self):
        """What packed() returns (GPUError for a fault or non-finite numbers)."""
        return self.be._packed_wait(self)
