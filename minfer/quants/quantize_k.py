"""k-quant quantizers (q4_K, q5_K, q6_K), byte-identical to ggml-quants.c's *_ref functions.

Vectorized over blocks. The weights of the (sub-)blocks are laid out `X: [B, n, G]`: G blocks
side by side, n positions inside a block, so that
  * a C loop `for (i = 0; i < n; ++i) s += f(x[i])` is one numpy reduce over axis 1, which numpy
    runs row after row (sequential float32 adds in C's order; tests/test_quantize.py pins this);
  * per-block values (scale, min, ...) are `[B, 1, G]` and broadcast along a contiguous axis of
    length G (numpy is ~10x slower broadcasting a row vector over a [n, nblocks] array).
The scale searches loop over their few steps (21 for q4_K, 16 for q5_K, 18 for q6_K), each step
updating only the blocks whose error improved, exactly as the C loop does per block.
See minfer/quants/quantize.py for the float32 rules.

These are the numpy twins of the C quantizers in minfer/quants/kquants.c (same bytes, ~10x
slower); quantize() uses the C ones when a C compiler is there, these otherwise.
"""

from __future__ import annotations

import numpy as np

from minfer.quants.rounding import F32, fp16_bytes, fp16_round, nearest_int

_G = 256  # blocks side by side in the [B, n, G] layout


