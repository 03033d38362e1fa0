"""The numpy CPU forward (llama.cpp's llm_build_llama graph): the oracle for every GPU path.

Per layer:  h = rmsnorm(x) * attn_norm;  q, k, v = h @ Wq.T, Wk.T, Wv.T (+ bias);
            (qwen3: q, k = rmsnorm per head * attn_q_norm, attn_k_norm);  rope(q, k);
            x += attention(q, K, V) @ Wo.T;  h = rmsnorm(x) * ffn_norm;
            x += (silu(h @ Wg.T) * (h @ Wu.T)) @ Wd.T
then logits = (rmsnorm(x_last) * output_norm) @ W_out.T, for the last position only
(window_logits: for the last T - first positions, the rows perplexity scores). The layer body
is ReferenceBackend._layer, shared by the single-sequence _forward and the packed forward.

Packed (issue 34; the oracle of CudaBackend.packed, the GPU's packed prefill and batched
decode): packed(ids, tok, rows, targets) runs a chunk of many sequences' tokens, each token t
with its KV slot and its sequence's first slot lo (tok[t] = (slot, lo): RoPE position
slot - lo, keys in cache rows lo..slot), every token through every layer, then the LM head and
ops.row_stats only for `rows`. copy_kv shares a computed prefix; reserve_slots sizes the cache
past n_ctx. forward() and packed() share the cache storage (see the KV cache section).

gemma3 (llama.cpp src/models/gemma3.cpp; ModelConfig's gemma fields): x starts as the
embeddings times sqrt(d_model); q, k get the per-head norms, then RoPE with the layer's base
(local layers: rope_base_swa, no freq scaling); q is multiplied by attn_scale and the softmax
is unscaled; local layers attend within the sliding window; the attention output and the FFN
output are each RMS-normalized (post_attention_norm, post_ffw_norm) before their residual add;
the FFN is GeGLU (gelu(h @ Wg.T) * (h @ Wu.T), ggml's tanh GELU); the logits are soft-capped
when the file says so. gemma2 (src/models/gemma2.cpp) is that graph without the q/k norms,
with every other layer local (on the global RoPE unless rope.freq_base_swa says otherwise),
the attention scores soft-capped (ops.attention's softcap: cap * tanh(s / cap) before the
mask) and the logits always soft-capped.

Weights are dequantized once (model.dequant, the gguf package's reference), lazily per tensor,
and cached in `dtype`. The embedding gathers only the rows it needs; the tied LM head needs the
whole table and caches it.

Numerics options (llama.cpp's CPU path, which made the golden files, differs from plain f32):
- kv_f16: llama.cpp's default f16 KV cache. K and V are rounded to f16 when stored and, as in
  ggml's f16 mul_mat (which converts its other operand to f16), q and the softmax
  probabilities are rounded to f16 before their products. Measured on the 3 golden Q4_1
  prompts, max|logit diff| vs llama.cpp with it on / off: 0.786 / 0.787, 0.560 / 0.556,
  0.340 / 0.345 (mean |diff| likewise within 0.002): no measurable preference, because the
  gap is dominated by llama.cpp's q8 activations (below). On by default: llama.cpp's semantics.
- act_quant: ggml's CPU mat-mul quantizes the activation operand to the weight's vec_dot type
  (q8_1 for Q4_1, q8_0 for Q8_0/Q4_0/Q5_0, q8_K for k-quants, f16 for F16). With act_quant the
  activations entering each weight product are rounded to that grid (the scale-sum term of
  q8_1 is not emulated). Measured: this does NOT bring the logits closer to llama.cpp's; the
  forward is chaotic under activation quantization (our f32 and f64 forwards with it differ
  by ~0.5 in the logits), so only a bit-exact replica would. Kept for the MMQ paths' parity.
- grids: weight name -> the grid of the GPU path that runs it (that path's `grid`, declared
  with its numpy twin in minfer.cuda.paths): the weight through grid.weight, the activation entering it through grid.act, exactly the numbers that
  path's kernels compute on. `minfer check` compares each int8 path with a reference whose
  weights on it see its grid, so the gate's tau measures the kernels, not the (intended) grid;
  `minfer perplexity --emulate` measures a grid's distribution gate (minfer.tools.perplexity.emulate).
No grid, no act_quant and dtype=float64 is the oracle mode.

Non-finite values: after the embedding gather, after every layer and for the logits, the hidden
state is checked with np.isfinite (one pass over [T, d_model], negligible beside the layer's
GEMMs) and a NaN/inf raises NumericError (exit 3) naming the first layer whose output went
non-finite and the position and token: an argmax over NaN logits is never decoded. numpy's
overflow warnings are silenced in the forward, since this check reports them as one line.
A MemoryError anywhere in the backend becomes a ResourceError (exit 3, one line); preload()
first compares what it will allocate with the host's headroom (minfer.host.hostmem).
"""

