"""blk-split on the device (NOT yet run on a GPU when written: docs/blk.md, "blk-split"). The
column kernels (kernels/blk_split.cu, any sm_80+ GPU) bit for bit against their numpy twins; on
sm_90 (skips elsewhere) the split route against split_linear_ref (float64) on ragged M, N, K
not a multiple of 128, n = 128 and n = K, its operands' bytes against the twins; the forward
with GPU-calibrated channels: greedy-32 against the CPU reference on the same grid (OutlierGrid
on the backend's channels, blk's elsewhere) and `minfer check`'s parity rows of the path.
The CPU side of all of it: tests/test_blk_split_cpu.py, tests/test_blk_split_calib_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DOWN = "blk.0.ffn_down.weight"


@pytest.mark.parametrize("M,K,n", [(1, 64, 8), (37, 224, 128), (300, 4096, 128), (130, 96, 96)])
def test_split_kernels_bitwise(rt, same_bytes, M, K, n):
    from minfer.cuda.paths.blk import outliers as O
    from minfer.cuda.paths.blk import split as S
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(M + K)
    x = (rng.standard_normal((M, K)) * 4).astype(np.float16)
    cols = np.sort(rng.choice(K, n, replace=False)).astype(np.int32)
    A = da.to_device(rt, x)
    out = da.to_device(rt, np.full((M, n), np.nan, np.float16))
    S.blk_split_cols(rt, A, da.to_device(rt, cols), out)
    want_a, want_o = x.copy(), np.empty((M, n), np.float16)
    O.blk_split_cols_ref(want_a, cols, want_o)
    assert same_bytes(out, want_o) and same_bytes(A, want_a)
    acc = da.to_device(rt, np.ones(K, np.float32))
    twin = np.ones(K, np.float32)
    for _ in range(2):
        S.col_sumsq_f16(rt, da.to_device(rt, x), acc)
        O.col_sumsq_ref(x, twin)
    assert same_bytes(acc, twin)


@pytest.mark.parametrize("mode", ["f32", "acc"])
@pytest.mark.parametrize("M,N,K", [(77, 333, 224), (1, 64, 4096), (300, 1024, 14336), (65, 96, 96)])
def test_split_route_parity(hopper, same_bytes, M, N, K, mode):
    """The route as the forward runs it (prepass, run) on the weight as the engine uploads it,
    against split_linear_ref within blk's GEMM parity (test_blk_device: the kernel folds int32
    sums in f32 per 128 of K), its Xo and token operand bit for bit."""
    from quant_data import rand_weights

    from minfer.cuda.paths import Part, upload_weight
    from minfer.cuda.paths.blk.outliers import busiest, split_linear_ref
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT, split_n
    from minfer.cuda.paths.blk.twin import blk_operand, quantize_blk
    from minfer.cuda.paths.parity import scratch
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray as da
    from minfer.quants import dequantize

    rt = hopper
    rng = np.random.default_rng(M + N + K)
    x = rng.standard_normal((M, K))
    x[:, rng.choice(K, 4, replace=False)] *= 40  # SwiGLU's massive channels
    x = x.astype(np.float16)
    cols = busiest((x.astype(np.float64) ** 2).mean(axis=0), split_n(K))
    raw = rand_weights(rng, 8, N, K)
    w16 = dequantize(raw, 8).reshape(N, K).astype(np.float16)
    w = upload_weight(rt, BLK_SPLIT, [Part(DOWN, raw, 8, K)], DOWN, channels={DOWN: cols})
    route = BLK_SPLIT.route(8, GemmChoice("blk-split"), DOWN)
    s = scratch(rt, M, K)
    base = rng.standard_normal((M, N)).astype(np.float32) if mode == "acc" else 0
    C = da.to_device(rt, np.full((M, N), np.nan, np.float32) if mode == "f32" else base)
    A = da.to_device(rt, x)
    route.run(rt, s, C, route.operand.prepass(rt, A, s.operands["blksplit"]), w, mode)
    got = C.get() - base
    ref = split_linear_ref(x, w16, cols)
    assert np.all(np.isfinite(got))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4
    xz = x.copy()
    xz[:, cols] = 0
    assert same_bytes(A, xz)  # the input consumed: its kept columns zeroed
    xo = da.view(da.ptr(s.operands["blksplit"]), (M, len(cols)), np.float16)
    assert same_bytes(xo, x[:, cols])
    tt = blk_operand(*quantize_blk(xz))
    assert same_bytes(da.view(da.ptr(s.operands["blkop"]), tt.shape, np.uint8), tt)


def test_forward_greedy_32_on_calibrated_channels(hopper, model):
    """make_backend calibrates (a blk backend's ffn_down inputs on calib.txt), then the
    blk-split forward: tie-aware greedy-32 identity against the CPU reference on the same grid
    (OutlierGrid on those channels for ffn_down, blk's elsewhere)."""
    from minfer.batch import single
    from minfer.cuda.plan.config import GemmChoice
    from minfer.engine.backends import make_backend
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.check import identity_verdict, reference_grids

    rng = np.random.default_rng(5)
    prompt = [int(i) for i in rng.integers(0, model.config.vocab_size, 21)]
    be = make_backend("cuda", model, GemmChoice("blk-split"), 64, 64, progress=False)
    downs = [n for n, (p, _) in be.routes.items() if ".ffn_down." in n]
    assert downs and all(be.routes[n][0] == "blk-split" for n in downs)
    assert set(be.gcfg.channels) >= set(downs)
    for n in downs:
        assert np.array_equal(be.w[n].cols.get(), be.gcfg.channels[n])
    res = single.run(be, prompt, 32, 8)
    grids = reference_grids(be.routes, model, be.plan.moe, be.gcfg)
    ref = single.run(ReferenceBackend(model, grids=grids), prompt, 32, 512)
    v, diff = identity_verdict(ref, res)
    print(f"\n{model.path.name} blk-split: {v.describe()} (max |dlogit| {diff:.4f})")
    assert v.ok, v.describe()


def test_check_parity_rows(hopper, model):
    """`minfer check`'s parity rows of blk-split (its split ffn_down on the uncalibrated
    channels, the twin's): every row within the gate."""
    from minfer.cuda.paths.blk.split_path import BLK_SPLIT
    from minfer.tools.check import parity_rows

    rows = parity_rows(hopper, model, paths=[BLK_SPLIT], echo=print)
    assert rows and all(ok for *_, ok in rows), [r for r in rows if not r[-1]]
