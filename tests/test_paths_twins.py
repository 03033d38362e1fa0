"""CPU: every path of the GEMM path table through its numpy twin (the same parametrized harness
as tests/gpu/test_paths_device.py, host side): each twin is wired to its record (argument order,
type), lands within its activation grid's error of the float64 product of the dequantized
weight, and the int8 twins differ from f16's by their grid only."""

from __future__ import annotations

import numpy as np
import pytest
from quant_data import rand_weights

from minfer.cuda.paths import TABLE

# relative error of each activation grid against the exact product (q8_1: 1/254 of a 32-value
# block's amax per value; f16: 2^-11; blk: the rotated int8 per 128 values
# and the weight's int8 row grid, coarse on these random blocks whose scales vary 100x along a
# row: 0.8% of the weight on the default model's real rows, against q4_1's own ~10%)
# (blk-split: blk's grid on an unnamed weight, which is not one it splits)
GRID_TOL = {"f16": 2e-3, "q8_1": 2e-2, "blk": 4e-2, "blk-split": 4e-2}


@pytest.mark.parametrize("path", list(TABLE))
@pytest.mark.parametrize("qtype", [12, 14, 8])
def test_twin_of_each_path(path, qtype):
    from minfer.quants import dequantize

    p = TABLE[path]
    M, N, K = 9, 40, 512
    why = p.unsupported(qtype, next(iter(p.archs or [None])), K)
    if why:
        assert p.int8 and qtype not in (p.qtypes or ())
        pytest.skip(why)
    rng = np.random.default_rng(qtype)
    w = rand_weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    y = p.twin(x, w, qtype, M, N, K)
    assert y.shape == (M, N)
    if qtype in (12, 14):
        exact = x.astype(np.float64) @ dequantize(w, qtype).reshape(N, K).astype(np.float64).T
    else:
        from minfer.cuda.ops.dequant import dequant_f16_ref

        exact = x.astype(np.float64) @ dequant_f16_ref(w, qtype, N, K).astype(np.float64).T
    err = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert err <= GRID_TOL[p.operand.name if p.operand else "f16"], (path, err)
    assert err > 0  # every path rounds its activations somewhere
