"""GPU: every path of the GEMM path table (minfer.cuda.paths.TABLE) against its numpy twin, one
parametrized harness over (path, type, shape) in the spirit of llama.cpp's test-backend-ops,
through each path object's own calling convention (minfer.cuda.paths: prepare, the route's
operand prepass and run, twin: what the forward runs); the q8_1 prepass bit for bit; the
launchers' refusals. A new path family is one object in the table: it is tested here."""

from __future__ import annotations

import numpy as np
import pytest
from quant_data import rand_weights

from minfer.cuda.paths import TABLE

pytestmark = pytest.mark.gpu

Q4_K, Q6_K, Q8_0 = 12, 14, 8


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_q8_1_bit_identical(rt, dtype):
    from minfer.cuda.paths.q8_1.launch import quantize_q8_1
    from minfer.cuda.runtime import devarray as da
    from minfer.quants.q8_1 import quantize_q8_1_raw

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((33, 1024)) * rng.uniform(0.01, 50, (33, 1))).astype(dtype)
    x[2, :32] = 0
    got = quantize_q8_1(rt, da.to_device(rt, x)).get()
    np.testing.assert_array_equal(got, quantize_q8_1_raw(x.astype(np.float32)))


def _run(rt, route, x16, wd, out, mode: str) -> None:
    """The forward's launch of `route`: its operand made from the f16 activation, then run."""
    from minfer.cuda.paths.parity import scratch as parity_scratch
    from minfer.cuda.runtime import devarray as da

    M, K = x16.shape
    scratch = parity_scratch(rt, M, K)
    xd = da.to_device(rt, x16)
    op = route.operand
    xin = xd if op is None else op.prepass(rt, xd, scratch.operands[op.scratch])
    route.run(rt, scratch, out, xin, wd, mode)


# blk's routes read a per-(token, 128) operand, or one scale per token after an rmsnorm
WEIGHTS = {"blk": ("blk.0.attn_output.weight", "blk.0.ffn_gate.weight")}


@pytest.mark.parametrize(
    "path, name", [(p, n) for p in TABLE for n in WEIGHTS.get(p, ("blk.0.attn_output.weight",))]
)
@pytest.mark.parametrize("qtype", [Q4_K, Q6_K, Q8_0])
@pytest.mark.parametrize("M,N,K", [(1, 9, 256), (37, 200, 512), (64, 128, 1024), (130, 333, 2048)])
def test_path_parity(rt, path, name, qtype, M, N, K):
    """C = and C += against the twin, rel err <= 1e-3 (docs/design.md, gate 1), every output written
    (NaN-poisoned first); a type / arch the path does not take is skipped, the smem guard's
    fallback runs (and is checked) in its place."""
    from minfer.cuda.paths import Part, choose_path, upload_weight
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.runtime import devarray as da

    p = TABLE[path]
    why = p.unsupported(qtype, rt.arch, K)
    if why:
        pytest.skip(why)
    r = choose_path(qtype, rt.arch, (M, N, K), path, rt.smem_optin)
    if p.gemv_f16 and M == 1:  # the chooser leaves an M = 1 GEMM to f16's GEMV; the engine's
        assert r.path.name == "f16" and "GEMV" in r.why  # decode still runs p at M = 1
        r = type(r)(p)
    assert r.path is p or (p.kd and r.path.name == "narrow" and r.notice)
    route = r.path.route(qtype, GemmChoice(r.path.name), name)
    rng = np.random.default_rng(M + N + K + qtype)
    w = rand_weights(rng, qtype, N, K)
    x16 = rng.standard_normal((M, K)).astype(np.float16)  # the forward's f16 activation
    ref = r.path.twin(x16.astype(np.float32), w, qtype, M, N, K, name)
    wd = upload_weight(rt, r.path, [Part(name, np.ascontiguousarray(w).reshape(N, -1), qtype, K)])
    out = da.to_device(rt, np.full((M, N), np.nan, np.float32))  # poisoned: all must be written
    _run(rt, route, x16, wd, out, "f32")
    y = out.get()
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) <= 1e-3 * np.linalg.norm(ref)
    if not route.accumulates:  # blk's per-token GEMMs (after a norm) never add to C
        return
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    _run(rt, route, x16, wd, acc, "acc")
    assert np.linalg.norm(acc.get() - (base + ref)) <= 1e-3 * np.linalg.norm(base + ref)


def test_mmq_rejects_bad_shapes(rt):
    from minfer.cuda.paths.q8_1.launch import mmq_linear
    from minfer.cuda.runtime import devarray as da
    from minfer.errors import GPUError, Unsupported

    x = da.to_device(rt, np.zeros((4, 384), np.float32))
    w = da.to_device(rt, np.zeros(4 * 2 * 144, np.uint8))
    out = da.to_device(rt, np.zeros((4, 4), np.float32))
    with pytest.raises(GPUError):
        mmq_linear(rt, x, w, Q4_K, 4, 4, 384, "wide", 4, out)
    with pytest.raises(Unsupported):
        mmq_linear(rt, x, w, 8, 4, 4, 512, "wide", 4, out)
    with pytest.raises(GPUError, match="kernel family 'blk'"):
        mmq_linear(rt, x, w, Q4_K, 4, 4, 512, "blk", 0, out)
