"""k-quant quantizers (q4_K, q5_K, q6_K), byte-identical to ggml-quants.c's *_ref functions.

Vectorized over blocks: every per-block quantity is an array over blocks, weights inside a block
are stored position-major (`X: [n, nblocks]`) so the sequential C sums become n vector adds
(`seqsum`). The scale searches loop over their few steps (21 for q4_K, 16 for q5_K, 18 for q6_K),
each step updating only the blocks whose error improved, exactly as the C loop does per block.
See minfer/quants/quantize.py for the float32 rules.
"""

from __future__ import annotations

import numpy as np

from minfer.quants.quantize import F32, fp16_bytes, fp16_round, nearest_int, seqsum

GROUP_MAX_EPS = F32(1e-15)


def _clipped(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """MAX(lo, MIN(hi, nearest_int(v))) as float32 (exact small integers)."""
    return np.clip(nearest_int(v), lo, hi).astype(F32)


def make_qkx2_quants(X: np.ndarray, W: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml make_qkx2_quants with use_mad=false, for all blocks at once.

    X, W: [n, nb] float32 (weights, position-major). Returns (scale [nb], the_min [nb],
    L [n, nb] float32 levels 0..nmax).
    """
    xmin = X.min(axis=0)
    xmax = X.max(axis=0)
    sum_w = seqsum(W)
    sum_x = seqsum(W * X)
    mn = np.minimum(xmin, F32(0))  # if (min > 0) min = 0
    mn0 = mn
    flat = xmax == mn  # all weights equal: C returns at once with L = 0, scale 0
    iscale = F32(nmax) / (xmax - mn)
    scale = F32(1) / iscale
    L = _clipped(iscale * (X - mn), 0, nmax)
    diff = scale * L + mn - X
    best = seqsum(W * (diff * diff))
    fn = F32(nmax)
    for step in range(nstep + 1):
        num = F32(rmin) + F32(rdelta) * F32(step) + fn
        iscale = num / (xmax - mn)
        La = _clipped(iscale * (X - mn), 0, nmax)
        wl = W * La
        sum_l = seqsum(wl)
        sum_l2 = seqsum(wl * La)
        sum_xl = seqsum(wl * X)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        if pos.any():
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        diff = this_scale * La + this_min - X
        cur = seqsum(W * (diff * diff))
        upd = (D > 0) & (cur < best)
        if upd.any():
            L = np.where(upd, La, L)
            best = np.where(upd, cur, best)
            scale = np.where(upd, this_scale, scale)
            mn = np.where(upd, this_min, mn)
    if flat.any():
        L = np.where(flat, F32(0), L)
        scale = np.where(flat, F32(0), scale)
        mn = np.where(flat, mn0, mn)
    return scale, -mn, L


def make_qx_quants_rmse1(X: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL), all blocks at once.

    X: [n, nb] float32. Returns (scale [nb], L [n, nb] float32 levels 0..2*nmax-1).
    """
    nb = X.shape[1]
    idx = np.abs(X).argmax(axis=0)  # first of the largest |x|, as `if (ax > amax)`
    mx = X[idx, np.arange(nb)]
    zero = np.abs(mx) < GROUP_MAX_EPS
    w = X * X
    wx = w * X

    def levels(iscale):
        return _clipped(iscale * X, -nmax, nmax - 1)

    iscale = F32(-nmax) / mx
    lv = levels(iscale)
    sumlx = seqsum(wx * lv)
    suml2 = seqsum(w * lv * lv)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    L = lv + F32(nmax)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        lv = levels(iscale)
        sumlx = seqsum(wx * lv)
        suml2 = seqsum(w * lv * lv)
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
    X = np.ascontiguousarray(xb.reshape(nsb * 8, 32).T)  # [32, nsb*8], position-major
    av_x = np.sqrt(seqsum(X * X) / F32(32))
    W = av_x + np.abs(X)
    scales, mins, L = make_qkx2_quants(X, W, nmax, rmin, rdelta, nstep)
    scales = scales.reshape(nsb, 8)
    mins = mins.reshape(nsb, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))  # `if (scale > max_scale)` from 0
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    # uint8_t ls = nearest_int(...); ls = MIN(63, ls)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    d16 = max_scale / F32(63)
    dmin16 = max_min / F32(63)
    d = fp16_round(d16)[:, None] * ls  # [nsb, 8] float32
    dm = fp16_round(dmin16)[:, None] * lm
    d = d.reshape(1, nsb * 8)
    dm = dm.reshape(1, nsb * 8)
    L2 = _clipped((X + dm) / d, 0, nmax)
    L = np.where(d != 0, L2, L)  # `if (!d) continue;` keeps the search's levels
    L = L.T.reshape(nsb, 256).astype(np.uint8)
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
    shift = (2 * np.arange(4, dtype=np.uint8)[:, None, None] + np.arange(2, dtype=np.uint8)[None, :, None])
    qh = np.bitwise_or.reduce((hi << shift).reshape(-1, 8, 32), axis=1).astype(np.uint8)
    lo = L & 0xF
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate([d, dmin, sc, qh, ql], axis=1)


def quantize_q6_K(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref. xb: [nsb, 256] -> [nsb, 210] (ql[128], qh[64], scales[16], d)."""
    nsb = xb.shape[0]
    X = np.ascontiguousarray(xb.reshape(nsb * 16, 16).T)  # [16, nsb*16]
    scales, L = make_qx_quants_rmse1(X, 32)
    scales = scales.reshape(nsb, 16)
    ia = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(nsb), ia]
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = F32(-128) / max_scale
    d16 = F32(1) / iscale
    sc = (np.minimum(nearest_int(iscale[:, None] * scales), 127) & 0xFF).astype(np.uint8)
    d = (fp16_round(d16)[:, None] * sc.view(np.int8)).reshape(1, nsb * 16)
    L2 = _clipped(X / d, -32, 31) + F32(32)
    L = np.where(d != 0, L2, L)
    L = L.T.reshape(nsb, 256).astype(np.uint8)
    Lr = L.reshape(nsb, 2, 4, 32)  # [nsb, 128-chunk, quarter, l]
    lo = Lr & 0xF
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    h = Lr >> 4
    qh = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(nsb, 128), qh.reshape(nsb, 64), sc, fp16_bytes(d16)], axis=1)
    if zero.any():
        out[zero] = 0
    return out
