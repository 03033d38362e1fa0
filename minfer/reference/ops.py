"""numpy twins of the layer kernels: the oracle the CUDA launchers are tested against.

Same signatures as the launchers (arrays instead of device buffers). Each op computes in the
dtype of its inputs: float32 by default, float64 when given float64 (the oracle mode). Where
ggml's CPU op has a particular accumulation that decides the last bits (RMSNorm's double sum,
RoPE's running theta), the float32 path follows it, because the tie-aware greedy gate compares
against llama.cpp's logits.
"""

from __future__ import annotations

import numpy as np

from minfer.batch.layout import TOP_MAX  # the packed call's cap on top-k (row_topk's too)


def _ftype(*arrays: np.ndarray) -> np.dtype:
    """float64 if any input is float64, else float32."""
    return (
        np.dtype(np.float64)
        if any(np.asarray(a).dtype == np.float64 for a in arrays)
        else np.dtype(np.float32)
    )


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis.  x: [T, D], w: [D].

    ggml sums the squares in double, then scales in float (ggml_compute_forward_rms_norm_f32).
    """
    ft = _ftype(x, w)
    x = np.asarray(x, dtype=ft)
    ms = np.einsum("...d,...d->...", x, x, dtype=np.float64) / x.shape[-1]  # [T] double
    scale = (1.0 / np.sqrt(ms + eps)).astype(ft)
    return (x * scale[..., None]) * np.asarray(w, dtype=ft)


def yarn_corr_dims(
    rope_dim: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair range YaRN ramps over, in float like ggml."""
    f32 = np.float32

    def corr(n_rot: float) -> np.float32:
        return f32(
            f32(rope_dim)
            * np.log(f32(n_ctx_orig) / (f32(n_rot) * f32(2.0) * f32(np.pi)))
            / (f32(2.0) * np.log(f32(base)))
        )

    return (
        max(0.0, float(np.floor(corr(beta_fast)))),
        min(float(rope_dim - 1), float(np.ceil(corr(beta_slow)))),
    )


