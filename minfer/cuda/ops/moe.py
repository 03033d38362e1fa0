"""Launchers for kernels/moe.cu (the mixture-of-experts FFN's routing, grouping, grouped GEMMs and
weighted scatter-add) and their numpy twins, each twin with its launcher's signature less `rt`
(numpy arrays in, the outputs written in place and returned). The f16 experts' grouped GEMMs are
here; the blk int8 experts': minfer.cuda.paths.blk.moe (the sort run with its 128-row tiles).

Per layer, T tokens, E experts, k used per token, P = T * k (token, slot) pairs, pair p = t k + j:
- `route(rt, sel, wts, logits, k, norm_w, w_scale)`: sel int32 [T, k], wts f32 [T, k] from the
  router logits f32 [T, E] (softmax, top k, renormalized: minfer.reference.moe.route's rules).
- `sort(rt, offs, toff, perm, rowpos, sel, E)`: the tokens grouped by expert: offs / toff int32
  [E + 1] (rows and 64-row tiles per expert, as prefixes), perm int32 [P] (sorted row -> pair),
  rowpos int32 [P] (pair -> sorted row). The device orders an expert's rows as its atomics fall
  (the twin: by pair); every row is computed on its own, so no result depends on that order.
- `grouped_gemm(rt, out, a, w, offs, toff, glu=False, a_rows=None, a_div=1, kernel="mma")`:
  out [P', N] rows offs[e] .. offs[e + 1] = A rows @ w[e].T, w f16 [E, N, K]; A row of sorted
  row r: a_rows[r] // a_div (the gather: a_rows = perm, a_div = k), else r. glu: w [E, 2F, K]
  each expert's gate|up rows interleaved per 16 (8 gate rows, their 8 up rows: quants.glu's
  glu_rows, the dense f16 glu layout), out f16 [P', F] = silu(A gate^T) * (A up^T) (the swiglu
  rounding of swiglu.cuh); else out f32. kernel: "mma" (the dense f16 path's pipelined
  mma.sync tile, 64 x 128) or "wmma" (a simple 64 x 64 wmma kernel: the control).
- `combine(rt, x, ys, wts, rowpos)`: x f32 [T, D] += sum_j wts[t, j] * ys[rowpos[t k + j]] in
  rank order (as ggml adds the weighted views), each op rounded alone (the twin is bit-exact).
- `shared_add(rt, x, y, gl)`: qwen2moe's shared expert, x f32 [T, D] += sigmoid(gl[t]) *
  y[t] (gl f32 [T, 1]: the gate GEMM's logits; y f32 [T, D]: the shared SwiGLU's output).
Launchers validate shapes and dtypes (GPUError, one line) and never choose anything; the grid of
the grouped GEMM is its worst case (ceil(P / 64) + min(E, P) row tiles; the tiles past toff[E]
exit at once), so one launch serves any routing and a CUDA graph replays it.
"""

from __future__ import annotations

import numpy as np

from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

KERNEL = "moe"  # kernels/moe.cu
MAX_EXPERTS = 512  # moe.cu's MOE_MAX_E (llama.cpp's LLAMA_MAX_EXPERTS)
BM, BN = 64, 64  # the grouped GEMMs' row tile (moe.cu GBM: the sort's too), wmma's column tile
MMA_BN, MMA_SMEM = 128, 4 * (64 + 128) * 32 * 2  # the mma kernel's column tile, shared bytes
KERNELS = ("mma", "wmma")  # grouped_gemm's kernels (plan.config.moe_kernel picks the forward's)
W_SUM_MIN = np.float32(6.103515625e-5)


