"""CudaBackend: the whole llama forward on the GPU (Backend protocol, docs/CONTRACTS.md).

Construction (timed as `load_s`): every linear weight gets a route (`plan_routes`, via
pick_gemm): "f16" weights are uploaded as raw GGUF bytes (PCIe moves the compact quantized
bytes) and dequantized on the GPU to f16 [N, K] (dq_f16); "mmq-*" weights (q4_K / q6_K when the
GemmConfig enables MMQ) stay as their raw bytes on the GPU, no f16 copy. A weight whose consumer
needs f16 output (attn_v writing the f16 KV cache when there is no bias) stays on f16. The
embedding table stays quantized (rows gathered with embed_rows); norms go up as f32. The KV
cache (f16 [max_tokens, Hkv, D] per layer), activations for `ubatch` tokens and the rope table
are allocated up front, after checking the device's free memory. Then `warmup_s`: every kernel
is built/loaded and one token is pushed through (then the cache is reset).

forward(ids, pos0), per layer, T tokens (f32 residual x, f16 GEMM operands):
  h16 = rmsnorm(x) * attn_norm;  qkv32 = h16 @ [Wq; Wk; Wv].T (one GEMM on the fused weight)
  rope_qkv (one launch): q16 = rope(q);  cache_k[pos0:] = rope(k);  cache_v[pos0:] = v (f16)
  a16 = attention(q16, cache);  x += a16 @ Wo.T (GEMM epilogue accumulates)
  h16 = rmsnorm(x) * ffn_norm;  gu32 = h16 @ [Wg; Wu].T (one GEMM);  a16 = swiglu(gu32)
  x += a16 @ Wd.T
Fusion: when q, k, v (resp. gate, up) all run on f16, they are dequantized into row ranges of
one [Nq + 2 Nkv, K] (resp. [2 d_ff, K]) f16 buffer (self.w keeps per-weight row views) and run
as one GEMM: fewer launches and a wide N for the small k/v products. Otherwise (MMQ routes)
they run as separate GEMMs into separate f32 buffers; the same rope_qkv reads them.
Positions live on the device (self.pos = [pos0]; rope_qkv and attention read it), so every
launch of a chunk depends only on (T, last): with `graphs` on (default; MINFER_CUDA_GRAPHS=0 or
the runtime's debug mode turn it off) the first chunk of each (T, last) runs eagerly (kernels
are built and loaded) and is then recorded into a CUDA graph (minfer.cuda.graph); every later
chunk of that shape replays it, at any pos0: one host launch per chunk instead of ~11 per layer.
Profiling runs eagerly (events need the launches one by one).
MMQ weights: the activation is quantized to q8_1 once per distinct input into one reused
scratch buffer (q, k, v share h16's; gate, up share the FFN input's), then mmq_linear runs on
the raw bytes (attn_output / ffn_down accumulate into x). `route_summary()` gives the one-line
"MMQ: n GEMMs (q4_K a, q6_K b), f16: m (...)" that bench and check print.
The last layer runs attention and the FFN for the last position only. Then
logits = (rmsnorm(x[-1]) * output_norm) @ W_out.T (GEMV), copied to the host; `argmax_last()`
gives the greedy token on the GPU.

Faults: the memory plan is checked against the device's free memory before anything is
allocated (GPUError naming what was asked and what is free). In poison mode (the runtime's
debug or poison flag; `minfer check` sets it) every output a kernel is about to write (GEMM,
dequant, embed, norms, rope's q, attention, SwiGLU, logits) is NaN-filled first (da.poison), and
forward() raises GPUError on non-finite logits, so a kernel that did not run can never pass
stale numbers off as a result.

Profiling (bench's per-op breakdown): with `self.profile = OpProfile(rt)` every op is bracketed
by CUDA events, labelled, with its FLOPs for GEMMs.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

import numpy as np

from minfer.cuda import attention as attn_mod
from minfer.cuda import devarray as da
from minfer.cuda import layers as L
from minfer.cuda.config import GemmConfig
from minfer.cuda.dispatch import pick_gemm
from minfer.errors import BadInput, GPUError, Unsupported

_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class OpProfile:
    """CUDA-event timings per labelled op, summed over forwards: label -> [ms, flops, count]."""

    def __init__(self, rt):
        self.rt = rt
        self.pending: list[tuple[str, float, object, object]] = []
        self.totals: dict[str, list[float]] = {}

    @contextmanager
    def op(self, label: str, flops: float = 0.0):
        drv = self.rt.drv
        a, b = drv.Event(), drv.Event()
        a.record()
        yield
        b.record()
        self.pending.append((label, flops, a, b))

    def collect(self) -> dict[str, list[float]]:
        self.rt.synchronize()
        for label, flops, a, b in self.pending:
            ms = b.time_since(a)
            t = self.totals.setdefault(label, [0.0, 0.0, 0])
            t[0] += ms
            t[1] += flops
            t[2] += 1
        self.pending.clear()
        return self.totals


# -- adapters to the gemm / dequant modules (engineers "gemm" and "dequant") -----------------
def _dev(a):
    """GPUArray -> the gemm module's DeviceArray view (no copy)."""
    from minfer.cuda.gemm import DeviceArray

    return DeviceArray(da.ptr(a), tuple(a.shape), np.dtype(a.dtype), a)