from __future__ import annotations

import numpy as np

from minfer.batch.layout import check_hidden, check_top
from minfer.errors import BadInput, NumericError
from minfer.reference import ops

# dequantized experts kept up to this many bytes in all (else dequantized at each use)
EXPERT_CACHE_BYTES = 1 << 30


def round_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest float16 value (ties to even), kept in x's dtype.

    Equal to x.astype(float16).astype(x.dtype) (tested), but for float32 done with integer
    ops: numpy's f16 cast takes a slow path on the f16-subnormal values softmax probabilities
    are full of (5x slower on a [9, 481, 481] attention, 4 s of a 481-token prefill).
    """
    if x.dtype != np.float32:
        return x.astype(np.float16).astype(x.dtype)
    u = x.view(np.uint32)
    # normal f16 range: round the f32 mantissa to 10 bits, ties to even
    r = (
        (u + (np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))) & np.uint32(0xFFFFE000)
    ).view(np.float32)
    small = np.abs(x) < np.float32(2.0**-14)  # f16 subnormals: a fixed step of 2^-24
    if small.any():
        r[small] = np.rint(x[small] * np.float32(2.0**24)) * np.float32(2.0**-24)
    big = np.abs(r) > np.float32(65504)  # beyond f16's largest finite value
    if big.any():
        r[big] = np.copysign(np.float32(np.inf), x[big])
    return r


def quantize_act(x: np.ndarray, qtype: int) -> np.ndarray:
    """x: [T, K] rounded to the activation grid ggml's CPU mat-mul uses against `qtype` weights."""
    import gguf

    Q = gguf.GGMLQuantizationType
    name = Q(int(qtype)).name
    if name == "F32":
        return x
    if name in ("F16", "BF16"):
        return round_f16(x) if name == "F16" else x
    T, K = x.shape
    x32 = x.astype(np.float32)
    if name.endswith("_K"):  # q8_K (quantize_row_q8_K_ref): blocks of 256, float d, iscale =
        # -127 / max, max the signed value of largest |x| (first one on ties)
        b = x32.reshape(T, K // 256, 256)
        idx = np.argmax(np.abs(b), axis=-1)
        mx = np.take_along_axis(b, idx[..., None], axis=-1)  # [T, nb, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(mx != 0, np.float32(-127.0) / mx, 0).astype(np.float32)
        q = np.minimum(np.rint(iscale * b), 127)
        d = np.where(iscale != 0, np.float32(1.0) / iscale, 0).astype(np.float32)
        return (d * q).reshape(T, K).astype(x.dtype)
    # q8_0 / q8_1 (AVX2 path): blocks of 32, id = 127/amax, q = round-half-even(x*id), d = f16
    b = x32.reshape(T, K // 32, 32)
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        iden = np.where(amax != 0, np.float32(127.0) / amax, 0).astype(np.float32)
    q = np.rint(b * iden)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (d * q).reshape(T, K).astype(x.dtype)


class ReferenceBackend:
    """Backend protocol (minfer.batch.single.Backend) on numpy. forward(ids, pos0) -> logits [vocab];
    window_logits(ids, first) -> logits [T - first, vocab] of a fresh sequence; packed(ids,
    tok, rows, targets) -> [m, 4] row stats of many sequences at once (with copy_kv,
    reserve_slots, kv_slots: minfer.batch's backend protocol)."""

    def __init__(
        self,
        model,
        dtype=np.float32,
        kv_f16: bool = True,
        act_quant: bool = False,
        max_tokens: int | None = None,
        grids: dict | None = None,
    ):
        self.model = model
        self.cfg = model.config
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise BadInput(f"reference backend: dtype must be float32 or float64, not {self.dtype}")
        self.kv_f16 = kv_f16
        self.act_quant = act_quant
        self.grids = dict(grids or {})  # weight name -> its path's grid
        self.name = "cpu" if self.dtype == np.float32 else "cpu-f64"
        self._w: dict[str, np.ndarray] = {}
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self.n_past = 0
        self.layer_hook = None  # called after each layer (the engine's progress bar)
        self.router_log: list | None = None  # MoE: (layer, tie gap [T]) per call when a list
        self._cache_experts = self.cfg.n_expert > 0 and self._experts_cached()
        self.reserve(max_tokens or 0)

    # -- weights --------------------------------------------------------------------------
    def weight(self, name: str) -> np.ndarray:
        w = self._w.get(name)
        if w is None:
            try:
                w = self.model.dequant(name)
                if name in self.grids:  # its path's weight grid (a requantized path's)
                    w = self.grids[name].weight(w, name)
                w = w.astype(self.dtype, copy=False)
            except MemoryError:
                from minfer.host.hostmem import out_of_memory

                raise out_of_memory(f"converting {name} to {self.dtype}") from None
            self._w[name] = w
        return w

    def preload_bytes(self) -> int:
        """Bytes preload() will hold: every weight but the embedding table (gathered by rows)
        in self.dtype, the tied LM head's table included."""
        names = [
            n
            for n in self.model.tensors
            if n != "token_embd.weight"
            and not (n.endswith("_exps.weight") and not self._cache_experts)
        ]
        if self.cfg.tied_embeddings:
            names.append("token_embd.weight")
        sizes = [
            int(np.prod(self.model.tensors[n].shape, dtype=object))
            for n in names
            if n not in self._w
        ]
        # + the dequantization's transient: ~2x its output at the peak (measured with
        # tracemalloc on Q4_1/Q8_0, gguf's numpy dequant), once for the largest tensor
        return (sum(sizes) + 2 * max(sizes, default=0)) * self.dtype.itemsize

    def forward_bytes(self, T: int, S: int) -> int:
        """The forward's peak working set for T new tokens over S cached positions: the
        activations of one layer ([T, width] arrays, a few alive at once) and the attention's
        [H, T, S] scores, probabilities and mask (measured peak ~3x one scores array)."""
        c = self.cfg
        width = 3 * c.d_model + 3 * c.d_ff + (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        # MoE: the k expert outputs [T, k, d], the router [T, e], one expert's weights
        width += c.n_expert_used * c.d_model + c.n_expert + 3 * c.d_ff_shexp
        one = 0 if self._cache_experts else 6 * c.d_model * c.d_ff_exp
        return (
            2 * T * width + one + 4 * c.n_heads * T * S + 2 * c.vocab_size
        ) * self.dtype.itemsize

    def preload(self, progress: bool = False) -> None:
        """Dequantize every weight now (so load time is not billed to the first forward).
        ResourceError first when they cannot fit the host's memory headroom."""
        from minfer.host.hostmem import require

        require(self.preload_bytes(), f"the CPU backend's {self.dtype} weights")
        names = [
            n
            for n in self.model.tensors
            if n != "token_embd.weight" and not n.endswith("_exps.weight")
        ]
        if self.cfg.tied_embeddings:
            names.append("token_embd.weight")
        from minfer.host.progress import bar

        for n in bar(progress, iterable=names, desc="dequantize", unit="tensor") or names:
            self.weight(n)
        for n in (n for n in self.model.tensors if n.endswith("_exps.weight")):
            if self._cache_experts:  # expert by expert (never the whole stack at once)
                for e in range(self.cfg.n_expert):
                    self.expert(n, e)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.act_quant:
            x = quantize_act(x, self.model.tensor(name).qtype)
        if name in self.grids:  # x: [T, K] -> the grid its path's kernels compute on
            x = self.grids[name].act(x, name).astype(self.dtype, copy=False)
        y = x @ self.weight(name).T
        bias = name[: -len(".weight")] + ".bias"
        if bias in self.model.tensors:
            y += self.weight(bias)
        return y

    # -- KV cache -------------------------------------------------------------------------
    # One cache (per layer, [kv_slots, n_kv_heads, head_dim] for K and for V) serves both
    # protocols: forward()/window_logits() keep one sequence in rows 0..n_past-1, packed() and
    # copy_kv() address rows (slots) directly. A packed() call sets n_past to 0 (the single-
    # sequence protocol starts over, as on the GPU); reset() only sets n_past, it clears no rows.
    @property
    def kv_slots(self) -> int:
        """The KV cache's rows now (grows with reserve / reserve_slots, never shrinks)."""
        return int(self._k[0].shape[0]) if self._k else 0

    def reserve(self, n_tokens: int) -> None:
        """Make the KV cache hold n_tokens positions (grows, keeps contents)."""
        c = self.cfg
        if n_tokens > c.n_ctx:
            raise BadInput(f"{n_tokens} tokens exceed the model's context of {c.n_ctx}")
        cap = self.kv_slots
        if n_tokens <= cap and self._k:
            return
        self._grow(min(max(n_tokens, 2 * cap, 16), c.n_ctx))

    def reserve_slots(self, n: int) -> None:
        """Make the KV cache hold n slots (rows) for packed() and copy_kv(): many sequences, so
        n may exceed n_ctx (each sequence's positions stay below it). Grows to exactly n when
        larger than now, keeps contents."""
        n = int(n)
        if n < 0:
            raise BadInput(f"reserve_slots: {n} slots")
        if n > self.kv_slots:
            self._grow(n)

    def _grow(self, new_cap: int) -> None:
        """The caches reallocated with new_cap rows, the old rows copied, the rest zero."""
        c = self.cfg
        cap = self.kv_slots
        shape = (new_cap, c.n_kv_heads, c.head_dim)
        from minfer.host.hostmem import out_of_memory, require

        require(
            2 * c.n_layers * new_cap * c.n_kv_heads * c.head_dim * self.dtype.itemsize,
            f"the CPU backend's KV cache of {new_cap} positions",
        )
        try:
            k_new = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
            v_new = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
        except MemoryError:
            raise out_of_memory(f"allocating the KV cache of {new_cap} positions") from None
        for i in range(len(self._k)):
            k_new[i][:cap] = self._k[i]
            v_new[i][:cap] = self._v[i]
        self._k, self._v = k_new, v_new

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        """KV cache rows (slots) src..src+n-1 copied to dst..dst+n-1 in every layer (a shared
        prefix, computed once, given to another sequence). BadInput for rows outside the cache
        or overlapping ranges (as CudaBackend.copy_kv)."""
        src, dst, n = int(src), int(dst), int(n)
        if n <= 0:
            return
        if min(src, dst) < 0 or max(src, dst) + n > self.kv_slots or abs(src - dst) < n:
            raise BadInput(
                f"copy_kv: rows {src}+{n} -> {dst}+{n} outside the cache's "
                f"{self.kv_slots} rows or overlapping"
            )
        for cache in (*self._k, *self._v):
            cache[dst : dst + n] = cache[src : src + n]

    def reset(self) -> None:
        self.n_past = 0

    def synchronize(self) -> None:
        pass

    # -- forward --------------------------------------------------------------------------
    HEAD_ROWS = 256  # packed(): the LM head's rows per block ([HEAD_ROWS, vocab] f32 at most)

    def forward(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        return self._run(ids, pos0, 1)[0]

    def window_logits(self, ids: np.ndarray, first: int) -> np.ndarray:
        """ids: int32 [T] as a fresh sequence (the KV cache is reset, positions 0..T-1) ->
        float32 logits [T - first, vocab] of positions first..T-1 (perplexity's scored rows)."""
        ids = np.asarray(ids)
        T = int(ids.shape[0]) if ids.ndim == 1 else 0
        if not 0 <= first < T:
            raise BadInput(f"window_logits: first {first} outside [0, {T})")
        self.reset()
        return self._run(ids, 0, T - first)

    def _run(self, ids: np.ndarray, pos0: int, n_out: int) -> np.ndarray:
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
                return self._forward(ids, pos0, n_out)
        except MemoryError:
            from minfer.host.hostmem import out_of_memory

            raise out_of_memory(f"running the CPU forward at position {pos0}") from None

    def _check(
        self,
        x: np.ndarray,
        ids: np.ndarray,
        pos: np.ndarray,
        where: str,
        slots: np.ndarray | None = None,
    ) -> None:
        """NumericError naming `where`, the first row's position (and KV slot, packed) and its
        token, when x [T', d] holds NaN or inf; ids, pos (and slots) [T']: those of x's rows."""
        if np.isfinite(x).all():
            return
        bad = ~np.isfinite(x)
        row = int(np.argmax(bad.any(axis=-1)))
        kind = "NaN" if np.isnan(x[row]).any() else "inf"
        at = f"slot {int(slots[row])}, " if slots is not None else ""
        raise NumericError(
            f"non-finite values ({kind}) in the output of {where} at position "
            f"{int(pos[row])} ({at}token id {int(ids[row])}) on the {self.name} "
            "backend (NaN/inf/huge weights, or hyperparameters out of range)"
        )

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """The residual stream's start [T, d_model]: the embedding rows of ids (gemma: scaled)."""
        c = self.cfg
        x = self.model.dequant("token_embd.weight", rows=ids).astype(self.dtype)
        if c.embed_scale != 1.0:  # gemma: ggml_scale(inpL, sqrtf(n_embd))
            x = x * self.dtype.type(c.embed_scale)
        return x

    def _attn_kw(self, il: int) -> dict:
        """ops.attention's keyword arguments for layer il (f16 P rounding, window, scale,
        gemma2's soft cap)."""
        c = self.cfg
        kw = dict(
            p_round=round_f16 if self.kv_f16 else None,
            window=c.sliding_window if c.is_local(il) else 0,
            scale=c.kq_scale or (1.0 if c.attn_scale else None),
        )  # granite's kq scale
        if c.attn_softcap:
            kw["softcap"] = c.attn_softcap
        return kw

    def _layer(
        self, il: int, x: np.ndarray, pos: np.ndarray, write, attend, keep: slice | None = None
    ) -> np.ndarray:
        """Layer il on the residual x [T, d_model] whose rows sit at RoPE positions pos [T]
        -> the new residual (of the rows `keep`, default all). K and V (after RoPE, f16-rounded
        with kv_f16) go into cache rows `write` (a slice or an int array [T]); then `attend(il,
        q)` with q [T', H, D] (the rows kept) returns the attention output [T', H, D] over the
        cache. Shared by _forward (one sequence) and _packed (runs of many)."""
        c = self.cfg
        ft = self.dtype
        T = x.shape[0]
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        p = f"blk.{il}."
        # olmo2 (no pre_norms): q, k, v read the residual itself
        h = ops.rmsnorm(x, self.weight(p + "attn_norm.weight"), c.rms_eps) if c.pre_norms else x
        q = self._linear(h, p + "attn_q.weight")
        k = self._linear(h, p + "attn_k.weight")
        if c.qk_norm and c.qk_norm_full:  # olmo2: q and k RMS-normalized over the whole
            # projection
            q = ops.rmsnorm(q, self.weight(p + "attn_q_norm.weight"), c.rms_eps)
            k = ops.rmsnorm(k, self.weight(p + "attn_k_norm.weight"), c.rms_eps)
        q, k = q.reshape(T, H, D), k.reshape(T, Hkv, D)
        v = self._linear(h, p + "attn_v.weight").reshape(T, Hkv, D)
        if c.qk_norm and not c.qk_norm_full:  # qwen3, gemma3: each head of q and k
            # RMS-normalized before RoPE
            q = ops.rmsnorm(q, self.weight(p + "attn_q_norm.weight"), c.rms_eps)
            k = ops.rmsnorm(k, self.weight(p + "attn_k_norm.weight"), c.rms_eps)
        if c.has_rope(il):  # smollm3: every 4th layer without RoPE
            base, scaling = c.layer_rope(il)  # gemma's local layers: their own base
            q = ops.rope(q, pos, base, c.rope_dim, c.rope_neox, scaling)
            k = ops.rope(k, pos, base, c.rope_dim, c.rope_neox, scaling)
        if c.attn_scale:  # gemma3: ggml_scale(Qcur, f_attention_scale), kq_scale 1
            q = q * ft.type(c.attn_scale)
        if self.kv_f16:
            k, v, q = round_f16(k), round_f16(v), round_f16(q)
        self._k[il][write] = k
        self._v[il][write] = v
        if keep is not None:
            q, x = q[keep], x[keep]
        a = attend(il, q)
        a = self._linear(a.reshape(a.shape[0], H * D), p + "attn_output.weight")
        if c.post_norms:  # gemma3: post_attention_norm before the residual add
            a = ops.rmsnorm(a, self.weight(p + "post_attention_norm.weight"), c.rms_eps)
        if c.residual_scale != 1.0:  # granite: ggml_scale(cur, f_residual_scale), then the add
            a = a * ft.type(c.residual_scale)
        x = x + a
        h = ops.rmsnorm(x, self.weight(p + "ffn_norm.weight"), c.rms_eps) if c.pre_norms else x
        if c.n_expert:  # qwen3moe, Mixtral: the routed experts (minfer.reference.moe)
            f = self._moe(il, h)
        else:
            g = self._linear(h, p + "ffn_gate.weight")
            u = self._linear(h, p + "ffn_up.weight")
            f = self._linear(
                ops.geglu(g, u) if c.ffn_gelu else ops.swiglu(g, u), p + "ffn_down.weight"
            )
        if c.post_norms:  # gemma3: post_ffw_norm before the residual add
            f = ops.rmsnorm(f, self.weight(p + "post_ffw_norm.weight"), c.rms_eps)
        if c.residual_scale != 1.0:  # granite
            f = f * ft.type(c.residual_scale)
        return x + f

    def _moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """The mixture-of-experts FFN of layer il on h [T, d] -> [T, d]; each token's routing
        tie gap goes to self.router_log (when a list) as (il, gap [T])."""
        from minfer.reference import moe

        p = f"blk.{il}."
        h = self._moe_input(il, h)
        logits = self._linear(h, p + "ffn_gate_inp.weight")  # [T, e]
        sel, w, gap = self._route(il, logits)
        if self.router_log is not None:
            self.router_log.append((il, gap))

        def linear(x, W, name):
            if self.act_quant:
                x = quantize_act(x, self.model.tensor(name).qtype)
            if name in self.grids:  # x -> the grid the experts' kernels compute on (blk)
                x = self.grids[name].act(x, name).astype(self.dtype, copy=False)
            return x @ W.T

        f = moe.moe_ffn(h, sel, w, self.expert, p, linear)
        if self.cfg.d_ff_shexp:  # qwen2moe: + sigmoid(h . g) * the shared expert's SwiGLU
            s = self._linear(
                ops.swiglu(
                    self._linear(h, p + "ffn_gate_shexp.weight"),
                    self._linear(h, p + "ffn_up_shexp.weight"),
                ),
                p + "ffn_down_shexp.weight",
            )
            f = f + moe.shared_gate(h, self.weight(p + "ffn_gate_inp_shexp.weight")) * s
        return f

    def _moe_input(self, il: int, h: np.ndarray) -> np.ndarray:
        """The MoE layer's input as it routes and computes (a subclass may perturb it)."""
        return h

    def _route(self, il: int, logits: np.ndarray):
        """(sel, w, gap) of the router logits [T, e]: minfer.reference.moe.route's rules."""
        from minfer.reference import moe

        c = self.cfg
        return moe.route(logits, c.n_expert_used, c.moe_gating, c.moe_norm_w, c.moe_w_scale)

    def _experts_cached(self) -> bool:
        """Keep dequantized experts (all of them fit EXPERT_CACHE_BYTES in self.dtype)."""
        n = sum(
            int(np.prod(t.shape, dtype=object))
            for name, t in self.model.tensors.items()
            if name.endswith("_exps.weight")
        )
        return n * self.dtype.itemsize <= EXPERT_CACHE_BYTES

    def expert(self, name: str, e: int) -> np.ndarray:
        """Expert e of the stacked weight `name` [e, N, K] -> [N, K] in self.dtype, dequantized
        from its slice of the file alone; kept only while every expert fits the cache bound
        (a 30B-A3B's 29 B expert weights would not: those are dequantized at each use)."""
        key = f"{name}#{e}"
        w = self._w.get(key)
        if w is None:
            w = self.model.dequant(name, rows=e)
            if name in self.grids:  # the experts' path's weight grid (blk: requantized)
                w = self.grids[name].weight(w, name)
            w = w.astype(self.dtype, copy=False)
            if self._cache_experts:
                self._w[key] = w
        return w

    def _head(self, x: np.ndarray) -> np.ndarray:
        """float32 logits [T', vocab] of residual rows x [T', d_model]: the output norm, the
        LM head, gemma's soft cap."""
        c = self.cfg
        h = ops.rmsnorm(x, self.weight("output_norm.weight"), c.rms_eps)
        logits = self._linear(h, self.model.output_name).astype(np.float32)
        if c.logit_mul != 1.0:  # granite: ggml_scale(cur, 1.0f / f_logit_scale)
            logits = logits * np.float32(c.logit_mul)
        if c.logit_softcap:  # gemma: scale by 1/cap, tanh, scale by cap (ggml, in float)
            cap = np.float32(c.logit_softcap)
            t = (logits * (np.float32(1.0) / cap)).astype(np.float64)
            logits = np.tanh(t).astype(np.float32) * cap
        return logits

    def _forward(self, ids: np.ndarray, pos0: int, n_out: int = 1) -> np.ndarray:
        """-> float32 logits [n_out, vocab] of the chunk's last n_out positions."""
        c = self.cfg
        ids = np.asarray(ids)
        T = int(ids.shape[0]) if ids.ndim == 1 else -1
        if T <= 0:
            raise BadInput(f"forward: ids must be a non-empty 1-D array, got shape {ids.shape}")
        if pos0 != self.n_past:
            raise BadInput(f"forward: pos0 {pos0} but the KV cache holds {self.n_past} positions")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise BadInput(f"forward: token id out of range [0, {c.vocab_size})")
        self.reserve(pos0 + T)
        from minfer.host.hostmem import require

        require(self.forward_bytes(T, pos0 + T), f"the CPU forward of {T} tokens")
        pos = np.arange(pos0, pos0 + T)
        x = self._embed(ids)  # [T, d_model]
        self._check(x, ids, pos, "the embedding (token_embd.weight)")

        def attend(il, q):  # the last layer's q: only its last rows
            return ops.attention(
                q, self._k[il], self._v[il], pos0 + T - q.shape[0], **self._attn_kw(il)
            )

        for il in range(c.n_layers):
            # the last layer: only the last n_out rows are needed past its KV write
            keep = slice(T - n_out, T) if il == c.n_layers - 1 else None
            x = self._layer(il, x, pos, slice(pos0, pos0 + T), attend, keep)
            n = x.shape[0]
            self._check(x, ids[T - n :], pos[T - n :], f"layer {il} (blk.{il})")
            if self.layer_hook is not None:
                self.layer_hook()
        self.n_past = pos0 + T
        logits = self._head(x)  # [n_out, vocab]
        self._check(
            logits,
            ids[T - n_out :],
            pos[T - n_out :],
            f"the output layer (output_norm, {self.model.output_name})",
        )
        return logits

    # -- packed: many sequences in one forward --------------------------------------------
    def packed(
        self,
        ids: np.ndarray,
        tok: np.ndarray,
        rows: np.ndarray,
        targets: np.ndarray,
        top: int = 0,
        hidden=None,
    ):
        """One chunk of many sequences' tokens (the oracle of CudaBackend.packed: packed
        prefill and batched decode).

        ids int32 [T]; tok int32 [T, 2] = (slot, lo) per token: token t writes its K and V
        (after RoPE) into cache row slot, sits at RoPE position slot - lo (lo: the first slot of
        its sequence; below n_ctx) and attends to cache rows lo..slot (written by earlier
        tokens of this call, by earlier calls, or by copy_kv). Slots and lo are non-decreasing
        in t; a repeated slot must repeat its token (same id and lo: the decode steps' padding).
        rows int32 [m]: chunk rows (in [0, T), any order, repeats allowed) whose logits are
        wanted; targets int32 [m]: a token id or -1 per row.
        -> float32 [m, 4] per row (ops.row_stats of its logits: output norm, LM head, soft cap):
        (argmax id as float (first index on ties), top1 - top2 logit margin,
        logits[target] - logsumexp (NaN for -1), logsumexp).
        top in 1..ops.TOP_MAX: -> (that, ids int32 [m, top], log-probs f32 [m, top]): each
        row's top largest logits, descending (ops.row_topk), for top log-probs.

        Every token goes through every layer; the linear ops take all T rows at once and the
        attention runs per run of tokens (consecutive slots, one lo); the LM head takes
        HEAD_ROWS rows at a time. The cache must hold the slots (reserve_slots); n_past is not
        read and is set to 0. BadInput for what cannot run, NumericError for NaN/inf (naming
        the layer, position, slot and token), ResourceError for host memory."""
        ids, tok, rows, targets = self._checked_packed(ids, tok, rows, targets)
        top = check_top(top, self.cfg.vocab_size)
        hidden = check_hidden(hidden, ids.shape[0])
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
                return self._packed(ids, tok, rows, targets, top, hidden)
        except MemoryError:
            from minfer.host.hostmem import out_of_memory

            raise out_of_memory(
                f"running the CPU packed forward of {ids.shape[0]} tokens "
                f"(slots {int(tok[0, 0])}..{int(tok[-1, 0])})"
            ) from None

    def _checked_packed(self, ids, tok, rows, targets):
        """packed()'s arguments as int64 arrays, or BadInput naming what cannot run."""
        from minfer.batch.layout import check_packed

        c = self.cfg
        return check_packed(
            ids,
            tok,
            rows,
            targets,
            vocab=c.vocab_size,
            kv_slots=self.kv_slots,
            n_pos=c.n_ctx,
            what_pos=f"the model's context of {c.n_ctx}",
        )

    def _packed(self, ids, tok, rows, targets, top: int = 0, hidden=None):
        c = self.cfg
        T, m = ids.shape[0], rows.shape[0]
        slot, lo = tok[:, 0], tok[:, 1]
        pos = slot - lo
        from minfer.host.hostmem import require

        require(self.forward_bytes(T, int(pos.max()) + 1), f"the CPU packed forward of {T} tokens")

        def attend(il, q):
            return ops.attention_packed(q, self._k[il], self._v[il], tok, **self._attn_kw(il))

        x = self._embed(ids)
        self._check(x, ids, pos, "the embedding (token_embd.weight)", slot)
        for il in range(c.n_layers):
            x = self._layer(il, x, pos, slot, attend)
            self._check(x, ids, pos, f"layer {il} (blk.{il})", slot)
            if self.layer_hook is not None:
                self.layer_hook()
        self.n_past = 0  # the single-sequence protocol starts over after a packed call
        out = np.empty((m, 4), np.float32)
        top_ids, top_lp = np.empty((m, top), np.int32), np.empty((m, top), np.float32)
        for r in range(0, m, self.HEAD_ROWS):
            rr = rows[r : r + self.HEAD_ROWS]
            logits = self._head(x[rr])
            self._check(
                logits,
                ids[rr],
                pos[rr],
                f"the output layer (output_norm, {self.model.output_name})",
                slot[rr],
            )
            st = out[r : r + rr.shape[0]] = ops.row_stats(logits, targets[r : r + rr.shape[0]])
            if top:
                top_ids[r : r + rr.shape[0]], top_lp[r : r + rr.shape[0]] = ops.row_topk(
                    logits, st[:, 3], top
                )
        res = (out, top_ids, top_lp) if top else out
        if hidden is None:
            return res
        h = ops.rmsnorm(x[hidden], self.weight("output_norm.weight"), c.rms_eps)
        self._check(h, ids[hidden], pos[hidden], "the output norm (output_norm)", slot[hidden])
        return res, h.astype(np.float32)