def rope_cos_sin(
    pos: np.ndarray, base: float, rope_dim: int, dtype: np.dtype = np.float32, scaling=None
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of theta[t, i] = pos[t] * base^(-2i/rope_dim), i < rope_dim/2, as scaled by
    `scaling` (minfer.gguf.loader.RopeScaling; None: plain).  -> 2 x [T, rope_dim/2].

    float32: ggml's ggml_rope_cache_init: theta_scale = powf(base, -2/n_dims) and a running
    product theta = p; theta *= theta_scale per pair, all in float, then rope_yarn: the angle
    divided by the pair's freq factor (llama3), scaled by freq_scale (linear, YaRN), YaRN's
    ramp between the two, and cosf/sinf (correctly rounded: cos of the float theta computed in
    double, rounded to float) times mscale (YaRN's attention factor). Plain RoPE takes none of
    these steps, so its values are the unscaled formula's bit for bit. float64: the same
    formula in double.
    """
    pos = np.asarray(pos)
    half = rope_dim // 2
    ft = np.dtype(dtype)
    if ft == np.float64:
        inv = float(base) ** (-2.0 * np.arange(half, dtype=np.float64) / rope_dim)
        theta = pos.astype(np.float64)[:, None] * inv[None, :]
    else:
        ft = np.dtype(np.float32)
        theta_scale = np.float32(np.float32(base) ** np.float32(-2.0 / rope_dim))
        theta = np.empty((pos.shape[0], half), dtype=np.float32)
        th = pos.astype(np.float32)
        for i in range(half):  # the running product, rounded to float at every step like ggml
            theta[:, i] = th
            th = (th * theta_scale).astype(np.float32)
    mscale = None
    if scaling is not None and not scaling.plain:
        theta, mscale = _scaled_theta(theta, base, rope_dim, scaling, ft)
    t64 = theta.astype(np.float64)
    c, s = np.cos(t64).astype(ft), np.sin(t64).astype(ft)
    if mscale is not None and mscale != 1.0:
        c, s = c * ft.type(mscale), s * ft.type(mscale)
    return c, s


def _scaled_theta(theta: np.ndarray, base: float, rope_dim: int, sc, ft: np.dtype):
    """ggml's rope_yarn on theta [T, half] (the extrapolated angle) -> (theta, mscale)."""
    f = ft.type
    if sc.freq_factors is not None:
        theta = (theta / np.asarray(sc.freq_factors, dtype=ft)[None, :]).astype(ft)
    interp = (f(sc.freq_scale) * theta).astype(ft)
    mscale = f(sc.attn_factor)
    if sc.ext_factor == 0.0:
        return interp, mscale
    lo, hi = yarn_corr_dims(rope_dim, sc.n_ctx_orig, base, sc.beta_fast, sc.beta_slow)
    i = np.arange(theta.shape[1], dtype=ft)  # ggml's i0 / 2
    y = (i - f(lo)) / f(max(0.001, hi - lo))
    mix = ((f(1) - np.minimum(f(1), np.maximum(f(0), y))) * f(sc.ext_factor)).astype(ft)
    out = (interp * (f(1) - mix) + theta * mix).astype(ft)
    mscale = f(mscale * (f(1) + f(0.1) * np.log(f(1) / f(sc.freq_scale))))
    return out, mscale


def rope(
    x: np.ndarray, pos: np.ndarray, base: float, rope_dim: int, neox: bool, scaling=None
) -> np.ndarray:
    """Rotary position embedding.  x: [T, H, head_dim], pos: int [T] -> [T, H, head_dim].

    neox=False (llama, ggml "normal" mode): rotate adjacent pairs (x[2i], x[2i+1]) by theta_i.
    neox=True: rotate (x[i], x[i + rope_dim/2]). Dimensions past rope_dim pass through.
    scaling: minfer.gguf.loader.RopeScaling (linear, YaRN, llama3 factors), None for plain RoPE.
    """
    ft = _ftype(x)
    x = np.asarray(x, dtype=ft)
    T, H, D = x.shape
    if rope_dim % 2 or rope_dim > D:
        raise ValueError(f"rope: rope_dim {rope_dim} must be even and <= head_dim {D}")
    if np.asarray(pos).shape != (T,):
        raise ValueError(f"rope: pos has shape {np.asarray(pos).shape}, expected ({T},)")
    cos, sin = rope_cos_sin(pos, base, rope_dim, ft, scaling)
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, rope_dim/2]
    out = x.copy()
    if neox:
        a, b = x[..., : rope_dim // 2], x[..., rope_dim // 2 : rope_dim]
        out[..., : rope_dim // 2] = a * cos - b * sin
        out[..., rope_dim // 2 : rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u, elementwise.  g, u: [T, F]."""
    ft = _ftype(g, u)
    g = np.asarray(g, dtype=ft)
    return silu(g) * np.asarray(u, dtype=ft)


# ggml's tanh GELU (ggml-cpu/vec.h): ggml_gelu_f32, and the f16 table the CPU uses on f32
# input (GGML_GELU_FP16 is defined): x <= -10 -> 0, x >= 10 -> x, else table[f16(x)] (the f16
# rounding of ggml_gelu_f32 at the f16 value of x)
_GELU_COEF_A = np.float32(0.044715)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_TABLE: np.ndarray | None = None


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 in float: 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x))),
    evaluated left to right as C does; tanhf correctly rounded (tanh in double, to float)."""
    f = np.float32
    x = np.asarray(x, dtype=np.float32)
    inner = (_SQRT_2_OVER_PI * x) * (f(1.0) + (_GELU_COEF_A * x) * x)
    t = np.tanh(inner.astype(np.float64)).astype(np.float32)
    return (f(0.5) * x) * (f(1.0) + t)


def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16 as float32 values: index = the f16 bit pattern of x."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        xs = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        with np.errstate(invalid="ignore", over="ignore"):
            _GELU_TABLE = gelu_f32(xs.astype(np.float32)).astype(np.float16).astype(np.float32)
    return _GELU_TABLE


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation. float32: ggml's CPU op bit for bit (its f16 table, see above);
    float64: the formula in double (the oracle mode)."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        c = np.sqrt(2.0 / np.pi)
        return 0.5 * x * (1.0 + np.tanh(c * x * (1.0 + 0.044715 * x * x)))
    x = x.astype(np.float32, copy=False)
    idx = x.astype(np.float16).view(np.uint16)
    y = _gelu_table()[idx]
    y = np.where(x >= np.float32(10.0), x, y)
    return np.where(x <= np.float32(-10.0), np.float32(0.0), y).astype(np.float32)


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """gelu(g) * u, elementwise (ggml_geglu_split: llama.cpp's LLM_FFN_GELU + LLM_FFN_PAR).
    g, u: [T, F]."""
    ft = _ftype(g, u)
    return gelu(np.asarray(g, dtype=ft)) * np.asarray(u, dtype=ft)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """y = x @ W.T (+ b).  x: [T, K], w: [N, K] -> [T, N]."""
    ft = _ftype(x, w)
    y = np.asarray(x, dtype=ft) @ np.asarray(w, dtype=ft).T
    if b is not None:
        y += np.asarray(b, dtype=ft)
    return y


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Row gather.  table: [vocab, D], ids: int [T] -> [T, D]."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError(f"embedding: token id out of range [0, {table.shape[0]})")
    return np.asarray(table)[ids]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    pos0: int,
    *,
    p_round=None,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
) -> np.ndarray:
    """Causal GQA attention, softmax scale 1/sqrt(D) (or `scale`).

    q: [T, Hq, D] at positions pos0..pos0+T-1; k, v: [S, Hkv, D] the cached keys/values of
    positions 0..S-1 (S >= pos0 + T; extra rows are ignored). Query head h reads KV head
    h // (Hq / Hkv). Query t sees keys 0..pos0+t.  -> [T, Hq, D].
    p_round: optional rounding of the softmax probabilities before P @ V (the f16-KV emulation
    of llama.cpp, whose f16 mul_mat converts P to f16).
    window: > 0 for a sliding window: the query at position p also loses the keys j with
    p - j >= window (llama.cpp is_masked_swa, LLAMA_SWA_TYPE_STANDARD), so it sees `window`
    keys at most, itself included.
    scale: the softmax scale; None: 1/sqrt(D); 1.0 skips the multiplication (q pre-scaled).
    softcap: > 0 for attention logit soft-capping (gemma2): the scaled scores become
    softcap * tanh(scores / softcap) before the mask and softmax, as llama.cpp's build_attn
    (ggml_scale by 1/softcap, ggml_tanh, ggml_scale by softcap; the flash-attention kernel
    folds 1/softcap into its scale the same way), tanh correctly rounded in float32.
    """
    ft = _ftype(q, k, v)
    T, Hq, D = q.shape
    S, Hkv, Dk = k.shape
    if v.shape != k.shape or Dk != D:
        raise ValueError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} disagree")
    if Hq % Hkv:
        raise ValueError(f"attention: {Hq} query heads not a multiple of {Hkv} KV heads")
    if S < pos0 + T:
        raise ValueError(f"attention: {S} cached keys < pos0 {pos0} + T {T}")
    S = pos0 + T
    G = Hq // Hkv
    qh = np.asarray(q, dtype=ft).reshape(T, Hkv, G, D).transpose(1, 2, 0, 3)  # [Hkv, G, T, D]
    kh = np.asarray(k[:S], dtype=ft).transpose(1, 0, 2)[:, None]  # [Hkv, 1, S, D]
    vh = np.asarray(v[:S], dtype=ft).transpose(1, 0, 2)[:, None]  # [Hkv, 1, S, D]
    s = qh @ kh.transpose(0, 1, 3, 2)  # [Hkv, G, T, S]
    if scale is None:
        s = s * ft.type(1.0 / np.sqrt(D))
    elif scale != 1.0:
        s = s * ft.type(scale)
    if softcap:
        cap = ft.type(softcap)
        t = s * (ft.type(1.0) / cap)
        s = np.tanh(t.astype(np.float64)).astype(ft) * cap
    qpos = (pos0 + np.arange(T))[:, None]
    mask = np.arange(S)[None, :] > qpos  # [T, S]: key after query
    if window > 0:
        mask |= qpos - np.arange(S)[None, :] >= window  # key out of the sliding window
    s[..., mask] = -np.inf
    pr = softmax(s, axis=-1)
    if p_round is not None:
        pr = p_round(pr)
    o = pr @ vh  # [Hkv, G, T, D]
    return o.transpose(2, 0, 1, 3).reshape(T, Hq, D)


def packed_runs(tok: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The runs of a packed layout tok int [T, 2] of (slot, lo): maximal stretches of
    consecutive slots of one sequence (one lo) -> (first row, end row, lo, position of the
    first row). A decode step's padding (a repeated row) starts a run of its own."""
    slot, lo = tok[:, 0], tok[:, 1]
    brk = np.flatnonzero((lo[1:] != lo[:-1]) | (slot[1:] != slot[:-1] + 1)) + 1
    return [
        (int(s), int(e), int(lo[s]), int(slot[s] - lo[s]))
        for s, e in zip(np.r_[0, brk], np.r_[brk, len(tok)])
    ]


def attention_packed(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, tok: np.ndarray, **kw
) -> np.ndarray:
    """attention() over a packed layout (the twin of the GPU kernels with tok): q [T, Hq, D],
    token t at cache row slot_t = tok[t, 0] of its sequence starting at lo_t = tok[t, 1]
    (RoPE position slot - lo) sees keys k, v [S, Hkv, D] rows lo_t..slot_t. kw: attention's."""
    out = np.empty_like(q)
    for s, e, l0, p0 in packed_runs(tok):
        out[s:e] = attention(q[s:e], k[l0:], v[l0:], p0, **kw)
    return out


def row_stats(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row i of logits f32 [m, V]: (argmax (the first index on ties) as float, top1 - top2
    (the two largest values, a tie counted twice: margin 0; +inf when V == 1), logits[i,
    targets[i]] - logsumexp (NaN when targets[i] < 0 or >= V), logsumexp) -> f32 [m, 4].
    logsumexp and the log-prob in float64, stored as f32; the margin a float32 difference.
    The twin of the CUDA kernel row_stats_f32 (kernels/layers.cu: logsumexp summed in f32)."""
    x = np.asarray(logits, dtype=np.float32)
    t = np.asarray(targets).astype(np.int64)
    if x.ndim != 2 or t.shape != (x.shape[0],):
        raise ValueError(f"row_stats: logits {x.shape}, targets {t.shape} (expected [m, V], [m])")
    m, V = x.shape
    out = np.empty((m, 4), np.float32)
    if m == 0:
        return out
    if V == 0:
        raise ValueError("row_stats: an empty vocabulary")
    r = np.arange(m)
    i1 = np.argmax(x, axis=1)
    v1 = x[r, i1]
    v2 = np.partition(x, V - 2, axis=1)[:, V - 2] if V > 1 else np.full(m, -np.inf, np.float32)
    out[:, 0] = i1
    out[:, 1] = v1 - v2
    ok = (t >= 0) & (t < V)
    for s in range(0, m, 64):  # [64, V] float64 at a time
        xb = x[s : s + 64].astype(np.float64)
        mx = xb.max(axis=1)
        lse = mx + np.log(np.exp(xb - mx[:, None]).sum(axis=1))
        tb, okb = t[s : s + 64], ok[s : s + 64]
        lp = np.full(xb.shape[0], np.nan)
        lp[okb] = xb[np.flatnonzero(okb), tb[okb]] - lse[okb]
        out[s : s + 64, 2] = lp
        out[s : s + 64, 3] = lse
    return out


def row_topk(logits: np.ndarray, lse: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest logits of each row of logits f32 [m, V], in descending order (ties: the
    smaller index first) -> (ids int32 [m, k], log-probs f32 [m, k] = logit - lse), lse f32 [m]
    the rows' logsumexp, or row_stats' f32 [m, 4] (its column 3). The log-prob is one f32
    subtraction (as the kernel's, so the two agree bit for bit). The twin of the CUDA kernel
    row_topk_f32 (kernels/layers.cu). -inf logits rank by index like any tie; a NaN logit is
    never chosen by the kernel, and a row holding one is not compared (its logsumexp is NaN:
    packed() refuses it)."""
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"row_topk: logits {x.shape} (expected [m, V])")
    m, V = x.shape
    lse = np.asarray(lse, dtype=np.float32)
    lse = lse[:, 3] if lse.ndim == 2 and lse.shape[1:] == (4,) else lse
    if lse.shape != (m,):
        raise ValueError(f"row_topk: lse {lse.shape} for {m} rows (expected [m] or [m, 4])")
    if not 1 <= k <= min(TOP_MAX, V):
        raise ValueError(f"row_topk: k {k} outside [1, {min(TOP_MAX, V)}]")
    # a stable sort of -x puts larger values first and, among equal ones, smaller indices first
    part = np.argpartition(-x, k - 1, axis=1)[:, :k] if k < V else np.tile(np.arange(V), (m, 1))
    ids = np.empty((m, k), np.int64)
    for i in range(m):  # the k-th value may tie with values outside the partition: widen
        kth = x[i, part[i]].min()
        cand = np.flatnonzero(x[i] >= kth)
        ids[i] = cand[np.argsort(-x[i, cand], kind="stable")][:k]
    lp = np.take_along_axis(x, ids, axis=1) - lse[:, None]  # f32 - f32: rounded once
    return ids.astype(np.int32), lp.astype(np.float32, copy=False)