def max_row_tiles(P: int, E: int, bm: int = BM) -> int:
    """Row tiles of bm rows that P rows over E experts can need at most: each expert's last
    tile may be partial, and at most min(E, P) experts have rows."""
    return -(-P // bm) + min(E, P)


def _i32(name, a, shape):
    da.check(name, a, shape, np.int32, require_contiguous=True)


# ---- routing ------------------------------------------------------------------------------------
def _route_checks(sel, wts, logits, k: int) -> tuple[int, int]:
    T, E = (int(s) for s in logits.shape)
    if not 1 <= E <= MAX_EXPERTS:
        raise GPUError(f"moe route: {E} experts, the kernel takes 1..{MAX_EXPERTS}")
    if not 1 <= k <= E:
        raise GPUError(f"moe route: k={k} experts per token of {E}")
    return T, E


def route(rt, sel, wts, logits, k: int, norm_w: bool = True, w_scale: float = 0.0):
    """sel int32 [T, k], wts f32 [T, k] = the top k experts of each row of logits f32 [T, E]
    (module docstring)."""
    da.check("moe route logits", logits, (None, None), np.float32, require_contiguous=True)
    T, E = _route_checks(sel, wts, logits, k)
    _i32("moe route sel", sel, (T, k))
    da.check("moe route wts", wts, (T, k), np.float32, require_contiguous=True)
    rt.launch(
        rt.function(KERNEL, "moe_route_f32"),
        (-(-T // 4),),
        (128,),
        (
            da.arg(sel),
            da.arg(wts),
            da.arg(logits),
            np.int32(T),
            np.int32(E),
            np.int32(k),
            np.int32(bool(norm_w)),
            np.float32(w_scale),
        ),
    )


def route_ref(sel, wts, logits, k: int, norm_w: bool = True, w_scale: float = 0.0):
    """Numpy twin of route: minfer.reference.moe.route on f32 logits (the CPU reference's
    routing itself) -> (sel, wts), written into the given arrays."""
    from minfer.reference.moe import route as ref_route

    logits = np.asarray(logits, np.float32)
    _route_checks(sel, wts, logits, k)
    s, w, _ = ref_route(logits, k, "softmax", norm_w, w_scale)
    sel[...] = s
    wts[...] = w.astype(np.float32)
    return sel, wts


# ---- grouping -----------------------------------------------------------------------------------
def sort(rt, offs, toff, perm, rowpos, sel, E: int, bm: int = BM):
    """offs, toff int32 [E + 1], perm, rowpos int32 [P] from sel int32 [P] (module docstring)."""
    P = int(sel.size)
    if not 1 <= E <= MAX_EXPERTS:
        raise GPUError(f"moe sort: {E} experts, the kernel takes 1..{MAX_EXPERTS}")
    _i32("moe sort sel", sel, None)
    for n, a, s in (("offs", offs, E + 1), ("toff", toff, E + 1), ("perm", perm, P)):
        _i32(f"moe sort {n}", a, (s,))
    _i32("moe sort rowpos", rowpos, (P,))
    rt.launch(
        rt.function(KERNEL, "moe_sort"),
        (1,),
        (1024,),
        (
            da.arg(offs),
            da.arg(toff),
            da.arg(perm),
            da.arg(rowpos),
            da.arg(sel),
            np.int32(P),
            np.int32(E),
            np.int32(bm),
        ),
    )


def sort_ref(offs, toff, perm, rowpos, sel, E: int, bm: int = BM):
    """Numpy twin of sort, the rows of an expert in pair order (a stable sort by expert)."""
    s = np.asarray(sel).reshape(-1).astype(np.int64)
    if s.size and (s.min() < 0 or s.max() >= E):
        raise GPUError(f"moe sort: expert ids outside [0, {E})")
    cnt = np.bincount(s, minlength=E)
    offs[0] = toff[0] = 0
    offs[1:] = np.cumsum(cnt)
    toff[1:] = np.cumsum(-(-cnt // bm))
    order = np.argsort(s, kind="stable")
    perm[...] = order
    rowpos[order] = np.arange(s.size)
    return offs, toff, perm, rowpos


# ---- grouped GEMM -------------------------------------------------------------------------------
def _gemm_checks(out, a, w, offs, toff, glu, a_rows, a_div, kernel) -> tuple[int, int, int, int]:
    if kernel not in KERNELS:
        raise GPUError(f"moe grouped gemm: kernel {kernel!r}, expected one of {KERNELS}")
    if len(w.shape) != 3:
        raise GPUError(f"moe grouped gemm: w must be [E, N, K], got shape {tuple(w.shape)}")
    E, N, K = (int(s) for s in w.shape)
    if len(a.shape) != 2 or int(a.shape[1]) != K:
        raise GPUError(f"moe grouped gemm: A {tuple(a.shape)} does not match w {tuple(w.shape)}")
    if K % 8:
        raise GPUError(f"moe grouped gemm: K={K} must be a multiple of 8 (16-byte rows)")
    if glu and N % 16:
        raise GPUError(f"moe grouped gemm: glu needs 2F % 16 == 0 (interleaved), got {N} rows")
    No = N // 2 if glu else N
    if len(out.shape) != 2 or int(out.shape[1]) != No:
        raise GPUError(f"moe grouped gemm: out {tuple(out.shape)}, expected [P, {No}]")
    if a_div < 1:
        raise GPUError(f"moe grouped gemm: a_div {a_div} < 1")
    if not 1 <= E <= MAX_EXPERTS:
        raise GPUError(f"moe grouped gemm: {E} experts, the kernel takes 1..{MAX_EXPERTS}")
    return E, N, K, int(out.shape[0])


def grouped_gemm(
    rt, out, a, w, offs, toff, glu: bool = False, a_rows=None, a_div: int = 1, kernel="mma"
):
    """out [P, N] f32 (glu: [P, F] f16, the swiglu) = expert e's rows of A @ w[e].T (module
    docstring). out has at least offs[E] rows (the caller's P), a_rows int32 [P] when given."""
    E, N, K, P = _gemm_checks(out, a, w, offs, toff, glu, a_rows, a_div, kernel)
    for n, x in (("A", a), ("w", w), ("out", out)):
        da.check(f"moe grouped gemm {n}", x, align=16, require_contiguous=True)
    for n, x in (("A", a), ("w", w)):
        if np.dtype(x.dtype) != np.float16:
            raise GPUError(f"moe grouped gemm {n}: dtype {x.dtype}, expected float16")
    want = np.float16 if glu else np.float32
    if np.dtype(out.dtype) != want:
        raise GPUError(f"moe grouped gemm out: dtype {out.dtype}, expected {np.dtype(want)}")
    _i32("moe grouped gemm offs", offs, (E + 1,))
    _i32("moe grouped gemm toff", toff, (E + 1,))
    if a_rows is not None:
        _i32("moe grouped gemm a_rows", a_rows, (P,))
    tiles = max_row_tiles(P, E)
    if tiles > 65535:
        raise GPUError(f"moe grouped gemm: {tiles} row tiles past the grid's 65,535")
    null = np.uintp(0)
    rows = (null if a_rows is None else da.arg(a_rows), np.int32(a_div))
    tail = (da.arg(offs), da.arg(toff), np.int32(E))
    if kernel == "mma":
        rt.launch(
            rt.function(KERNEL, "moe_mma_f16_glu" if glu else "moe_mma_f16", dyn_smem=MMA_SMEM),
            (-(-N // MMA_BN), tiles),
            (128,),
            (da.arg(out), da.arg(a), *rows, da.arg(w), *tail, np.int32(N), np.int32(K)),
            smem=MMA_SMEM,
        )
        return
    No = N // 2 if glu else N  # the wmma kernel takes the output width
    rt.launch(
        rt.function(KERNEL, "moe_gemm_f16_glu" if glu else "moe_gemm_f16"),
        (-(-No // BN), tiles),
        (128,),
        (
            null if glu else da.arg(out),
            da.arg(out) if glu else null,
            da.arg(a),
            *rows,
            da.arg(w),
            *tail,
            np.int32(No),
            np.int32(K),
        ),
    )


def grouped_gemm_ref(
    out, a, w, offs, toff, glu: bool = False, a_rows=None, a_div: int = 1, kernel="mma"
):
    """Numpy twin of grouped_gemm (f32 products of the f16 operands; glu: the swiglu of
    minfer.reference.ops on the interleaved gate|up rows, rounded to f16; kernel: either, the
    same numbers). Rows past offs[E] are left as they are."""
    from minfer.reference.ops import swiglu

    E, N, K, P = _gemm_checks(out, a, w, offs, toff, glu, a_rows, a_div, kernel)
    for e in range(E):
        r0, r1 = int(offs[e]), int(offs[e + 1])
        if r1 <= r0:
            continue
        src = np.arange(r0, r1) if a_rows is None else np.asarray(a_rows[r0:r1]) // a_div
        x = np.asarray(a)[src].astype(np.float32)
        c = x @ np.asarray(w[e]).astype(np.float32).T
        if glu:
            c = c.reshape(r1 - r0, N // 16, 2, 8)  # per 16 columns: 8 gate, their 8 up
            out[r0:r1] = swiglu(c[:, :, 0], c[:, :, 1]).reshape(r1 - r0, N // 2).astype(np.float16)
        else:
            out[r0:r1] = c
    return out


def interleave_glu(wg, wu):
    """Numpy: gate and up stacks [E, F, K] -> [E, 2F, K], each expert's rows interleaved per 16
    (8 gate rows, then the same 8 features' up rows): what MoeLayers uploads. F % 8 == 0."""
    E, F, K = wg.shape
    if F % 8 or wu.shape != wg.shape:
        raise GPUError(f"moe interleave: gate {wg.shape} / up {wu.shape} (F % 8 == 0)")
    return np.stack([wg.reshape(E, F // 8, 8, K), wu.reshape(E, F // 8, 8, K)], 2).reshape(
        E, 2 * F, K
    )


# ---- weighted scatter-add -----------------------------------------------------------------------
def _combine_checks(x, ys, wts, rowpos) -> tuple[int, int, int]:
    T, D = (int(s) for s in x.shape)
    if len(wts.shape) != 2 or int(wts.shape[0]) != T:
        raise GPUError(f"moe combine: wts {tuple(wts.shape)}, expected [{T}, k]")
    k = int(wts.shape[1])
    if len(ys.shape) != 2 or int(ys.shape[1]) != D or int(ys.shape[0]) < T * k:
        raise GPUError(f"moe combine: ys {tuple(ys.shape)}, expected [>= {T * k}, {D}]")
    if tuple(rowpos.shape) != (T * k,):
        raise GPUError(f"moe combine: rowpos {tuple(rowpos.shape)}, expected ({T * k},)")
    return T, D, k


def combine(rt, x, ys, wts, rowpos):
    """x f32 [T, D] += sum_j wts[t, j] * ys[rowpos[t k + j]] (module docstring)."""
    T, D, k = _combine_checks(x, ys, wts, rowpos)
    da.check("moe combine x", x, None, np.float32, require_contiguous=True)
    da.check("moe combine ys", ys, None, np.float32, require_contiguous=True)
    da.check("moe combine wts", wts, None, np.float32, require_contiguous=True)
    _i32("moe combine rowpos", rowpos, (T * k,))
    rt.launch(
        rt.function(KERNEL, "moe_combine_f32"),
        (T,),
        (256,),
        (da.arg(x), da.arg(ys), da.arg(wts), da.arg(rowpos), np.int32(k), np.int32(D)),
    )


def combine_ref(x, ys, wts, rowpos):
    """Numpy twin of combine (f32, each product and sum rounded alone, rank order)."""
    T, D, k = _combine_checks(x, ys, wts, rowpos)
    rp = np.asarray(rowpos).reshape(T, k)
    s = None
    for j in range(k):
        v = np.asarray(wts[:, j : j + 1], np.float32) * np.asarray(ys, np.float32)[rp[:, j]]
        s = v if s is None else s + v
    x[...] = np.asarray(x, np.float32) + s
    return x


def moe_ffn_ref(h16, wr, wg, wu, wd, k: int, norm_w: bool = True, w_scale: float = 0.0):
    """The whole device FFN as the twins compose it: h16 f16 [T, d] (the normed activations),
    wr f16 [E, d] (router), wg / wu f16 [E, fe, d], wd f16 [E, d, fe] -> f32 [T, d] (what
    the layer adds to the residual), and the routing (sel, wts)."""
    T, d = h16.shape
    E = wr.shape[0]
    logits = h16.astype(np.float32) @ wr.astype(np.float32).T
    sel = np.empty((T, k), np.int32)
    wts = np.empty((T, k), np.float32)
    route_ref(sel, wts, logits, k, norm_w, w_scale)
    P = T * k
    offs, toff = np.empty(E + 1, np.int32), np.empty(E + 1, np.int32)
    perm, rowpos = np.empty(P, np.int32), np.empty(P, np.int32)
    sort_ref(offs, toff, perm, rowpos, sel, E)
    act = np.zeros((P, wg.shape[1]), np.float16)
    grouped_gemm_ref(act, h16, interleave_glu(wg, wu), offs, toff, True, perm, k)
    ys = np.zeros((P, d), np.float32)
    grouped_gemm_ref(ys, act, wd, offs, toff)
    out = np.zeros((T, d), np.float32)
    combine_ref(out, ys, wts, rowpos)
    return out, sel, wts


# ---- qwen2moe's sigmoid-gated shared expert ------------------------------------------------------
def _shared_checks(x, y, gl) -> tuple[int, int]:
    T, D = (int(s) for s in x.shape)
    if tuple(y.shape) != (T, D):
        raise GPUError(f"moe shared_add: y {tuple(y.shape)}, expected [{T}, {D}]")
    if tuple(gl.shape) not in ((T,), (T, 1)):
        raise GPUError(f"moe shared_add: gl {tuple(gl.shape)}, expected [{T}, 1]")
    return T, D


def shared_add(rt, x, y, gl):
    """x f32 [T, D] += sigmoid(gl[t]) * y[t] (module docstring)."""
    T, D = _shared_checks(x, y, gl)
    for n, a in (("x", x), ("y", y), ("gl", gl)):
        da.check(f"moe shared_add {n}", a, None, np.float32, require_contiguous=True)
    rt.launch(
        rt.function(KERNEL, "moe_shared_add_f32"),
        (T,),
        (256,),
        (da.arg(x), da.arg(y), da.arg(gl), np.int32(D)),
    )


def shared_add_ref(x, y, gl):
    """Numpy twin of shared_add (f32; the kernel's expf within its ulps of numpy's exp)."""
    T, D = _shared_checks(x, y, gl)
    one = np.float32(1)
    g = np.asarray(gl, np.float32).reshape(T, 1)
    s = one / (one + np.exp(-g))
    x[...] = np.asarray(x, np.float32) + s * np.asarray(y, np.float32)
    return x
