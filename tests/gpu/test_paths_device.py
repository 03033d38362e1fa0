"""GPU: every path of the GEMM path table (minfer.cuda.plan.paths.TABLE) against its numpy twin, one
parametrized harness over (path, type, shape) in the spirit of llama.cpp's test-backend-ops,
through the table's own calling convention (minfer.cuda.ops.path_ops: prepare, launch, twin); the
q8_1 prepass bit for bit; the launchers' refusals. A new path is one record: it is tested here."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.plan.paths import TABLE
from quant_data import rand_weights

pytestmark = pytest.mark.gpu

Q4_K, Q6_K, Q8_0 = 12, 14, 8


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_q8_1_bit_identical(rt, dtype):
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq import quantize_q8_1
    from minfer.quants.q8_1 import quantize_q8_1_raw

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((33, 1024)) * rng.uniform(0.01, 50, (33, 1))).astype(dtype)
    x[2, :32] = 0
    got = quantize_q8_1(rt, da.to_device(rt, x)).get()
    np.testing.assert_array_equal(got, quantize_q8_1_raw(x.astype(np.float32)))


@pytest.mark.parametrize("path", list(TABLE))
@pytest.mark.parametrize("qtype", [Q4_K, Q6_K, Q8_0])
@pytest.mark.parametrize("M,N,K", [(1, 9, 256), (37, 200, 512), (64, 128, 1024),
                                   (130, 333, 2048)])
def test_path_parity(rt, path, qtype, M, N, K):
    """C = and C += against the twin, rel err <= 1e-3 (DESIGN.md gate 1), every output written
    (NaN-poisoned first); a type / arch the path does not take is skipped, the smem guard's
    fallback runs (and is checked) in its place."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.plan.paths import choose_path

    p = TABLE[path]
    why = p.unsupported(qtype, rt.arch, K)
    if why:
        pytest.skip(why)
    r = choose_path(qtype, rt.arch, (M, N, K), path, rt.smem_optin)
    if p.gemv_f16 and M == 1:   # the chooser leaves an M = 1 GEMM to f16's GEMV; the engine's
        assert r.path.name == "f16" and "GEMV" in r.why   # decode still runs p at M = 1
        r = type(r)(p)
    assert r.path is p or (p.kd and r.path.name == "narrow" and r.notice)
    prepare, launch, twin = r.path.ops()
    rng = np.random.default_rng(M + N + K + qtype)
    w = rand_weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = twin(x, w, qtype, M, N, K)
    wd = prepare(rt, da.to_device(rt, np.ascontiguousarray(w).reshape(-1)), qtype, N, K)
    out = da.to_device(rt, np.full((M, N), np.nan, np.float32))   # poisoned: all must be written
    launch(rt, da.to_device(rt, x), wd, qtype, M, N, K, r.path, out)
    y = out.get()
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) <= 1e-3 * np.linalg.norm(ref)
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    launch(rt, da.to_device(rt, x), wd, qtype, M, N, K, r.path, acc, True)
    assert np.linalg.norm(acc.get() - (base + ref)) <= 1e-3 * np.linalg.norm(base + ref)


def test_mmq_rejects_bad_shapes(rt):
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq import mmq_linear
    from minfer.errors import GPUError, Unsupported

    x = da.to_device(rt, np.zeros((4, 384), np.float32))
    w = da.to_device(rt, np.zeros(4 * 2 * 144, np.uint8))
    out = da.to_device(rt, np.zeros((4, 4), np.float32))
    with pytest.raises(GPUError):
        mmq_linear(rt, x, w, Q4_K, 4, 4, 384, "wide-kd4", out)
    with pytest.raises(Unsupported):
        mmq_linear(rt, x, w, 8, 4, 4, 512, "wide-kd4", out)
    with pytest.raises(GPUError, match="not a raw int8 path"):
        mmq_linear(rt, x, w, Q4_K, 4, 4, 512, "blk", out)
