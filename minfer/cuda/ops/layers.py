"""Launchers for kernels/layers.cu: rmsnorm (and of gathered rows), head_rmsnorm (qwen3's q/k
norms), rope, rope_qkv (fused rope + KV append), swiglu, add, f32->f16 copy, argmax, row_stats
(greedy ids and log-probs of logits rows), row_topk (their k most likely ids and log-probs).

Each launcher validates shapes/dtypes (GPUError with a one-line message) and launches through
`rt.launch`. Numpy twins: minfer.reference.ops (rmsnorm, rope, swiglu); the tests in
tests/gpu/test_layers.py call these launchers and compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

_F = "layers"


@dataclass
class RopeTable:
    """cos/sin f32 [n_pos, rope_dim/2] on the device, angles by the reference's formula."""

    cos: object
    sin: object
    n_pos: int
    rope_dim: int
    base: float

    @classmethod
    def build(cls, rt, n_pos: int, base: float, rope_dim: int, scaling=None) -> "RopeTable":
        """scaling: minfer.gguf.loader.RopeScaling (linear, YaRN, llama3 factors, mscale): all of it
        lives in the table, so every kernel that reads it (rope, rope_qkv, the fused GEMM
        epilogue) applies it."""
        from minfer.reference.ops import rope_cos_sin

        c, s = rope_cos_sin(np.arange(n_pos), base, rope_dim, np.float32, scaling)
        return cls(
            da.to_device(rt, c.astype(np.float32), "rope cos table"),
            da.to_device(rt, s.astype(np.float32), "rope sin table"),
            n_pos,
            rope_dim,
            base,
        )

    @classmethod
    def identity(cls, rt, n_pos: int, rope_dim: int) -> "RopeTable":
        """cos 1, sin 0: a rotation that leaves q and k as they are (a layer without RoPE,
        smollm3's every 4th: a*1 - b*0 is a exactly), for the kernels that read a table."""
        c = np.ones((n_pos, rope_dim // 2), np.float32)
        return cls(
            da.to_device(rt, c, "no-rope cos table"),
            da.to_device(rt, np.zeros_like(c), "no-rope sin table"),
            n_pos,
            rope_dim,
            0.0,
        )


def local_rope(c):
    """(base, scaling) of the local layers where it differs from the global layers' (gemma's
    rope.freq_base_swa), else None: then one RoPE table serves every layer."""
    ropes = {c.layer_rope(il) for il in range(c.n_layers)} - {(c.rope_base, c.rope_scaling)}
    if len(ropes) > 1:
        raise ValueError(f"more than two RoPE tables: {sorted(ropes, key=str)}")
    return next(iter(ropes)) if ropes else None


def rmsnorm(rt, y, x, w, eps: float) -> None:
    """y[T, D] (f16 or f32) = rmsnorm(x f32 [T, D]) * w f32 [D]."""
    da.check("rmsnorm x", x, (None, None), np.float32)
    T, D = x.shape
    da.check("rmsnorm w", w, (D,), np.float32)
    da.check("rmsnorm y", y, (T, D), (np.float16, np.float32))
    entry = "rmsnorm_f32_f16" if y.dtype == np.float16 else "rmsnorm_f32_f32"
    fn = rt.function(_F, entry)
    rt.launch(
        fn,
        (T,),
        (256,),
        (da.arg(y), np.int32(D), da.arg(x), np.int32(D), da.arg(w), np.int32(D), np.float32(eps)),
    )


def rmsnorm_rows(rt, y, x, rows, w, eps: float) -> None:
    """y f16 or f32 [m, D] row i = rmsnorm(x f32 [T, D] row rows[i]) * w (rows: int32 [m]
    device array, values in [0, T): the caller's; f32: pooled jobs' hidden states). Numpy
    twin: ops.rmsnorm(x[rows], w)."""
    da.check("rmsnorm x", x, (None, None), np.float32)
    T, D = x.shape
    da.check("rmsnorm w", w, (D,), np.float32)
    da.check("rmsnorm y", y, (None, D), (np.float16, np.float32))
    m = int(y.shape[0])
    da.check("rmsnorm rows", rows, (m,), np.int32)
    entry = "rmsnorm_rows_f32_f16" if y.dtype == np.float16 else "rmsnorm_rows_f32_f32"
    rt.launch(
        rt.function(_F, entry),
        (m,),
        (256,),
        (
            da.arg(y),
            np.int32(D),
            da.arg(x),
            np.int32(D),
            da.arg(rows),
            da.arg(w),
            np.int32(D),
            np.float32(eps),
        ),
    )


def row_stats(rt, stats, logits, targets) -> None:
    """stats f32 [m, 4] = per row of logits f32 [m, V]: (argmax (first on ties), top1 - top2,
    logits[targets[i]] - logsumexp (NaN where targets[i] < 0), logsumexp); targets int32 [m].
    Numpy twin: minfer.reference.ops.row_stats."""
    da.check("row_stats logits", logits, (None, None), np.float32)
    m, V = logits.shape
    if V >= 1 << 24:
        raise GPUError(f"row_stats: vocabulary {V} past 2^24 (the argmax is stored as f32)")
    da.check("row_stats targets", targets, (m,), np.int32)
    da.check("row_stats out", stats, (m, 4), np.float32)
    rt.launch(
        rt.function(_F, "row_stats_f32"),
        (m,),
        (1024,),
        (da.arg(stats), da.arg(logits), da.arg(targets), np.int32(V)),
    )


TOPK_THREADS = 512  # kernels/layers.cu row_topk_f32's block (its __launch_bounds__)


def topk_entry(k: int) -> str:
    """The row_topk kernel for k: a thread's list as short as k allows (1, 4 or 20 entries)."""
    return "row_topk1_f32" if k == 1 else "row_topk4_f32" if k <= 4 else "row_topk_f32"


def row_topk(rt, ids, lp, logits, lse, k: int) -> None:
    """ids int32 [m, k], lp f32 [m, k] = each row of logits f32 [m, V]'s k largest logits, in
    descending order (ties: the smaller index first), and their logit - logsumexp (one f32
    subtraction); lse: f32 [m] logsumexps, or row_stats' f32 [m, 4] output (its column 3).
    1 <= k <= min(ops.TOP_MAX, V). Numpy twin: minfer.reference.ops.row_topk."""
    from minfer.reference.ops import TOP_MAX

    da.check("row_topk logits", logits, (None, None), np.float32, require_contiguous=True)
    m, V = (int(s) for s in logits.shape)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= min(TOP_MAX, V):
        raise GPUError(
            f"row_topk: k {k!r} outside [1, {min(TOP_MAX, V)}] (TOP_MAX {TOP_MAX}, vocabulary {V})"
        )
    if V >= 2**31 - 1:  # every index below the kernel's empty slot, INT_MAX
        raise GPUError(f"row_topk: vocabulary {V} past int32 ids")
    da.check("row_topk lse", lse, None, np.float32, require_contiguous=True)
    if tuple(lse.shape) == (m,):
        lse_ptr, lds = da.ptr(lse), 1
    elif tuple(lse.shape) == (m, 4):  # row_stats' rows: the logsumexp is column 3
        lse_ptr, lds = da.ptr(lse) + 3 * 4, 4
    else:
        raise GPUError(f"row_topk lse: shape {tuple(lse.shape)}, expected ({m},) or ({m}, 4)")
    da.check("row_topk ids", ids, (m, k), np.int32, require_contiguous=True)
    da.check("row_topk lp", lp, (m, k), np.float32, require_contiguous=True)
    if m == 0:
        return
    rt.launch(
        rt.function(_F, topk_entry(k)),
        (m,),
        (TOPK_THREADS,),
        (
            da.arg(ids),
            da.arg(lp),
            da.arg(logits),
            np.uintp(lse_ptr),
            np.int32(lds),
            np.int32(V),
            np.int32(k),
        ),
    )


def _rope_check(x, table: RopeTable, pos0: int | None, rope_dim: int):
    """(T, H, D) of x; GPUError for a rope_dim the table or x cannot take, or positions pos0 ..
    pos0 + T - 1 outside the table (pos0 None: the positions come from a device layout, which
    its caller keeps inside the table)."""
    T, H, D = x.shape
    if rope_dim % 2 or rope_dim > D or D % 2:
        raise GPUError(f"rope: rope_dim {rope_dim} must be even and <= head_dim {D} (even)")
    if rope_dim != table.rope_dim:
        raise GPUError(f"rope: table built for rope_dim {table.rope_dim}, asked {rope_dim}")
    if pos0 is not None and (pos0 < 0 or pos0 + T > table.n_pos):
        raise GPUError(
            f"rope: positions [{pos0}, {pos0 + T}) outside the table's {table.n_pos} positions"
        )
    return T, H, D


def rope(rt, x, table: RopeTable, pos0: int, rope_dim: int, neox: bool) -> None:
    """In place on x [T, H, D] (f32 or f16) at positions pos0..pos0+T-1."""
    da.check("rope x", x, (None, None, None), (np.float32, np.float16))
    T, H, D = _rope_check(x, table, pos0, rope_dim)
    entry = "rope_f32" if x.dtype == np.float32 else "rope_f16"
    fn = rt.function(_F, entry)
    npair = H * D // 2
    rt.launch(
        fn,
        (T, (npair + 127) // 128),
        (128,),
        (
            da.arg(x),
            np.int64(H * D),
            np.int32(H),
            np.int32(D),
            np.int32(rope_dim),
            np.int32(bool(neox)),
            da.arg(table.cos),
            da.arg(table.sin),
            np.int32(pos0),
        ),
    )


def rope_to_f16(rt, dst, src, table: RopeTable, pos0: int, rope_dim: int, neox: bool) -> None:
    """dst f16 [T, H, D] = rope(src f32 [T, H, D]); dst may be a view into the KV cache."""
    da.check("rope src", src, (None, None, None), np.float32)
    T, H, D = _rope_check(src, table, pos0, rope_dim)
    da.check("rope dst", dst, (T, H, D), np.float16)
    fn = rt.function(_F, "rope_f32_f16")
    npair = H * D // 2
    rt.launch(
        fn,
        (T, (npair + 127) // 128),
        (128,),
        (
            da.arg(dst),
            np.int64(H * D),
            da.arg(src),
            np.int64(H * D),
            np.int32(H),
            np.int32(D),
            np.int32(rope_dim),
            np.int32(bool(neox)),
            da.arg(table.cos),
            da.arg(table.sin),
            np.int32(pos0),
        ),
    )


def _cols(name: str, a, start: int, n: int):
    """(pointer, row stride) of columns [start, start + n) of a 2-D f32 device array."""
    da.check(name, a, (None, None), np.float32, align=8)
    if start < 0 or start + n > a.shape[1]:
        raise GPUError(f"{name}: columns [{start}, {start + n}) outside its {a.shape[1]}")
    return np.uintp(da.ptr(a) + 4 * start), int(a.shape[1])


def head_rmsnorm(rt, x, col: int, H: int, D: int, w, eps: float) -> None:
    """In place: columns [col, col + H*D) of x f32 [T, *] as [T, H, D], each head's D values
    rmsnorm'd and scaled by w f32 [D] (qwen3's q/k norms, before RoPE). Numpy twin:
    reference ops.rmsnorm over the last axis of [T, H, D]."""
    if D > 65536 or D % 2:  # (olmo2 norms all heads as one: H 1, D = heads x head_dim)
        raise GPUError(f"head_rmsnorm: head_dim {D} must be even and <= 65536")
    xp, ld = _cols("head_rmsnorm x", x, col, H * D)
    da.check("head_rmsnorm w", w, (D,), np.float32)
    T = int(x.shape[0])
    rt.launch(
        rt.function(_F, "head_rmsnorm_f32"),
        (T, H),
        (128,),
        (xp, np.int64(ld), np.int32(D), da.arg(w), np.float32(eps)),
    )


def tok_layout(pos0: int, T: int) -> np.ndarray:
    """int32 [T, 2] (slot, lo) of one sequence's tokens pos0..pos0+T-1: the layout every
    kernel that places a token reads (rope_qkv, the rope epilogue, attention); a packed batch
    gives each token its own slot and its sequence's first slot lo (position slot - lo)."""
    out = np.zeros((T, 2), np.int32)
    out[:, 0] = np.arange(pos0, pos0 + T)
    return out


def rope_qkv(
    rt,
    q16,
    q,
    k,
    v,
    kc,
    vc,
    table: RopeTable,
    hi: int,
    tok,
    rope_dim: int,
    neox: bool,
    cols=(0, 0, 0),
    wide: bool | None = None,
    norm: "QkNorm | None" = None,
) -> None:
    """One launch: q16 f16 [T, Hq, D] = rope(q); kc[slot_t] = rope(k); vc[slot_t] = v, at
    position slot_t - lo_t. norm: q and k RMS-normalized first (QkNorm: qwen3's and gemma3's
    each head, olmo2's whole row): in the same launch (rope_qkv_norm_f32_f16_v4, head_rmsnorm
    then rope_qkv's bits; q and k left as they were) where D % 8 == 0, the rows are 16-byte
    aligned and per-head norms have at most 256 heads; else head_rmsnorm on q and k in place,
    then the rope.

    q, k, v: f32 2-D device arrays whose columns cols[i] .. cols[i] + H*D hold the [T, H*D]
    part (three buffers, or the same fused [T, (Hq + 2 Hkv) D] GEMM output three times);
    kc, vc: f16 [S, Hkv, D] caches. tok: int32 [T, 2] device array of (slot, lo) per token
    (tok_layout), read by the kernel (a captured graph serves any layout); hi: one past its
    largest slot, known to the host, for the bounds check (the caller keeps slot - lo inside
    the table). Numpy twin: reference ops.rope + f16 casts.
    wide: the two-pairs-per-thread kernel (bit-identical); None picks it where the shapes and
    alignment allow (tests force either).
    """
    da.check("rope_qkv q16", q16, (None, None, None), np.float16)
    T, Hq, D = q16.shape
    da.check("rope_qkv k cache", kc, (None, None, D), np.float16)
    S, Hkv, _ = kc.shape
    da.check("rope_qkv v cache", vc, (S, Hkv, D), np.float16)
    da.check("rope_qkv tok", tok, (T, 2), np.int32, align=8)
    qp, ldq = _cols("rope_qkv q", q, cols[0], Hq * D)
    kp, ldk = _cols("rope_qkv k", k, cols[1], Hkv * D)
    vp, ldv = _cols("rope_qkv v", v, cols[2], Hkv * D)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.shape[0] != T:
            raise GPUError(f"rope_qkv {name}: {a.shape[0]} rows, expected T = {T}")
    if ldv % 2 or cols[2] % 2:
        raise GPUError("rope_qkv v: row stride and column offset must be even (float2 loads)")
    if not 0 < hi <= S:
        raise GPUError(f"rope_qkv: the layout's slots (below {hi}) exceed the cache's {S} rows")
    _rope_check(q16, table, None, rope_dim)  # (packed: T may pass the context, not positions)
    # two pairs per thread (16-byte loads) where every row start is 16-byte aligned
    can_wide = (
        D % 4 == 0
        and rope_dim % 4 == 0
        and all(int(p) % 16 == 0 and ld % 4 == 0 for p, ld in ((qp, ldq), (kp, ldk), (vp, ldv)))
    )
    if wide and not can_wide:
        raise GPUError(
            "rope_qkv: the wide kernel needs D and rope_dim multiples of 4 and "
            "16-byte aligned q/k/v rows"
        )
    wide = can_wide if wide is None else wide
    args = (
        da.arg(q16),
        qp,
        np.int64(ldq),
        kp,
        np.int64(ldk),
        vp,
        np.int64(ldv),
        da.arg(kc),
        da.arg(vc),
        np.int32(Hq),
        np.int32(Hkv),
        np.int32(D),
        np.int32(rope_dim),
        np.int32(bool(neox)),
        da.arg(table.cos),
        da.arg(table.sin),
        da.arg(tok),
    )
    if norm is not None:
        wn = (Hq * D, Hkv * D) if norm.full else (D, D)
        da.check("rope_qkv norm wq", norm.wq, (wn[0],), np.float32, align=16)
        da.check("rope_qkv norm wk", norm.wk, (wn[1],), np.float32, align=16)
        if wide and D % 8 == 0 and (norm.full or Hq + Hkv <= ROPE_NORM_HEADS):
            rt.launch(
                rt.function(_F, "rope_qkv_norm_f32_f16_v4"),
                (T,),
                (128,),
                args
                + (da.arg(norm.wq), da.arg(norm.wk), np.float32(norm.eps), np.int32(norm.full)),
            )
            return
        for a, col, H, w in ((q, cols[0], Hq, norm.wq), (k, cols[1], Hkv, norm.wk)):
            h, d = (1, H * D) if norm.full else (H, D)
            head_rmsnorm(rt, a, col, h, d, w, norm.eps)
    fn = rt.function(_F, "rope_qkv_f32_f16_v4" if wide else "rope_qkv_f32_f16")
    nthreads = (Hq + 2 * Hkv) * D // (4 if wide else 2)
    rt.launch(fn, (T, (nthreads + 127) // 128), (128,), args)


ROPE_NORM_HEADS = 256  # kernels/layers.cu: rope_qkv_norm's per-head scales in shared memory


@dataclass(frozen=True)
class QkNorm:
    """rope_qkv's q/k norms: the weights f32 (full: [Hq D] and [Hkv D], all heads as one row,
    olmo2's; else [D] each, every head normed alone) and rms epsilon."""

    wq: object
    wk: object
    eps: float
    full: bool = False


# kernels/rope.cuh RopeQkv: gemm mode 4's target (its static_assert pins these offsets)
ROPE_QKV_DTYPE = np.dtype(
    [
        ("q16", "<u8"),
        ("kc", "<u8"),
        ("vc", "<u8"),
        ("cos", "<u8"),
        ("sin", "<u8"),
        ("tok", "<u8"),
        ("qd", "<i4"),
        ("kd", "<i4"),
        ("D", "<i4"),
        ("half_r", "<i4"),
    ]
)


class QkvRope:
    """The fused qkv GEMM's rope epilogue target (gemm_f16_nt(..., rope=...), mode 4): what
    rope_qkv does to the GEMM's f32 [T, (Hq + 2 Hkv) D] output, done by the GEMM's epilogue on
    its accumulators: q16 f16 [T, Hq, D] = rope(q), kc[pos0 + t] = rope(k), vc[pos0 + t] = v,
    bit for bit as rope_qkv. Non-neox (adjacent pairs) only: a pair must sit in one thread's
    accumulators. Packed once into a 64-byte device struct (ROPE_QKV_DTYPE), per layer (its
    caches); the layout is read from tok (int32 [T, 2] (slot, lo) per row) on the device, as
    rope_qkv reads it."""

    def __init__(self, rt, q16, kc, vc, table: RopeTable, tok, rope_dim: int, neox: bool):
        da.check("qkv rope q16", q16, (None, None, None), np.float16)
        self.T, Hq, D = q16.shape
        da.check("qkv rope k cache", kc, (None, None, D), np.float16)
        self.S, Hkv, _ = kc.shape
        da.check("qkv rope v cache", vc, (self.S, Hkv, D), np.float16)
        da.check("qkv rope tok", tok, (self.T, 2), np.int32, align=8)
        if neox:
            raise GPUError(
                "qkv rope epilogue: neox rope pairs (i, i + rope_dim/2) span threads; use rope_qkv"
            )
        _rope_check(q16, table, None, rope_dim)  # (packed: T may pass the context, not positions)
        if D < 8:
            raise GPUError(f"qkv rope epilogue: head_dim {D} < 8 (a fragment steps 8 columns)")
        self.qd, self.kd, self.n_pos = Hq * D, Hkv * D, table.n_pos
        rec = np.zeros((), ROPE_QKV_DTYPE)
        for f, a in (
            ("q16", q16),
            ("kc", kc),
            ("vc", vc),
            ("cos", table.cos),
            ("sin", table.sin),
            ("tok", tok),
        ):
            rec[f] = da.ptr(a)
        rec["qd"], rec["kd"], rec["D"], rec["half_r"] = self.qd, self.kd, D, rope_dim // 2
        self.dev = da.to_device(rt, np.frombuffer(rec.tobytes(), np.uint8), "qkv rope target")
        self._keep = (q16, kc, vc, table, tok)  # the struct points into them

    def check(self, M: int, N: int, hi: int) -> None:
        """A GEMM of M rows, N columns whose tokens' slots are below hi fits (the caller keeps
        each slot - lo inside the table)."""
        if N != self.qd + 2 * self.kd:
            raise GPUError(
                f"qkv rope epilogue: the GEMM has {N} columns, expected q + k + v = "
                f"{self.qd + 2 * self.kd}"
            )
        if M > self.T:
            raise GPUError(f"qkv rope epilogue: {M} rows, q16 holds {self.T}")
        if not 0 < hi <= self.S:
            raise GPUError(
                f"qkv rope epilogue: the layout's slots (below {hi}) exceed the "
                f"cache's {self.S} rows"
            )


def gate_up_shape(y, gu, per: int, op: str = "swiglu") -> tuple[int, int]:
    """(T, F) of a glu layer's f32 gate|up input gu [T, 2F] (2F % per == 0) and f16 output y
    (op: the layer's name in the errors)."""
    da.check(f"{op} gu", gu, (None, None), np.float32)
    T, F2 = gu.shape
    if F2 % per:
        raise GPUError(f"{op} gu: {F2} columns, expected 2F with 2F % {per} == 0")
    da.check(f"{op} y", y, (T, F2 // 2), np.float16)
    return T, F2 // 2


def swiglu_fused(rt, y, gu) -> None:
    """y f16 [T, F] = silu(gu[:, :F]) * gu[:, F:], gu f32 [T, 2F] (the fused gate|up GEMM)."""
    T, F = gate_up_shape(y, gu, 2)
    _swiglu_launch(rt, y, da.ptr(gu), da.ptr(gu) + 4 * F, 2 * F, T, F)


def interleaved_rows(y, gu, op: str = "swiglu") -> tuple[int, int, int, int, int]:
    """(g, u, ldg, T, F) of a glu layer's plain launch over gu f32 [T, 2F], the output of a
    gate|up weight whose rows are interleaved per 16 (quants.glu.glu_rows: 8 gate columns, then
    the same features' 8 up), into y f16 [T, F]: the glu GEMM epilogue's function where a GEMM
    wrote f32 (the M == 1 GEMV). T 2F / 16 rows of 8 features: gate at column 0, up at 8, row
    stride 16 (op: the layer's name in the errors)."""
    T, F = gate_up_shape(y, gu, 16, op)
    return da.ptr(gu), da.ptr(gu) + 4 * 8, 16, T * F // 8, 8


def swiglu_interleaved(rt, y, gu) -> None:
    """y f16 [T, F] = silu(gate) * up from an interleaved gate|up output (interleaved_rows)."""
    _swiglu_launch(rt, y, *interleaved_rows(y, gu))


def _swiglu_launch(rt, y, g: int, u: int, ldg: int, T: int, F: int) -> None:
    """The 4-wide kernel when every row start is 16-byte (f32) / 8-byte (f16) aligned."""
    if F % 4 == 0 and ldg % 4 == 0 and g % 16 == 0 and u % 16 == 0 and da.ptr(y) % 8 == 0:
        fn, per = rt.function(_F, "swiglu_f32_f16_v4"), 4 * 256
    else:
        fn, per = rt.function(_F, "swiglu_f32_f16"), 256
    rt.launch(
        fn,
        ((F + per - 1) // per, T),
        (256,),
        (da.arg(y), np.int64(F), np.uintp(g), np.uintp(u), np.int64(ldg), np.int32(F)),
    )


def swiglu(rt, y, g, u) -> None:
    """y f16 [T, F] = silu(g) * u, g/u f32 [T, F]."""
    da.check("swiglu g", g, (None, None), np.float32)
    T, F = g.shape
    da.check("swiglu u", u, (T, F), np.float32)
    da.check("swiglu y", y, (T, F), np.float16)
    _swiglu_launch(rt, y, da.ptr(g), da.ptr(u), F, T, F)


def add(rt, y, x) -> None:
    """y += x (f32, same shape)."""
    da.check("add y", y, None, np.float32)
    da.check("add x", x, tuple(y.shape), np.float32)
    fn = rt.function(_F, "add_f32")
    n = int(y.size)
    rt.launch(fn, ((n + 255) // 256,), (256,), (da.arg(y), da.arg(x), np.int64(n)))


def copy_rows(rt, bufs, src: int, dst: int, n: int) -> None:
    """In every buffer whose device address bufs (u64 [B] on the device) holds: bytes
    src..src+n-1 copied to dst..dst+n-1 (multiples of 16, not overlapping), one launch for
    what B memcpy calls did (each a driver call that drops and retakes the GIL). Twin: a
    slice assignment per buffer (ReferenceBackend.copy_kv)."""
    da.check("copy_rows bufs", bufs, None, np.uint64)
    if min(src, dst, n) < 0 or (src | dst | n) % 16 or abs(src - dst) < n:
        raise GPUError(f"copy_rows: bytes {src}+{n} -> {dst}+{n}: not 16-aligned or overlapping")
    if n == 0:
        return
    fn = rt.function(_F, "copy_rows_u128")
    grid = (min(-(-n // (16 * 256)), 1024), int(bufs.shape[0]))
    rt.launch(fn, grid, (256,), (da.arg(bufs), np.int64(src), np.int64(dst), np.int64(n)))


def to_f16(rt, dst, src) -> None:
    """dst f16 [T, ...] = src f32 [T, ...] (same shape); the KV-cache append of V."""
    da.check("to_f16 src", src, None, np.float32)
    da.check("to_f16 dst", dst, tuple(src.shape), np.float16)
    T = int(src.shape[0])
    W = int(src.size // max(T, 1))
    fn = rt.function(_F, "cvt_f32_f16")
    rt.launch(
        fn,
        ((W + 255) // 256, T),
        (256,),
        (da.arg(dst), np.int64(W), da.arg(src), np.int64(W), np.int32(W)),
    )


def argmax(rt, out, x) -> None:
    """out int32 [1] = first index of the max of x f32 [n]."""
    da.check("argmax x", x, None, np.float32)
    da.check("argmax out", out, (1,), np.int32)
    fn = rt.function(_F, "argmax_f32")
    rt.launch(fn, (1,), (1024,), (da.arg(out), da.arg(x), np.int32(x.size)))


def add_bias(rt, y, b) -> None:
    """y f32 [T, N] += b f32 [N] (the qkv bias of qwen2-style models)."""
    da.check("bias y", y, (None, None), np.float32)
    T, N = y.shape
    da.check("bias b", b, (N,), np.float32)
    fn = rt.function(_F, "add_bias_f32")
    rt.launch(fn, ((N + 255) // 256, T), (256,), (da.arg(y), da.arg(b), np.int32(N)))
