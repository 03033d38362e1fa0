"""Quantizers: byte identity with llama.cpp (golden requantized tensors), gguf's own quantizers,
error bounds, the float32 summation order the k-quants rely on, and API errors."""

from __future__ import annotations

import hashlib
import json

import gguf
import numpy as np
import pytest

from minfer.errors import BadInput, Unsupported
from minfer.quants import ckernel, dequantize
from minfer.quants.quantize import C_TYPES, quantize, roundf
from minfer.quants.quantize_k import bsum, to_bnG
from minfer.quants.rounding import nearest_int, seqsum, seqsum_loop
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
    v = np.array(
        [0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 7.5000005, 15.5, -31.5, 4194302.5], dtype=np.float32
    )
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
BOUNDS = {
    "Q4_0": 0.11,
    "Q4_1": 0.10,
    "Q5_0": 0.055,
    "Q5_1": 0.05,
    "Q8_0": 0.007,
    "Q4_K": 0.09,
    "Q5_K": 0.046,
    "Q6_K": 0.023,
    "F16": 0.0005,
}


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
    with pytest.raises(BadInput, match="impl must be"):
        quantize(x, "Q4_K", impl="fortran")
    assert quantize(x, int(GQT.Q8_0)).shape == (2, 576 // 32 * 34)


# --- byte identity with llama.cpp on a sample of the golden tensors --------------------------------

SAMPLE = {  # golden file -> tensors (every quantizer type the golden files use)
    "smollm2-135m-q4_k_m": [
        "blk.3.ffn_down.weight",
        "blk.0.ffn_down.weight",
        "blk.0.attn_v.weight",
        "blk.7.attn_q.weight",
    ],
    "smollm2-135m-q6_k": ["blk.12.ffn_down.weight", "blk.1.attn_k.weight"],
    "smollm2-135m-q8_0": ["blk.2.attn_output.weight"],
    "smollm2-135m-f16": ["blk.2.ffn_gate.weight", "token_embd.weight"],
}


@pytest.fixture(scope="module")
def requant_golden():
    return json.loads((GOLDEN / "llamacpp-requant-tensors.json").read_text())


def _golden_cases():
    """(kind, tensor, impl): numpy for every sample, C too where the type has a C twin."""
    types = json.loads((GOLDEN / "llamacpp-requant-tensors.json").read_text())
    return [
        (k, n, impl)
        for k, ns in SAMPLE.items()
        for n in ns
        for impl in ("numpy", "c")
        if impl == "numpy" or types[k][n]["type"] in C_TYPES
    ]


@pytest.mark.parametrize("kind,name,impl", _golden_cases())
def test_golden_tensor_bytes(default_model, requant_golden, kind, name, impl):
    want = requant_golden[kind][name]
    if impl == "c" and ckernel.library() is None:
        pytest.skip("no C compiler")
    t = default_model.tensor(name)
    assert GQT[want["type"]] != t.qtype  # a real requantization, not a copy
    raw = quantize(default_model.dequant(name), want["type"], impl=impl)
    assert raw.shape[0] == want["shape"][1]
    assert hashlib.sha256(raw.tobytes()).hexdigest() == want["sha256"], (
        f"{kind} {name} ({want['type']}) differs from llama.cpp"
    )


# --- the C twins (minfer/quants/kquants.c) against the numpy ones ---------------------------------

needs_cc = pytest.mark.skipif(ckernel.compiler() is None, reason="no C compiler")


def _variants():
    """Every build variant that works here (native vector width, portable baseline)."""
    libs = [(" ".join(f), ckernel.load(f)) for f in ckernel.VARIANTS]
    return [(name, lib) for name, lib in libs if lib is not None]


@needs_cc
def test_c_quantizers_build_where_a_compiler_exists():
    # a broken kquants.c must fail here, not silently fall back to the slow numpy path
    assert ckernel.library() is not None
    assert ckernel.load(ckernel.FLAGS) is not None  # the portable variant builds too


def _hard_k_inputs():
    """Adversarial magnitudes plus every degenerate sub-block case the searches special-case."""
    x = _adversarial((48, 1024), 8)
    x = np.concatenate([x, _rng(9).standard_normal((16, 1024)).astype(np.float32)])
    x[0] = 0  # all-zero super-blocks
    x[1, :256] = -0.75  # constant super-block
    x[2, 256:] = 1e-30  # tiny (zero scale after fp16)
    x[3, :32] = 3.0  # one constant sub-block of 32
    x[4, 16:32] = 0  # one zero sub-block of 16 (q6_K)
    x[5, 512:768] = np.abs(x[5, 512:768])  # min > 0 clamps to 0
    x[6, :256] = np.float32(60000.0) * np.sign(x[6, :256])  # scales near the fp16 limit
    x[7, 1:256:2] = 0  # half zeros
    return x


@needs_cc
@pytest.mark.parametrize("qt", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("shape", [(64, 1024), (3, 768), (1, 256)])  # partial lane groups too
def test_c_quantizers_equal_numpy(qt, shape):
    x = _hard_k_inputs()[: shape[0], : shape[1]]
    want = quantize(x, qt, impl="numpy")
    for flags, lib in _variants():
        got = ckernel.quantize_k(x.reshape(-1, 256), qt, lib=lib).reshape(want.shape)
        bad = np.nonzero((got != want).any(axis=1))[0]
        assert bad.size == 0, f"{qt} [{flags}]: rows {bad[:8].tolist()} differ from numpy"
    assert np.array_equal(quantize(x, qt), want)  # the default path


@needs_cc
def test_c_fp16_conversion_equals_numpy():
    r = _rng(10)
    bits = r.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]  # NaN payloads are not specified
    edges = np.array(
        [
            65504,
            65519.996,
            65520,
            1e9,
            2**-14,
            2**-14 * 0.99999994,
            2**-24,
            2**-25,
            2**-25 * 1.0000001,
            3 * 2**-26,
            1e-30,
            0.0,
            np.inf,
            0.1,
            1 / 3,
        ],
        dtype=np.float32,
    )
    x = np.concatenate([x, edges, -edges, x * np.float32(2**-100), x * np.float32(2**-120)])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    for flags, lib in _variants():
        got = ckernel.f32_to_f16_bits(x, lib=lib)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, (
            f"[{flags}] f16 of {x[bad[:5]].tolist()}: {got[bad[:5]]} != {want[bad[:5]]}"
        )


def test_no_compiler_falls_back_to_numpy(monkeypatch):
    x = _rng(11).standard_normal((4, 512)).astype(np.float32)
    want = quantize(x, "Q4_K", impl="numpy")
    monkeypatch.setattr(ckernel, "compiler", lambda: None)
    ckernel.load.cache_clear()
    try:
        assert ckernel.library() is None
        assert np.array_equal(quantize(x, "Q4_K"), want)
        with pytest.raises(BadInput, match="not available"):
            quantize(x, "Q4_K", impl="c")
    finally:
        ckernel.load.cache_clear()


@needs_cc
def test_c_quantizer_arg_checks():
    with pytest.raises(BadInput, match="float32"):
        ckernel.quantize_k(np.zeros((2, 128), dtype=np.float32), "Q4_K")
    with pytest.raises(BadInput, match="no C quantizer"):
        ckernel.quantize_k(np.zeros((2, 256), dtype=np.float32), "Q8_0")


def test_requantize_needs_the_flag(tmp_path):
    """llama-quantize's rule: an already quantized tensor converted to another type needs
    --allow-requantize; F32/F16 sources and tensors kept as they are do not."""
    from cli_inproc import error_lines, run_cli
    from synth_data import small_parts, tiny_model, write_small

    q = str(tiny_model(tmp_path, seed=3, qtype="q4_K_M"))
    code, out, err = run_cli(["quantize", q, str(tmp_path / "o.gguf"), "q8_0"])
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "--allow-requantize" in lines[0], err
    assert "already" in lines[0] and not (tmp_path / "o.gguf").exists()
    code, out, err = run_cli(
        ["quantize", q, str(tmp_path / "o.gguf"), "q8_0", "-q", "--allow-requantize"]
    )
    assert code == 0 and (tmp_path / "o.gguf").is_file(), err
    # a q8_0 file to q8_0: every tensor kept (norms F32) -> nothing is requantized
    code, out, err = run_cli(
        ["quantize", str(tmp_path / "o.gguf"), str(tmp_path / "o2.gguf"), "q8_0", "-q"]
    )
    assert code == 0, err
    # F16 / F32 weights (with Q8_0 ones) to f16: only the Q8_0 ones need the flag
    meta, tensors = small_parts(seed=1)
    f = write_small(tmp_path / "f.gguf", meta, tensors)
    code, out, err = run_cli(["quantize", str(f), str(tmp_path / "f16.gguf"), "f16"])
    assert code == 2 and "Q8_0 already" in error_lines(err)[0], err
    plain = [
        (
            n,
            gguf.GGMLQuantizationType.F32 if int(t) == 8 else t,
            s,
            dequantize(np.asarray(d).reshape(-1).view(np.uint8), t).reshape(s)
            if int(t) == 8
            else d,
        )
        for n, t, s, d in tensors
    ]
    f2 = write_small(tmp_path / "f2.gguf", meta, plain)
    code, out, err = run_cli(["quantize", str(f2), str(tmp_path / "q.gguf"), "q8_0", "-q"])
    assert code == 0, err
