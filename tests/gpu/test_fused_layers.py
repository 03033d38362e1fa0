"""Fused kernels of the CUDA backend vs numpy twins: rope_qkv (rope of q and k + KV-cache
append at the device-side token layout), swiglu over the fused gate|up output, attention with the position
read from the device. Ragged shapes, NaN-poisoned outputs, cache rows outside the chunk checked
untouched."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err as _rel

from minfer.reference import ops

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "T,Hq,Hkv,D,rope_dim,neox,pos0",
    [
        (1, 4, 2, 64, 64, False, 0),
        (7, 9, 3, 64, 32, True, 5),
        (33, 8, 2, 128, 128, False, 20),
        (130, 32, 8, 128, 128, True, 61),
        (5, 4, 2, 64, 30, False, 3),
        (6, 4, 2, 64, 30, True, 2),
    ],
)
def test_rope_qkv(rt, fused, T, Hq, Hkv, D, rope_dim, neox, pos0):
    from minfer.cuda.ops.layers import RopeTable, rope_qkv
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T * 3 + Hq + int(fused))
    qd, kd = Hq * D, Hkv * D
    S = pos0 + T + 11
    base = 500000.0 if neox else 10000.0
    table = RopeTable.build(rt, S, base, rope_dim)
    q = rng.standard_normal((T, qd)).astype(np.float32)
    k = rng.standard_normal((T, kd)).astype(np.float32)
    v = rng.standard_normal((T, kd)).astype(np.float32)
    kc0 = rng.standard_normal((S, Hkv, D)).astype(np.float16)  # rows outside the chunk: kept
    vc0 = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    kc0[pos0 : pos0 + T] = np.nan
    vc0[pos0 : pos0 + T] = np.nan
    kc, vc = da.to_device(rt, kc0), da.to_device(rt, vc0)
    q16 = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    from minfer.cuda.ops.layers import tok_layout

    pos, hi = da.to_device(rt, tok_layout(pos0, T)), pos0 + T
    if fused:
        qkv = da.to_device(rt, np.concatenate([q, k, v], axis=1))
        rope_qkv(rt, q16, qkv, qkv, qkv, kc, vc, table, hi, pos, rope_dim, neox, (0, qd, qd + kd))
    else:
        rope_qkv(
            rt,
            q16,
            da.to_device(rt, q),
            da.to_device(rt, k),
            da.to_device(rt, v),
            kc,
            vc,
            table,
            hi,
            pos,
            rope_dim,
            neox,
        )
    p = np.arange(pos0, pos0 + T)
    rq = ops.rope(q.reshape(T, Hq, D), p, base, rope_dim, neox)
    rk = ops.rope(k.reshape(T, Hkv, D), p, base, rope_dim, neox)
    assert _rel(q16.get(), rq) < 1e-3
    kg, vg = kc.get(), vc.get()
    assert _rel(kg[pos0 : pos0 + T], rk) < 1e-3
    assert np.array_equal(vg[pos0 : pos0 + T], v.reshape(T, Hkv, D).astype(np.float16))
    for got, ref in ((kg, kc0), (vg, vc0)):
        assert np.array_equal(got[:pos0], ref[:pos0]) and np.array_equal(
            got[pos0 + T :], ref[pos0 + T :]
        )
    if rope_dim % 4 == 0:  # the two-pairs-per-thread kernel ran: the scalar one, bit for bit
        kc1, vc1 = da.to_device(rt, kc0), da.to_device(rt, vc0)
        q1 = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
        srcs = (
            ((qkv,) * 3, (0, qd, qd + kd))
            if fused
            else (tuple(da.to_device(rt, a) for a in (q, k, v)), (0, 0, 0))
        )
        rope_qkv(rt, q1, *srcs[0], kc1, vc1, table, hi, pos, rope_dim, neox, srcs[1], wide=False)
        for a, b in ((q1, q16), (kc1, kc), (vc1, vc)):
            assert np.array_equal(a.get().view(np.uint16), b.get().view(np.uint16))


def test_rope_qkv_rejects(rt):
    from minfer.cuda.ops.layers import RopeTable, rope_qkv
    from minfer.cuda.runtime import devarray as da
    from minfer.errors import GPUError

    table = RopeTable.build(rt, 8, 10000.0, 64)
    q16 = da.empty(rt, (4, 2, 64), np.float16)
    kc = da.empty(rt, (8, 1, 64), np.float16)
    from minfer.cuda.ops.layers import tok_layout

    pos = da.to_device(rt, tok_layout(6, 4))
    qkv = da.empty(rt, (4, 256), np.float32)
    with pytest.raises(GPUError, match="exceed the cache"):
        rope_qkv(rt, q16, qkv, qkv, qkv, kc, kc, table, 10, pos, 64, False, (0, 128, 192))
    with pytest.raises(GPUError, match="columns"):
        rope_qkv(rt, q16, qkv, qkv, qkv, kc, kc, table, 4, pos, 64, False, (0, 128, 200))


@pytest.mark.parametrize("T,F", [(1, 256), (13, 1000), (64, 14336), (5, 1001), (3, 6)])
def test_swiglu_fused(rt, T, F):
    """F % 4 == 0 takes the 4-wide kernel, the others the scalar one."""
    from minfer.cuda.ops.layers import swiglu_fused
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + F)
    gu = (rng.standard_normal((T, 2 * F)) * 3).astype(np.float32)
    y = da.to_device(rt, np.full((T, F), np.nan, np.float16))
    swiglu_fused(rt, y, da.to_device(rt, gu))
    assert _rel(y.get(), ops.swiglu(gu[:, :F], gu[:, F:])) < 1e-3


@pytest.mark.parametrize(
    "T,pos0,off,Hq,Hkv,D",
    [
        (1, 0, 0, 4, 4, 64),
        (77, 13, 128, 9, 3, 64),
        (1, 300, 128, 32, 8, 128),
        (200, 70, 0, 32, 8, 128),
    ],
)
def test_attention_device_pos(rt, T, pos0, off, Hq, Hkv, D):
    """attention(tok = the layout of positions pos0.., placed at slot offset `off` with lo =
    off, the cache shifted by off) == attention at host pos0 == numpy twin."""
    from minfer.cuda.ops.attention import attention
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + pos0 + off)
    S = pos0 + T + 5
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    k[pos0 + T :] = np.nan
    v[pos0 + T :] = np.nan
    qd, kd, vd = (da.to_device(rt, a) for a in (q, k, v))
    o1 = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    o2 = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    attention(rt, o1, qd, kd, vd, pos0)
    from minfer.cuda.ops.layers import tok_layout

    tok = tok_layout(pos0, T) + off  # slots shifted by off, lo = off
    other = rng.standard_normal((off, Hkv, D)).astype(np.float16)  # another sequence's rows
    ks, vs = (da.to_device(rt, np.concatenate([other, a])) for a in (k, v))
    attention(rt, o2, qd, ks, vs, 0, da.to_device(rt, tok), off + pos0 + T)
    ref = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos0)
    assert _rel(o1.get(), ref) < 2e-3
    assert np.array_equal(o1.get(), o2.get())


@pytest.mark.parametrize(
    "T,Hq,Hkv,D,rope_dim,neox,full",
    [
        (1, 4, 4, 64, 64, True, True),  # olmo2: the whole row
        (130, 8, 8, 128, 128, True, True),
        (33, 8, 2, 128, 128, True, False),  # qwen3: each head
        (7, 4, 2, 256, 256, True, False),  # gemma3's head_dim
        (5, 9, 3, 64, 32, False, False),
        (6, 4, 2, 36, 36, True, True),  # D % 8 != 0: head_rmsnorm, then the rope
    ],
)
def test_rope_qkv_norm(rt, T, Hq, Hkv, D, rope_dim, neox, full):
    """rope_qkv with the q/k norms (QkNorm): bit for bit head_rmsnorm on q and k, then
    rope_qkv (q and k left unnormed by the one launch); within 1e-3 of numpy's rmsnorm then
    rope."""
    from minfer.cuda.ops.layers import QkNorm, RopeTable, head_rmsnorm, rope_qkv, tok_layout
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + Hq * D)
    qd, kd = Hq * D, Hkv * D
    qkv = (rng.standard_normal((T, qd + 2 * kd)) * 4).astype(np.float32)
    wq = rng.uniform(0.5, 1.5, qd if full else D).astype(np.float32)
    wk = rng.uniform(0.5, 1.5, kd if full else D).astype(np.float32)
    S, pos0 = T + 9, 4
    table = RopeTable.build(rt, S, 10000.0, rope_dim)
    pos, hi = da.to_device(rt, tok_layout(pos0, T)), pos0 + T
    nan = lambda *s: da.to_device(rt, np.full(s, np.nan, np.float16))  # noqa: E731
    cols = (0, qd, qd + kd)
    # the fused launch
    q16, kc, vc, src = nan(T, Hq, D), nan(S, Hkv, D), nan(S, Hkv, D), da.to_device(rt, qkv)
    norm = QkNorm(da.to_device(rt, wq), da.to_device(rt, wk), 1e-6, full)
    rope_qkv(rt, q16, src, src, src, kc, vc, table, hi, pos, rope_dim, neox, cols, norm=norm)
    if D % 8 == 0:  # the one launch reads q and k; the fallback norms them in place
        assert np.array_equal(src.get(), qkv)
    # the two launches it replaces
    q1, kc1, vc1, src1 = nan(T, Hq, D), nan(S, Hkv, D), nan(S, Hkv, D), da.to_device(rt, qkv)
    for col, H, w in ((0, Hq, norm.wq), (qd, Hkv, norm.wk)):
        head_rmsnorm(rt, src1, col, 1 if full else H, H * D if full else D, w, 1e-6)
    rope_qkv(rt, q1, src1, src1, src1, kc1, vc1, table, hi, pos, rope_dim, neox, cols)
    for a, b in ((q16, q1), (kc, kc1), (vc, vc1)):
        assert np.array_equal(a.get().view(np.uint16), b.get().view(np.uint16))

    # numpy: rmsnorm (per head or over the row), then rope
    def normed(x, H, w):
        x = x.reshape(T, 1 if full else H, -1)
        return ops.rmsnorm(x, w, 1e-6).reshape(T, H, D)

    p = np.arange(pos0, pos0 + T)
    rq = ops.rope(normed(qkv[:, :qd], Hq, wq), p, 10000.0, rope_dim, neox)
    rk = ops.rope(normed(qkv[:, qd : qd + kd], Hkv, wk), p, 10000.0, rope_dim, neox)
    assert _rel(q16.get(), rq) < 1e-3 and _rel(kc.get()[pos0 : pos0 + T], rk) < 1e-3
