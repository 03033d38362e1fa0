"""kernels/layers.cu through its launchers vs the numpy twins (minfer.reference.ops)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err as _rel

from minfer.reference import ops

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T,D", [(1, 64), (7, 576), (33, 1000), (130, 4096), (3, 1002)])
@pytest.mark.parametrize("out", [np.float16, np.float32])
def test_rmsnorm(rt, T, D, out):
    """16-byte pieces where D % 4 == 0 (and the rows are aligned), single values otherwise
    (D = 1002)."""
    from minfer.cuda.ops.layers import rmsnorm
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T * D)
    x = (rng.standard_normal((T, D)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    y = da.to_device(rt, np.full((T, D), np.nan, out))  # poisoned
    rmsnorm(rt, y, da.to_device(rt, x), da.to_device(rt, w), 1e-5)
    ref = ops.rmsnorm(x, w, 1e-5)
    got = y.get()
    if out == np.float32:
        assert _rel(got, ref) < 1e-6
    else:
        assert np.array_equal(got, ref.astype(np.float16)) or _rel(got, ref) < 1e-3


@pytest.mark.parametrize(
    "T,H,D,col,ld",
    [(5, 4, 128, 0, 1024), (7, 2, 128, 512, 1024), (3, 3, 64, 64, 452), (1, 8, 128, 0, 1024)],
)
def test_head_rmsnorm(rt, T, H, D, col, ld):
    """qwen3's q/k norms in place on H heads of D at column col of [T, ld] rows (a part of the
    fused q|k|v output, ragged strides too); the other columns untouched."""
    from minfer.cuda.ops.layers import head_rmsnorm
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T * H + D)
    x = (rng.standard_normal((T, ld)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    xd = da.to_device(rt, x)
    head_rmsnorm(rt, xd, col, H, D, da.to_device(rt, w), 1e-6)
    got = xd.get()
    ref = x.copy()
    ref[:, col : col + H * D] = ops.rmsnorm(
        x[:, col : col + H * D].reshape(T, H, D), w, 1e-6
    ).reshape(T, H * D)
    assert _rel(got, ref) < 1e-6
    mask = np.ones(ld, bool)
    mask[col : col + H * D] = False
    assert np.array_equal(got[:, mask], x[:, mask])


@pytest.mark.parametrize(
    "T,H,D,rope_dim,neox,pos0",
    [
        (5, 3, 64, 64, False, 0),
        (17, 4, 128, 128, True, 9),
        (1, 2, 64, 32, False, 40),
        (9, 5, 128, 64, True, 3),
    ],
)
def test_rope(rt, T, H, D, rope_dim, neox, pos0):
    from minfer.cuda.ops.layers import RopeTable, rope, rope_to_f16
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + H + D)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    base = 500000.0 if neox else 10000.0
    table = RopeTable.build(rt, 64, base, rope_dim)
    ref = ops.rope(x, np.arange(pos0, pos0 + T), base, rope_dim, neox)
    xd = da.to_device(rt, x)
    rope(rt, xd, table, pos0, rope_dim, neox)
    assert _rel(xd.get(), ref) < 1e-6  # same angles, same products: ulps at most
    dst = da.to_device(rt, np.full((T, H, D), np.nan, np.float16))
    rope_to_f16(rt, dst, da.to_device(rt, x), table, pos0, rope_dim, neox)
    assert _rel(dst.get(), ref) < 1e-3
    x16 = da.to_device(rt, x.astype(np.float16))
    rope(rt, x16, table, pos0, rope_dim, neox)
    ref16 = ops.rope(
        x.astype(np.float16).astype(np.float32), np.arange(pos0, pos0 + T), base, rope_dim, neox
    )
    assert _rel(x16.get(), ref16) < 1e-3
    from minfer.errors import GPUError

    with pytest.raises(GPUError, match="outside the table"):
        rope(rt, xd, table, 64, rope_dim, neox)


@pytest.mark.parametrize("T,F", [(1, 256), (13, 1536), (64, 14336)])
def test_swiglu_add_cvt(rt, T, F):
    from minfer.cuda.ops.layers import add, swiglu, to_f16
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(F)
    g = (rng.standard_normal((T, F)) * 4).astype(np.float32)
    u = rng.standard_normal((T, F)).astype(np.float32)
    y = da.to_device(rt, np.full((T, F), np.nan, np.float16))
    swiglu(rt, y, da.to_device(rt, g), da.to_device(rt, u))
    assert _rel(y.get(), ops.swiglu(g, u)) < 1e-3
    yd = da.to_device(rt, g)
    add(rt, yd, da.to_device(rt, u))
    assert np.array_equal(yd.get(), g + u)
    h = da.to_device(rt, np.full((T, F), np.nan, np.float16))
    to_f16(rt, h, da.to_device(rt, g))
    assert np.array_equal(h.get(), g.astype(np.float16))


@pytest.mark.parametrize("n", [1, 100, 49152, 128256])
def test_argmax_first_on_ties(rt, n):
    from minfer.cuda.ops.layers import argmax
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    if n > 10:
        x[n // 3] = x[n - 2] = x.max() + 1  # tie: the first index wins
    out = da.to_device(rt, np.array([-1], np.int32))
    argmax(rt, out, da.to_device(rt, x))
    assert int(out.get()[0]) == int(np.argmax(x))


def test_launcher_rejects_bad_shapes(rt):
    from minfer.cuda.ops.layers import rmsnorm
    from minfer.cuda.runtime import devarray as da
    from minfer.errors import GPUError

    x = da.to_device(rt, np.ones((4, 8), np.float32))
    with pytest.raises(GPUError, match="rmsnorm w"):
        rmsnorm(
            rt, da.empty(rt, (4, 8), np.float16), x, da.to_device(rt, np.ones(7, np.float32)), 1e-5
        )
    with pytest.raises(GPUError, match="dtype"):
        rmsnorm(
            rt, da.empty(rt, (4, 8), np.int32), x, da.to_device(rt, np.ones(8, np.float32)), 1e-5
        )
