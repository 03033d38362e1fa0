"""ReferenceBackend(grids=...) with the q8_1 paths' grid (Q8_1Grid): the reference `minfer check`
holds the MMQ paths to. A weight given it sees its input through the q8_1 raw grid, so the
reference's product must equal the numpy MMQ twin (mmq_linear_ref: integer dots per 32-chunk, two-term rescale) to float rounding."""

from __future__ import annotations

import numpy as np
import pytest
from synth_data import tiny_model

from minfer.cuda.paths.q8_1.twin import Q8_1Grid, mmq_linear_ref
from minfer.gguf.loader import load_model
from minfer.reference.forward import ReferenceBackend


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(tiny_model(tmp_path_factory.mktemp("q8ref"), seed=5, vocab=512))


def _k_quant_weights(model):
    return [
        n
        for n, t in model.tensors.items()
        if t.qtype in (12, 14) and len(t.shape) == 2 and n != model.output_name
    ]


def test_q8_1_input_linear_is_the_mmq_math(tiny):
    names = _k_quant_weights(tiny)
    assert {tiny.tensors[n].qtype for n in names} == {12, 14}  # q4_K and q6_K both covered
    rng = np.random.default_rng(0)
    for name in names[:6]:
        t = tiny.tensors[name]
        N, K = t.shape
        x = rng.standard_normal((7, K)).astype(np.float32)  # ragged M
        be = ReferenceBackend(tiny, dtype=np.float64, grids={name: Q8_1Grid()})
        got = be._linear(x.astype(np.float64), name)
        want = mmq_linear_ref(x, np.asarray(t.data).reshape(N, -1), t.qtype, 7, N, K)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-5, (name, err)
        plain = ReferenceBackend(tiny, dtype=np.float64)._linear(x.astype(np.float64), name)
        assert np.linalg.norm(plain - want) / np.linalg.norm(want) > 10 * err  # rounding is real


def test_q8_1_grid_moves_the_logits_a_little(tiny):
    ids = np.array([1, 5, 9, 33, 70, 2], np.int32)
    a = ReferenceBackend(tiny).forward(ids, 0)
    b = ReferenceBackend(tiny, grids=dict.fromkeys(_k_quant_weights(tiny), Q8_1Grid()))
    b = b.forward(ids, 0)
    d = float(np.abs(a - b).max())
    assert 0 < d < 0.5 * float(np.abs(a).max())
