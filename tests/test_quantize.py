"""Quantizers: byte identity with llama.cpp (golden requantized tensors), gguf's own quantizers,
error bounds, the float32 summation order the k-quants rely on, and API errors."""

from __future__ import annotations

import hashlib
import json

import gguf
import numpy as np
import pytest

from minfer.errors import BadInput, Unsupported
from minfer.quants import dequantize
from minfer.quants.quantize import nearest_int, quantize, roundf, seqsum, seqsum_loop
from minfer.quants.quantize_k import bsum, to_bnG
from tests.conftest import GOLDEN

GQT = gguf.GGMLQuantizationType


def _rng(seed=0):
    return np.random.default_rng(seed)


def _adversarial(shape, seed):
    """Values over many magnitudes: pairwise and sequential float32 sums differ on these."""
    r = _rng(seed)
    return (r.standard_normal(shape) * np.exp(r.standard_normal(shape) * 4)).astype(np.float32)


# --- the float32 rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(32, 2), (32, 3), (16, 256), (32, 2048)])
def test_seqsum_is_sequential(shape):
    a = _adversarial(shape, 1)
    assert np.array_equal(seqsum(a).view(np.int32), seqsum_loop(a).view(np.int32))


@pytest.mark.parametrize("nblocks", [1, 2, 3, 255, 256, 257, 1000])
def test_bnG_sum_is_sequential(nblocks):
    xb = _adversarial((nblocks, 32), 2)
    X, n = to_bnG(xb)
    got = bsum(X).transpose(0, 2, 1).reshape(-1)[:n]
    want = seqsum_loop(np.ascontiguousarray(xb.T))
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    if nblocks >= 255:  # and the test data is one where the order matters
        assert not np.array_equal(np.sum(xb, axis=1), want)


def test_nearest_int_is_round_half_even_in_range():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 7.5000005, 15.5, -31.5, 4194302.5],
                 dtype=np.float32)
    assert nearest_int(v).tolist() == np.rint(v).astype(np.int32).tolist()
    r = (_rng(3).standard_normal(100000) * 100).astype(np.float32)
    assert np.array_equal(nearest_int(r), np.rint(r).astype(np.int32))


def test_roundf_rounds_half_away_from_zero():
    v = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 126.5], dtype=np.float32)
    assert roundf(v).tolist() == [1, 2, 3, -1, -3, 0, 0, 127]


# --- against the gguf package and error bounds -----------------------------------------------------

@pytest.mark.parametrize("qt", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_legacy_types_equal_gguf_quantizers(qt):
    x = _rng(4).standard_normal((48, 512)).astype(np.float32)
    x[3, :32] = 0  # an all-zero block
    x[5, 32:64] = 0.25  # a constant block
    assert np.array_equal(quantize(x, qt), gguf.quants.quantize(x, GQT[qt]))


# relative RMS error bounds on N(0, 1) data (llama.cpp's are of the same size); measured values
# are about 80% of these
BOUNDS = {"Q4_0": 0.11, "Q4_1": 0.10, "Q5_0": 0.055, "Q5_1": 0.05, "Q8_0": 0.007,
          "Q4_K": 0.09, "Q5_K": 0.046, "Q6_K": 0.023, "F16": 0.0005}


def _rel_err(x, qt):
    q = quantize(x, qt)
    assert q.dtype == np.uint8 and q.shape[0] == x.shape[0]
    y = dequantize(q, GQT[qt]).reshape(x.shape)
    return float(np.sqrt(np.mean((y - x) ** 2)) / np.std(x))


@pytest.mark.parametrize("qt", list(BOUNDS))
def test_roundtrip_error_within_bounds(qt):
    x = _rng(5).standard_normal((32, 1024)).astype(np.float32)
    err = _rel_err(x, qt)
    assert err < BOUNDS[qt], f"{qt}: relative RMS error {err:.4f}"


def test_k_quants_beat_legacy_of_same_bits():
    x = _rng(6).standard_normal((32, 1024)).astype(np.float32)
    assert _rel_err(x, "Q4_K") < _rel_err(x, "Q4_1")
    assert _rel_err(x, "Q5_K") < _rel_err(x, "Q5_1")


@pytest.mark.parametrize("qt", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_degenerate_blocks(qt):
    x = _rng(7).standard_normal((4, 512)).astype(np.float32)
    x[0] = 0  # all zero
    x[1, :256] = -0.75  # constant super-block
    x[2, 256:] = 1e-30  # tiny values
    x[3, :32] = 3.0  # one constant sub-block among normal ones
    q = quantize(x, qt)
    y = dequantize(q, GQT[qt]).reshape(x.shape)
    assert np.all(np.isfinite(y))
    assert np.all(y[0] == 0)
    assert np.all(np.abs(y[2, 256:]) < 1e-6)
    assert np.allclose(y[1, :256], -0.75, atol=0.05)
    assert np.allclose(y[3, :32], 3.0, atol=0.2)


def test_quantize_errors():
    x = np.zeros((2, 576), dtype=np.float32)
    with pytest.raises(Unsupported, match="576 is not a multiple"):
        quantize(x, "Q4_K")
    with pytest.raises(Unsupported, match="cannot quantize to IQ4_XS"):
        quantize(x, "IQ4_XS")
    with pytest.raises(Unsupported, match="unknown tensor type"):
        quantize(x, "Q9_9")
    with pytest.raises(BadInput, match="float32"):
        quantize(x.astype(np.float64), "Q8_0")
    assert quantize(x, int(GQT.Q8_0)).shape == (2, 576 // 32 * 34)


# --- byte identity with llama.cpp on a sample of the golden tensors --------------------------------

SAMPLE = {  # golden file -> tensors (every quantizer type the golden files use)
    "smollm2-135m-q4_k_m": ["blk.3.ffn_down.weight", "blk.0.ffn_down.weight",
                            "blk.0.attn_v.weight", "blk.7.attn_q.weight"],
    "smollm2-135m-q6_k": ["blk.12.ffn_down.weight", "blk.1.attn_k.weight"],
    "smollm2-135m-q8_0": ["blk.2.attn_output.weight"],
    "smollm2-135m-f16": ["blk.2.ffn_gate.weight", "token_embd.weight"],
}


@pytest.fixture(scope="module")
def requant_golden():
    return json.loads((GOLDEN / "llamacpp-requant-tensors.json").read_text())


@pytest.mark.parametrize("kind,name", [(k, n) for k, ns in SAMPLE.items() for n in ns])
def test_golden_tensor_bytes(default_model, requant_golden, kind, name):
    want = requant_golden[kind][name]
    t = default_model.tensor(name)
    assert GQT[want["type"]] != t.qtype  # a real requantization, not a copy
    raw = quantize(default_model.dequant(name), want["type"])
    assert raw.shape[0] == want["shape"][1]
    assert hashlib.sha256(raw.tobytes()).hexdigest() == want["sha256"], (
        f"{kind} {name} ({want['type']}) differs from llama.cpp")