def to_bnG(xb: np.ndarray) -> tuple[np.ndarray, int]:
    """[nblocks, n] -> ([B, n, G] C-contiguous, nblocks); zero blocks pad to a multiple of G."""
    nblk, n = xb.shape
    g = min(_G, max(2, nblk))  # G >= 2: a reduce over a length-1 inner axis would be pairwise
    B = -(-nblk // g)
    if B * g != nblk:
        xb = np.concatenate([xb, np.zeros((B * g - nblk, n), dtype=xb.dtype)])
    return np.ascontiguousarray(xb.reshape(B, g, n).transpose(0, 2, 1)), nblk


def from_bnG(a: np.ndarray, nblk: int) -> np.ndarray:
    """Inverse of to_bnG: [B, n, G] -> [nblocks, n]."""
    B, n, g = a.shape
    return a.transpose(0, 2, 1).reshape(B * g, n)[:nblk]


def bsum(a: np.ndarray) -> np.ndarray:
    """Sequential float32 sum over the n positions of each block: [B, n, G] -> [B, 1, G]."""
    assert a.flags.c_contiguous and a.shape[2] >= 2
    return np.add.reduce(a, axis=1, keepdims=True)


GROUP_MAX_EPS = F32(1e-15)


def _clipped(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """MAX(lo, MIN(hi, nearest_int(v))) as float32 (exact small integers), any v."""
    return np.clip(nearest_int(v), lo, hi).astype(F32)


_NEAREST_SAFE = F32(4.0e6)  # nearest_int == rint for |v| <= 4194303 (2^22 - 1)


def _levels_into(out: np.ndarray, v: np.ndarray, lo: int, hi: int, safe: bool) -> np.ndarray:
    """out = MAX(lo, MIN(hi, nearest_int(v))) in float32; v is consumed (overwritten).

    safe: every |v| is known to be < 2^22, where nearest_int(v) == rint(v) (both round half to
    even), one float op instead of the bit-pattern path.
    """
    if safe:
        np.rint(v, out=v)  # round half to even, as the magic-number add in this range
        np.clip(v, F32(lo), F32(hi), out=out)
    else:
        out[...] = _clipped(v, lo, hi)
    return out


def make_qkx2_quants(
    X: np.ndarray, W: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml make_qkx2_quants with use_mad=false, for all blocks at once.

    X, W: [B, n, G] float32 (see to_bnG). Returns (scale [B, 1, G], the_min [B, 1, G],
    L [B, n, G] float32 levels 0..nmax).

    The levels of the best step are not copied at every step: the step's (iscale, min) pair is
    kept and the levels recomputed once at the end, which gives the same values (same inputs,
    same float ops).
    """
    xmin = X.min(axis=1, keepdims=True)
    xmax = X.max(axis=1, keepdims=True)
    sum_w = bsum(W)
    tmp = W * X
    sum_x = bsum(tmp)
    mn = np.minimum(xmin, F32(0))  # if (min > 0) min = 0
    mn0 = mn
    flat = xmax == mn  # all weights equal: C returns at once with L = 0, scale 0
    fn = F32(nmax)
    La = np.empty_like(X)
    wl = np.empty_like(X)

    def levels(iscale, m):  # La = clip(nearest_int(iscale * (X - m)))
        np.subtract(X, m, out=La)
        # |v| <= |iscale| * max|X - m| (+ rounding); only a degenerate min can reach 2^22
        bound = np.abs(iscale) * np.maximum(np.abs(xmax - m), np.abs(xmin - m))
        safe = bool(np.all(bound[~flat] < _NEAREST_SAFE))
        np.multiply(La, iscale, out=La)
        return _levels_into(La, La, 0, nmax, safe)

    def error(sc, m):  # sum_i w * (sc * La + m - x)^2, in C's order
        np.multiply(La, sc, out=tmp)
        np.add(tmp, m, out=tmp)
        np.subtract(tmp, X, out=tmp)
        np.multiply(tmp, tmp, out=tmp)
        np.multiply(tmp, W, out=tmp)
        return bsum(tmp)

    iscale = fn / (xmax - mn)
    scale = F32(1) / iscale
    best_is, best_m = iscale, mn  # how the kept levels were made
    levels(iscale, mn)
    best = error(scale, mn)
    for step in range(nstep + 1):
        num = F32(rmin) + F32(rdelta) * F32(step) + fn
        iscale = num / (xmax - mn)
        levels(iscale, mn)
        np.multiply(W, La, out=wl)
        sum_l = bsum(wl)
        np.multiply(wl, La, out=tmp)
        sum_l2 = bsum(tmp)
        np.multiply(wl, X, out=tmp)
        sum_xl = bsum(tmp)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        if pos.any():
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        cur = error(this_scale, this_min)
        upd = (D > 0) & (cur < best)
        if upd.any():
            best_is = np.where(upd, iscale, best_is)
            best_m = np.where(upd, mn, best_m)
            best = np.where(upd, cur, best)
            scale = np.where(upd, this_scale, scale)
            mn = np.where(upd, this_min, mn)
    L = levels(best_is, best_m)
    if flat.any():
        np.copyto(L, F32(0), where=flat)
        scale = np.where(flat, F32(0), scale)
        mn = np.where(flat, mn0, mn)
    return scale, -mn, L


def make_qx_quants_rmse1(X: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL), all blocks at once.

    X: [B, n, G] float32. Returns (scale [B, 1, G], L [B, n, G] float32 levels 0..2*nmax-1).
    """
    idx = np.abs(X).argmax(axis=1)[:, None, :]  # first of the largest |x|: `if (ax > amax)`
    mx = np.take_along_axis(X, idx, axis=1)
    zero = np.abs(mx) < GROUP_MAX_EPS
    w = X * X
    wx = w * X

    def levels(iscale):
        return _clipped(iscale * X, -nmax, nmax - 1)

    iscale = F32(-nmax) / mx
    lv = levels(iscale)
    sumlx = bsum(wx * lv)
    suml2 = bsum(w * lv * lv)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    L = lv + F32(nmax)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        lv = levels(iscale)
        sumlx = bsum(wx * lv)
        suml2 = bsum(w * lv * lv)
        upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        if upd.any():
            L = np.where(upd, lv + F32(nmax), L)
            scale = np.where(upd, sumlx / suml2, scale)
            best = np.where(upd, scale * sumlx, best)
    if zero.any():
        L = np.where(zero, F32(0), L)
        scale = np.where(zero, F32(0), scale)
    return scale, L


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins of q4_K/q5_K: ls, lm [nsb, 8] uint8 -> [nsb, 12]."""
    s = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = ls[:, 0:4]
    s[:, 4:8] = lm[:, 0:4]
    s[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    s[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    s[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return s


def _qk_min_type(xb: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared first half of q4_K/q5_K ref: scales, mins, fp16 d/dmin, final levels.

    xb: [nsb, 256]. Returns (d f16 bytes, dmin f16 bytes, packed scales [nsb,12], L [nsb, 256] u8).
    """
    nsb = xb.shape[0]
    X, nblk = to_bnG(xb.reshape(nsb * 8, 32))  # [B, 32, G] sub-blocks of 32
    av_x = np.sqrt(bsum(X * X) / F32(32))
    W = av_x + np.abs(X)
    scales, mins, L = make_qkx2_quants(X, W, nmax, rmin, rdelta, nstep)
    scales = from_bnG(scales, nblk).reshape(nsb, 8)
    mins = from_bnG(mins, nblk).reshape(nsb, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))  # `if (scale > max_scale)` from 0
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    # uint8_t ls = nearest_int(...); ls = MIN(63, ls)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    d16 = max_scale / F32(63)
    dmin16 = max_min / F32(63)
    d = (fp16_round(d16)[:, None] * ls).reshape(nsb * 8, 1)  # [sub-block, 1] float32
    dm = (fp16_round(dmin16)[:, None] * lm).reshape(nsb * 8, 1)
    xs = xb.reshape(nsb * 8, 32)
    L2 = _clipped((xs + dm) / d, 0, nmax)
    L = np.where(d != 0, L2, from_bnG(L, nblk))  # `if (!d) continue;` keeps the search's levels
    L = L.reshape(nsb, 256).astype(np.uint8)
    return fp16_bytes(d16), fp16_bytes(dmin16), _pack_scales_k4(ls, lm), L


def quantize_q4_K(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref. xb: [nsb, 256] f32 -> [nsb, 144] (d, dmin, scales[12], qs[128])."""
    d, dmin, sc, L = _qk_min_type(xb, 15, -1.0, 0.1, 20)
    L = L.reshape(-1, 4, 2, 32)  # [nsb, 64-chunk, half, l]
    qs = (L[:, :, 0, :] | (L[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate([d, dmin, sc, qs], axis=1)


def quantize_q5_K(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q5_K_ref. xb: [nsb, 256] -> [nsb, 176] (d, dmin, scales[12], qh[32], qs[128])."""
    d, dmin, sc, L = _qk_min_type(xb, 31, -0.5, 0.1, 15)
    L = L.reshape(-1, 4, 2, 32)
    hi = (L >> 4) & 1  # [nsb, n/64, half, j]
    shift = (
        2 * np.arange(4, dtype=np.uint8)[:, None, None]
        + np.arange(2, dtype=np.uint8)[None, :, None]
    )
    qh = np.bitwise_or.reduce((hi << shift).reshape(-1, 8, 32), axis=1).astype(np.uint8)
    lo = L & 0xF
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate([d, dmin, sc, qh, ql], axis=1)


def quantize_q6_K(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref. xb: [nsb, 256] -> [nsb, 210] (ql[128], qh[64], scales[16], d)."""
    nsb = xb.shape[0]
    X, nblk = to_bnG(xb.reshape(nsb * 16, 16))  # [B, 16, G] sub-blocks of 16
    scales, L = make_qx_quants_rmse1(X, 32)
    scales = from_bnG(scales, nblk).reshape(nsb, 16)
    L = from_bnG(L, nblk)  # [nsb*16, 16]
    ia = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(nsb), ia]
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = F32(-128) / max_scale
    d16 = F32(1) / iscale
    sc = (np.minimum(nearest_int(iscale[:, None] * scales), 127) & 0xFF).astype(np.uint8)
    d = (fp16_round(d16)[:, None] * sc.view(np.int8)).reshape(nsb * 16, 1)
    L2 = _clipped(xb.reshape(nsb * 16, 16) / d, -32, 31) + F32(32)
    L = np.where(d != 0, L2, L)
    L = L.reshape(nsb, 256).astype(np.uint8)
    Lr = L.reshape(nsb, 2, 4, 32)  # [nsb, 128-chunk, quarter, l]
    lo = Lr & 0xF
    ql = np.concatenate(
        [lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2
    )
    h = Lr >> 4
    qh = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(nsb, 128), qh.reshape(nsb, 64), sc, fp16_bytes(d16)], axis=1)
    if zero.any():
        out[zero] = 0
    return out
