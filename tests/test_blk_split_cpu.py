"""CPU: blk-split's column kernels (kernels/blk_split.cu) without a GPU: the launchers on the heap
runtime (tests/moe_heap.py runs each entry's numpy twin over fake device memory, walking the
launch's arguments as the kernel's C signature orders them) against independent numpy, their
one-line refusals, and the cols' own checks. The kernels against the twins on a GPU:
tests/gpu/test_blk_split_device.py."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.blk import outliers as O
from minfer.cuda.paths.blk import split as S
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError


@pytest.fixture
def heap(monkeypatch):
    import moe_heap

    return moe_heap.install(monkeypatch)


def _cols(rng, K, n):
    return np.sort(rng.choice(K, n, replace=False)).astype(np.int32)


@pytest.mark.parametrize("M,K,n,pad", [(1, 64, 8, 0), (37, 200, 128, 0), (130, 136, 136, 24)])
def test_split_cols_gathers_then_zeroes(heap, M, K, n, pad):
    """out = A[:, cols] and A[:, cols] = 0, the other columns untouched; pad: A's rows a view
    of wider ones (the row stride the launcher passes)."""
    rng = np.random.default_rng(M + K)
    full = rng.standard_normal((M, K + pad)).astype(np.float16)
    cols = _cols(rng, K, n)
    buf = da.to_device(heap, full)
    A = type(buf)((M, K), np.float16, gpudata=buf.gpudata, strides=(2 * (K + pad), 2))
    out = da.empty(heap, (M, n), np.float16)
    S.blk_split_cols(heap, A, da.to_device(heap, cols), out)
    assert np.array_equal(out.get(), full[:, cols])
    want = full.copy()
    want[:, cols] = 0
    assert np.array_equal(heap.at(int(buf.gpudata), (M, K + pad), np.float16), want)


def test_col_sumsq_accumulates_in_f32(heap):
    """acc += column sums of squares, chunk after chunk: bit for bit the twin's f32 order, and
    within f32's rounding of the float64 sums (M additions of relative error 2^-24 each)."""
    rng = np.random.default_rng(3)
    M, K = 70, 300
    chunks = [rng.standard_normal((M, K)).astype(np.float16) * (1 + i) for i in range(3)]
    acc = da.to_device(heap, np.zeros(K, np.float32))
    twin = np.zeros(K, np.float32)
    for c in chunks:
        S.col_sumsq_f16(heap, da.to_device(heap, c), acc)
        O.col_sumsq_ref(c, twin)
    got = acc.get()
    assert np.array_equal(got, twin)
    exact = sum((c.astype(np.float64) ** 2).sum(axis=0) for c in chunks)
    assert np.all(np.abs(got - exact) <= (len(chunks) * (M + 1)) * 2.0**-24 * exact)


def test_launchers_refuse_in_one_line(heap):
    A = da.to_device(heap, np.zeros((4, 64), np.float16))
    cols = da.to_device(heap, np.arange(8, dtype=np.int32))
    bad = [
        lambda: S.blk_split_cols(heap, da.to_device(heap, np.zeros((4, 64))), cols, A),
        lambda: S.blk_split_cols(heap, A, da.to_device(heap, np.arange(8.0)), A),
        lambda: S.blk_split_cols(heap, A, cols, da.empty(heap, (4, 9), np.float16)),
        lambda: S.blk_split_cols(heap, A, da.to_device(heap, np.arange(65, dtype=np.int32)), A),
        lambda: S.col_sumsq_f16(heap, A, da.empty(heap, (63,), np.float32)),
    ]
    for f in bad:
        with pytest.raises(GPUError) as e:
            f()
        assert "\n" not in str(e.value)
    assert heap.launches == []


@pytest.mark.parametrize(
    "cols", [[], [3, 3], [5, 2], [-1, 4], [0, 64], np.array([1.0, 2.0]), [[1, 2]]]
)
def test_check_cols_refuses(cols):
    with pytest.raises(ValueError) as e:
        O.check_cols(np.asarray(cols), 64)
    assert "\n" not in str(e.value)


def test_check_cols_takes_ascending_channels():
    got = O.check_cols(np.array([0, 5, 63], np.int64), 64)
    assert got.dtype == np.int32 and list(got) == [0, 5, 63]