def _gemm(rt, C, A, B, mode: str) -> None:
    """C[M, N] (mode 'f32' store, 'f16' store, 'acc' f32 +=) = A f16 [M, K] @ B f16 [N, K].T."""
    from minfer.cuda.gemm import gemm_f16_nt

    if mode != "acc":
        da.poison(rt, C)  # debug / poison mode: NaN unless the GEMM really writes C
    if mode == "acc":
        gemm_f16_nt(_dev(A), _dev(B), np.float32, accumulate=_dev(C), rt=rt)
    else:
        gemm_f16_nt(_dev(A), _dev(B), np.float16 if mode == "f16" else np.float32,
                    out=_dev(C), rt=rt)


def _dequant_f16(rt, raw_dev, qtype: int, N: int, K: int, out) -> None:
    from minfer.cuda import dequant

    da.poison(rt, out)
    dequant.dequant_f16(rt, raw_dev, qtype, N, K, out_dev=out)


def _embed_rows(rt, out, table_dev, qtype: int, ids_dev, K: int, V: int) -> None:
    from minfer.cuda import dequant

    da.poison(rt, out)
    dequant.embed_rows(rt, table_dev, qtype, ids_dev, int(ids_dev.shape[0]), K, out, V=V)


_QNAMES = {12: "q4_K", 14: "q6_K"}


def _size(nbytes: int) -> str:
    """'1.25 GiB' from 1 GiB up, else '3.4 MiB' (memory messages)."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _qname(qtype: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(int(qtype)).name.lower().replace("_k", "_K")
    except (ImportError, ValueError):
        return _QNAMES.get(int(qtype), f"type {qtype}")


def plan_routes(model, cfg: GemmConfig, rt=None, ubatch: int = 512) -> dict[str, tuple[str, str]]:
    """weight name -> (path, why) for every linear weight and the LM head. path: pick_gemm's
    answer, except "f16" where the consumer needs f16 output; why: a short reason for f16."""
    c = model.config
    names = [f"blk.{i}.{n}.weight" for i in range(c.n_layers) for n in _LINEAR]
    names.append(model.output_name)
    routes: dict[str, tuple[str, str]] = {}
    for n in names:
        t = model.tensor(n)
        N, K = t.shape
        M = 1 if n == model.output_name else ubatch
        path = pick_gemm(t.qtype, M, N, K, cfg, rt)
        why = ""
        if path == "f16":
            from minfer.cuda.mmq import has_mmq

            why = ("MMQ off" if not cfg.mmq else
                   f"{_qname(t.qtype)}: no MMQ kernel" if not has_mmq(t.qtype) else
                   f"K={K} not a multiple of 256")
        elif n.endswith("attn_v.weight") and not c.qkv_bias:
            path, why = "f16", "attn_v: f16 KV-cache output"
        routes[n] = (path, why)
    return routes


def summarize_routes(model, routes: dict[str, tuple[str, str]]) -> str:
    """'MMQ (mmq-wide-kd4): 49 GEMMs (q4_K 33, q6_K 16); f16: 9 (attn_v: f16 KV-cache output 8,
    ...)' counting each weight once (a tied LM head counts once)."""
    mmq: dict[str, int] = {}
    f16: dict[str, int] = {}
    paths = set()
    for n, (path, why) in routes.items():
        if path == "f16":
            f16[why] = f16.get(why, 0) + 1
        else:
            paths.add(path)
            q = _qname(model.tensor(n).qtype)
            mmq[q] = mmq.get(q, 0) + 1
    nm, nf = sum(mmq.values()), sum(f16.values())
    head = f"MMQ ({', '.join(sorted(paths))})" if paths else "MMQ"
    mm = ", ".join(f"{k} {v}" for k, v in sorted(mmq.items()))
    ff = ", ".join(f"{k} {v}" for k, v in sorted(f16.items(), key=lambda kv: -kv[1]))
    return (f"{head}: {nm} GEMMs" + (f" ({mm})" if mm else "") + f", f16: {nf} GEMMs"
            + (f" ({ff})" if ff else ""))


class CudaBackend:
    """Backend protocol on the GPU. See the module docstring for the dataflow."""

    def __init__(self, model, cfg: GemmConfig | None = None, rt=None, max_tokens: int = 4096,
                 ubatch: int = 2048, warmup: bool = True, progress: bool = False,
                 graphs: bool | None = None):
        from minfer.cuda.runtime import get_runtime

        t0 = time.perf_counter()
        self.model = model
        self.c = c = model.config
        self.gcfg = cfg or GemmConfig.resolve()
        self.rt = rt or get_runtime()
        label = self.gcfg.label()
        self.name = "cuda" if label == "f16" else f"cuda-{label}"
        if c.head_dim not in attn_mod.HEAD_DIMS:
            raise Unsupported(f"cuda backend: head_dim {c.head_dim} not supported "
                              f"(supported: {attn_mod.HEAD_DIMS})")
        if max_tokens > c.n_ctx:
            max_tokens = c.n_ctx
        self.max_tokens = int(max_tokens)
        self.ubatch = int(max(1, min(ubatch, self.max_tokens)))
        self.profile: OpProfile | None = None
        self.n_past = 0
        self.routes = plan_routes(model, self.gcfg, self.rt, self.ubatch)
        if graphs is None:
            graphs = os.environ.get("MINFER_CUDA_GRAPHS", "1") != "0"
        self.graphs = bool(graphs) and not self.rt.cfg.debug
        self._graphs: dict[tuple[int, bool], object] = {}
        self.stream = None  # the capture / replay stream (made at the first capture)
        self.fused = self._plan_fusion()
        self._check_memory()
        self._load_weights(progress)
        self._alloc()
        self.rt.synchronize()
        self.load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if warmup:
            self.forward(np.zeros(1, np.int32), 0)
            self.reset()
        self.rt.synchronize()
        self.warmup_s = time.perf_counter() - t1

    # -- memory plan ------------------------------------------------------------------------
    def _plan(self) -> dict[str, int]:
        c = self.c
        m = self.model
        f16_w = 0
        raw_max = 0
        mmq_w = 0
        q8_k = 0
        for n, (path, _) in self.routes.items():
            t = m.tensor(n)
            if path == "f16":
                f16_w += int(np.prod(t.shape)) * 2
                raw_max = max(raw_max, int(t.data.nbytes))
            else:
                q8_k = max(q8_k, int(t.shape[1]))
                if n != "token_embd.weight":  # a tied LM head shares the embedding's bytes
                    mmq_w += int(t.data.nbytes)
        emb = int(m.tensor("token_embd.weight").data.nbytes)
        kv = 2 * c.n_layers * self.max_tokens * c.n_kv_heads * c.head_dim * 2
        T = self.ubatch
        qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        act = T * (c.d_model * (4 + 2) + qd * (4 + 2 + 2) + kd * 4 * 2 + c.d_ff * (4 + 4 + 2))
        act += c.vocab_size * 4 + (self.max_tokens * c.rope_dim) * 4
        return {"f16 weights": f16_w, "MMQ raw weights": mmq_w, "quantized embedding": emb,
                "KV cache": kv, "activations": act, "q8_1 scratch": T * q8_k // 32 * 40,
                "upload staging": raw_max}

    def _check_memory(self) -> None:
        """GPUError before any allocation when the plan (weights, KV cache for max_tokens,
        activations for ubatch tokens, scratch) does not fit the device's free memory."""
        plan = self._plan()
        need = sum(plan.values())
        free, total = self.rt.mem_info()
        margin = 256 << 20
        if need + margin > free:
            parts = ", ".join(f"{k} {_size(v)}" for k, v in plan.items() if v)
            raise GPUError(f"GPU out of memory for this model: asked {_size(need)} ({parts}) "
                           f"plus {margin >> 20} MiB margin, {_size(free)} free of "
                           f"{_size(total)} (KV cache for {self.max_tokens} tokens, activations "
                           f"for {self.ubatch}: try a shorter prompt, fewer --greedy tokens or "
                           f"a smaller --ubatch)")

    # -- weights ----------------------------------------------------------------------------
    def _plan_fusion(self) -> dict[str, tuple[str, int, int]]:
        """weight name -> (fused group name, first row, rows) for q/k/v and gate/up of a layer
        when every member runs on f16 and they share K (the group's GEMM is one launch)."""
        out: dict[str, tuple[str, int, int]] = {}
        for i in range(self.c.n_layers):
            for group, members in (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
                                   ("ffn_gate_up", ("ffn_gate", "ffn_up"))):
                names = [f"blk.{i}.{n}.weight" for n in members]
                if any(self.routes[n][0] != "f16" for n in names):
                    continue
                shapes = [self.model.tensor(n).shape for n in names]
                if len({k for _, k in shapes}) != 1:
                    continue
                row = 0
                for n, (N, _) in zip(names, shapes):
                    out[n] = (f"blk.{i}.{group}.weight", row, int(N))
                    row += int(N)
        return out

    def _load_weights(self, progress: bool) -> None:
        rt, m, c = self.rt, self.model, self.c
        plan = self._plan()
        self._staging = rt.alloc(max(plan["upload staging"], 1), "weight upload staging")
        self.w: dict[str, object] = {}
        groups: dict[str, list[int]] = {}  # fused name -> [rows, K]
        for n, (g, r0, rows) in self.fused.items():
            K = int(m.tensor(n).shape[1])
            groups.setdefault(g, [0, K])[0] = max(groups.get(g, [0, K])[0], r0 + rows)
        for g, (rows, K) in groups.items():
            self.w[g] = da.empty(rt, (rows, K), np.float16, f"fused f16 weight {g}")
        self.qtypes: dict[str, int] = {}
        emb = m.tensor("token_embd.weight")
        self.emb_qtype = emb.qtype
        self.emb = da.to_device(rt, np.ascontiguousarray(emb.data).view(np.uint8).reshape(-1),
                                "quantized embedding table")
        names = list(self.routes)
        it = names
        if progress:
            from tqdm import tqdm

            it = tqdm(names, desc="upload+dequant", unit="tensor", leave=False)
        for n in it:
            t = m.tensor(n)
            N, K = t.shape
            self.qtypes[n] = t.qtype
            raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
            if self.routes[n][0] != "f16":
                # MMQ: the raw q4_K / q6_K bytes are the weight (no f16 copy); a tied LM head
                # shares the embedding table's bytes
                self.w[n] = (self.emb if n == "token_embd.weight" else
                             da.to_device(rt, raw, f"raw weight {n}"))
                continue
            rt.drv.memcpy_htod(self._staging, raw)
            if n in self.fused:  # a row range of the layer's fused q|k|v or gate|up weight
                g, r0, _ = self.fused[n]
                out = da.rows(self.w[g], r0, N)
            else:
                out = da.empty(rt, (N, K), np.float16, f"f16 weight {n}")
            _dequant_f16(rt, int(self._staging), t.qtype, N, K, out)
            rt.synchronize()  # staging is reused by the next tensor
            self.w[n] = out
        for i in range(c.n_layers):
            for n in ("attn_norm", "ffn_norm"):
                name = f"blk.{i}.{n}.weight"
                self.w[name] = da.to_device(rt, m.dequant(name).reshape(-1).astype(np.float32),
                                            name)
            if c.qkv_bias:
                bs = []
                for n in ("attn_q", "attn_k", "attn_v"):
                    name = f"blk.{i}.{n}.bias"
                    bs.append(m.dequant(name).reshape(-1).astype(np.float32))
                    self.w[name] = da.to_device(rt, bs[-1], name)
                name = f"blk.{i}.attn_qkv.bias"  # for the fused GEMM's output
                self.w[name] = da.to_device(rt, np.concatenate(bs), name)
        self.w["output_norm.weight"] = da.to_device(
            rt, m.dequant("output_norm.weight").reshape(-1).astype(np.float32), "output_norm")
        self._staging.free()
        self._staging = None

    # -- activations / cache -------------------------------------------------------------------
    def _alloc(self) -> None:
        rt, c, T = self.rt, self.c, self.ubatch
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        e = da.empty
        self.x = e(rt, (T, c.d_model), np.float32, "residual x")
        self.h16 = e(rt, (T, c.d_model), np.float16, "normed h")
        # q|k|v f32 outputs: one buffer, [T, Nq + 2 Nkv] when fused, else three [T, N] parts
        self.qkv32 = e(rt, (T * (H + 2 * Hkv) * D,), np.float32, "q|k|v")
        self.q16 = e(rt, (T, H, D), np.float16, "q f16")
        self.a16 = e(rt, (T, H * D), np.float16, "attention out")
        self.gu32 = e(rt, (T * 2 * c.d_ff,), np.float32, "ffn gate|up")
        self.f16 = e(rt, (T, c.d_ff), np.float16, "ffn act")
        self.pos = e(rt, (1,), np.int32, "chunk position pos0")
        self.last16 = e(rt, (1, c.d_model), np.float16, "last row")
        self.logits = e(rt, (1, c.vocab_size), np.float32, "logits")
        self.amax = e(rt, (1,), np.int32, "argmax")
        self.ids = e(rt, (T,), np.int32, "token ids")
        self.kc = [e(rt, (self.max_tokens, Hkv, D), np.float16, f"K cache {i}")
                   for i in range(c.n_layers)]
        self.vc = [e(rt, (self.max_tokens, Hkv, D), np.float16, f"V cache {i}")
                   for i in range(c.n_layers)]
        self.rope = L.RopeTable.build(rt, self.max_tokens, c.rope_base, c.rope_dim)
        q8_bytes = self._plan()["q8_1 scratch"]
        self.q8 = e(rt, (q8_bytes,), np.uint8, "q8_1 activation scratch") if q8_bytes else None

    # -- protocol -------------------------------------------------------------------------------
    def reset(self) -> None:
        self.n_past = 0

    def synchronize(self) -> None:
        self.rt.synchronize()

    @contextmanager
    def _op(self, label: str, flops: float = 0.0):
        if self.profile is None:
            yield
        else:
            with self.profile.op(label, flops):
                yield

    def route_summary(self) -> str:
        """One line: which GEMMs run on MMQ (by type) and which on f16 (and why)."""
        return summarize_routes(self.model, self.routes)

    def _quantize(self, A, *names: str):
        """A f16 [M, K] -> its q8_1 raw view [M, K/32*40] in the shared scratch, once, if any
        of `names` runs on MMQ; else None. The scratch is reused by the next activation (the
        GEMMs that read it are queued before, on the same stream)."""
        if all(self.routes[n][0] == "f16" for n in names):
            return None
        from minfer.cuda.mmq import quantize_q8_1

        M, K = A.shape
        q8 = da.reshape(da.rows(self.q8, 0, M * (K // 32) * 40), (M, K // 32 * 40))
        with self._op("q8_1 prepass"):
            da.poison(self.rt, q8)
            quantize_q8_1(self.rt, A, q8)
        return q8

    def _gemm_fused(self, C, A, name: str, mode: str, label: str) -> None:
        """C = A @ W.T for a fused f16 weight (q|k|v or gate|up of one layer)."""
        M, K = A.shape
        with self._op("gemm:" + label, 2.0 * M * C.shape[1] * K):
            _gemm(self.rt, C, A, self.w[name], mode)

    def _linear(self, C, A, name: str, mode: str, label: str, q8=None) -> None:
        """C (mode 'f32' =, 'f16' =, 'acc' +=) A @ W.T on the weight's route; q8: A quantized
        (from _quantize), required for an MMQ route."""
        M, K = A.shape
        N = C.shape[1]
        path = self.routes[name][0]
        with self._op("gemm:" + label, 2.0 * M * N * K):
            if path == "f16":
                _gemm(self.rt, C, A, self.w[name], mode)
                return
            if mode == "f16":
                raise Unsupported(f"{name}: MMQ writes f32, but this GEMM needs f16 output "
                                  "(plan_routes keeps such weights on f16)")
            if q8 is None:
                q8 = self._quantize(A, name)
            from minfer.cuda.mmq import mmq_linear

            if mode != "acc":
                da.poison(self.rt, C)
            mmq_linear(self.rt, q8, self.w[name], self.qtypes[name], M, N, K, self.gcfg, C,
                       accumulate=mode == "acc")

    def forward(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        """ids int32 [T] at positions pos0..; -> host float32 logits [vocab] of the last one.
        GPUError (never a silent wrong number) when a kernel failed or the logits are not
        finite (NaN poison from a kernel that did not run, or an overflow)."""
        self.forward_device(ids, pos0)
        try:
            out = self.logits.get().reshape(-1).astype(np.float32, copy=False)
        except self.rt.drv.Error as e:  # an earlier kernel failed asynchronously
            raise GPUError(f"GPU error while reading the logits ({e}); rerun with "
                           "MINFER_CUDA_DEBUG=1 to name the kernel that failed") from None
        bad = out.size - int(np.count_nonzero(np.isfinite(out)))
        if bad:
            T = len(np.asarray(ids))
            raise GPUError(f"non-finite logits from the CUDA path ({bad} of {out.size} NaN/inf "
                           f"at positions {pos0}..{pos0 + T - 1}, backend {self.name}); run "
                           "`minfer check` or MINFER_CUDA_DEBUG=1 to find the kernel")
        return out

    def argmax_last(self) -> int:
        """Greedy token of the last forward's logits, computed on the GPU."""
        da.poison(self.rt, self.amax)
        L.argmax(self.rt, self.amax, da.reshape(self.logits, (self.c.vocab_size,)))
        return int(self.amax.get()[0])

    def forward_device(self, ids: np.ndarray, pos0: int) -> None:
        c = self.c
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.shape[0] == 0:
            raise BadInput(f"forward: ids must be a non-empty 1-D array, got shape {ids.shape}")
        T = int(ids.shape[0])
        if pos0 != self.n_past:
            raise BadInput(f"forward: pos0 {pos0} but the KV cache holds {self.n_past} positions")
        if pos0 + T > self.max_tokens:
            raise BadInput(f"forward: {pos0 + T} positions exceed the backend's max_tokens "
                           f"{self.max_tokens}")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise BadInput(f"forward: token id out of range [0, {c.vocab_size})")
        ids = ids.astype(np.int32)
        for s in range(0, T, self.ubatch):
            chunk = ids[s: s + self.ubatch]
            self._forward_chunk(chunk, pos0 + s, last=s + len(chunk) == T)
        self.n_past = pos0 + T

    @staticmethod
    def _part(flat, start: int, shape):
        """View of `flat` (1-D) elements [start, start + prod(shape)) as `shape` (no copy)."""
        n = int(np.prod(shape))
        return da.reshape(da.rows(flat, start, n), shape)

    def _forward_chunk(self, ids: np.ndarray, pos0: int, last: bool) -> None:
        T = len(ids)
        da.rows(self.ids, 0, T).set(ids)
        self.pos.set(np.array([pos0], np.int32))
        if self.graphs and self.profile is None:
            g = self._graphs.get((T, bool(last)))
            if g is not None:
                g.launch(self.stream)
                return
            # first sighting: run eagerly (kernels get built and loaded outside any capture),
            # then record the graph for the next chunk of this shape (recording runs nothing)
            self._chunk_ops(T, pos0, last)
            self._capture(T, pos0, last)
            return
        self._chunk_ops(T, pos0, last)

    def _capture(self, T: int, pos0: int, last: bool):
        """Capture _chunk_ops(T, ...) into a graph (cached by (T, last)); None (graphs turned
        off, one notice) if the driver refuses."""
        from minfer.cuda import graph

        rt = self.rt
        if self.stream is None:
            self.stream = rt.drv.Stream()
        rt.synchronize()  # the capture stream syncs with the legacy one: leave it idle first
        rt.stream = self.stream
        try:
            g = graph.capture(self.stream, lambda: self._chunk_ops(T, pos0, last))
        except Exception as e:  # driver refusal (a real input error re-raises eagerly)
            print(f"cuda backend: CUDA graph capture failed ({e}); running without graphs",
                  file=sys.stderr)
            self.graphs = False
            return None
        finally:
            rt.stream = None
        self._graphs[(T, bool(last))] = g
        return g

    def _chunk_ops(self, ids_T: int, pos0: int, last: bool) -> None:
        """Every launch of one chunk of T tokens (ids and self.pos already on the device).
        pos0 serves the host-side checks only: the kernels read the position from self.pos."""
        rt, c = self.rt, self.c
        T = ids_T
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        qd, kd = H * D, Hkv * D
        R = da.rows
        x = R(self.x, 0, T)
        h16 = R(self.h16, 0, T)
        with self._op("embed"):
            _embed_rows(rt, x, self.emb, self.emb_qtype, R(self.ids, 0, T), c.d_model,
                        c.vocab_size)
        Tu = self.ubatch
        for il in range(c.n_layers):
            p = f"blk.{il}."
            final = last and il == c.n_layers - 1
            with self._op("rmsnorm"):
                da.poison(rt, h16)
                L.rmsnorm(rt, h16, x, self.w[p + "attn_norm.weight"], c.rms_eps)
            if p + "attn_q.weight" in self.fused:
                qkv = self._part(self.qkv32, 0, (T, qd + 2 * kd))
                self._gemm_fused(qkv, h16, p + "attn_qkv.weight", "f32", "attn_qkv")
                if c.qkv_bias:
                    with self._op("bias"):
                        L.add_bias(rt, qkv, self.w[p + "attn_qkv.bias"])
                srcs, cols = (qkv, qkv, qkv), (0, qd, qd + kd)
            else:
                q32 = self._part(self.qkv32, 0, (T, qd))
                k32 = self._part(self.qkv32, Tu * qd, (T, kd))
                v32 = self._part(self.qkv32, Tu * (qd + kd), (T, kd))
                names = [p + n + ".weight" for n in ("attn_q", "attn_k", "attn_v")]
                hq8 = self._quantize(h16, *names)
                for dst, n, lab in zip((q32, k32, v32), names, ("attn_q", "attn_k", "attn_v")):
                    self._linear(dst, h16, n, "f32", lab, hq8)
                if c.qkv_bias:
                    with self._op("bias"):
                        for dst, n in zip((q32, k32, v32), ("attn_q", "attn_k", "attn_v")):
                            L.add_bias(rt, dst, self.w[p + n + ".bias"])
                srcs, cols = (q32, k32, v32), (0, 0, 0)
            with self._op("rope"):
                da.poison(rt, R(self.q16, 0, T))  # (the K/V cache rows: positions on device)
                L.rope_qkv(rt, R(self.q16, 0, T), *srcs, self.kc[il], self.vc[il], self.rope,
                           pos0, self.pos, c.rope_dim, c.rope_neox, cols)
            # from here on the final layer needs the last position only
            t0, Tq = (T - 1, 1) if final else (0, T)
            xq = R(self.x, t0, Tq)
            a16 = R(self.a16, 0, Tq)
            with self._op("attention"):
                da.poison(rt, a16)
                attn_mod.attention(rt, da.reshape(a16, (Tq, H, D)), R(self.q16, t0, Tq),
                                   self.kc[il], self.vc[il], pos0 + t0, self.pos, t0)
            self._linear(xq, a16, p + "attn_output.weight", "acc", "attn_output")
            hq = R(self.h16, 0, Tq)
            with self._op("rmsnorm"):
                da.poison(rt, hq)
                L.rmsnorm(rt, hq, xq, self.w[p + "ffn_norm.weight"], c.rms_eps)
            f16 = R(self.f16, 0, Tq)
            if p + "ffn_gate.weight" in self.fused:
                gu = self._part(self.gu32, 0, (Tq, 2 * c.d_ff))
                self._gemm_fused(gu, hq, p + "ffn_gate_up.weight", "f32", "ffn_gate_up")
                with self._op("swiglu"):
                    da.poison(rt, f16)
                    L.swiglu_fused(rt, f16, gu)
            else:
                g32 = self._part(self.gu32, 0, (Tq, c.d_ff))
                u32 = self._part(self.gu32, Tu * c.d_ff, (Tq, c.d_ff))
                fq8 = self._quantize(hq, p + "ffn_gate.weight", p + "ffn_up.weight")
                self._linear(g32, hq, p + "ffn_gate.weight", "f32", "ffn_gate", fq8)
                self._linear(u32, hq, p + "ffn_up.weight", "f32", "ffn_up", fq8)
                with self._op("swiglu"):
                    da.poison(rt, f16)
                    L.swiglu(rt, f16, g32, u32)
            self._linear(xq, f16, p + "ffn_down.weight", "acc", "ffn_down")
        if last:
            with self._op("rmsnorm"):
                da.poison(rt, self.last16)
                L.rmsnorm(rt, self.last16, R(self.x, T - 1, 1), self.w["output_norm.weight"],
                          c.rms_eps)
            self._linear(self.logits, self.last16, self.model.output_name, "f32", "lm_head")
