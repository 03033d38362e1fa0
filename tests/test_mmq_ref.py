"""CPU: q8_1 raw layout + quantizer, and the MMQ numpy reference against dequant products."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.q8_1.twin import Q4_K, Q6_K, decode_q6k, mmq_linear_ref
from minfer.errors import BadInput
from minfer.quants import dequantize
from minfer.quants.q8_1 import Q8_1_RAW, dequantize_q8_1_raw, quantize_q8_1_raw, unpack_q8_1_raw


def rand_weights(rng, qtype, N, K):
    kb = K // 256
    nbytes = 144 if qtype == Q4_K else 210
    w = rng.integers(0, 256, (N, kb, nbytes), dtype=np.uint8)
    offs = (0, 2) if qtype == Q4_K else (208,)
    for off in offs:
        w[..., off : off + 2] = (
            rng.uniform(1e-4, 2e-2, (N, kb)).astype(np.float16).view(np.uint8).reshape(N, kb, 2)
        )
    return w.reshape(N, -1)


def test_q8_1_layout():
    assert Q8_1_RAW.itemsize == 40
    assert [Q8_1_RAW.fields[k][1] for k in ("d", "q", "s")] == [0, 4, 36]
    assert Q8_1_RAW.fields["d"][0] == np.dtype("<f2")
    assert Q8_1_RAW.fields["s"][0] == np.dtype("<i4")


def test_q8_1_quantizer_values():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 96)) * 3).astype(np.float32)
    x[1, 32:64] = 0.0
    raw = quantize_q8_1_raw(x)
    assert raw.dtype == np.uint8 and raw.shape == (5, 3 * 40)
    d, q, s = unpack_q8_1_raw(raw, 96)
    xb = x.reshape(5, 3, 32)
    amax = np.abs(xb).max(-1)
    np.testing.assert_array_equal(d, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.abs(q).max() == 127 and (q.reshape(5, 3, 32)[1, 1] == 0).all() and d[1, 1] == 0
    np.testing.assert_array_equal(s, q.reshape(5, 3, 32).astype(np.int32).sum(-1))
    # round half away from zero (roundf), not numpy's half-to-even
    y = np.zeros((1, 32), np.float32)
    y[0, 0], y[0, 1], y[0, 2] = 127.0, 2.5, -0.5  # d = 1 exactly
    q1 = unpack_q8_1_raw(quantize_q8_1_raw(y), 32)[1][0]
    assert (q1[0], q1[1], q1[2]) == (127, 3, -1)
    err = np.abs(dequantize_q8_1_raw(raw, 96) - x).max(-1)
    assert (err <= amax.max(-1) / 127 * 0.51 + 1e-3).all()


def test_q8_1_bad_shape():
    with pytest.raises(BadInput):
        quantize_q8_1_raw(np.zeros((2, 33), np.float32))


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("M,N,K", [(1, 1, 256), (37, 45, 512), (64, 128, 1024), (19, 7, 768)])
def test_mmq_ref_matches_dequant_product(qtype, M, N, K):
    rng = np.random.default_rng(M * 1000 + N + qtype)
    w = rand_weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    a = quantize_q8_1_raw(x)
    y = mmq_linear_ref(a, w, qtype, M, N, K)
    W = dequantize(w, qtype).reshape(N, K).astype(np.float64)
    r = dequantize_q8_1_raw(a, K).astype(np.float64) @ W.T
    assert y.dtype == np.float32 and y.shape == (M, N)
    assert np.linalg.norm(y - r) <= 1e-5 * np.linalg.norm(r)
    # f32 input path quantizes the same way
    np.testing.assert_array_equal(mmq_linear_ref(x, w, qtype, M, N, K), y)
    # a wrong rank-1 term or scale is caught: perturb one min/scale byte
    w2 = w.copy()
    w2[0, 5] ^= 0x3F
    y2 = mmq_linear_ref(a, w2, qtype, M, N, K)
    assert not np.allclose(y2[:, 0], y[:, 0])


def test_mmq_ref_accumulate_and_errors():
    rng = np.random.default_rng(7)
    w = rand_weights(rng, Q4_K, 9, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    base = rng.standard_normal((3, 9)).astype(np.float32)
    out = base.copy()
    mmq_linear_ref(x, w, Q4_K, 3, 9, 256, out=out, accumulate=True)
    np.testing.assert_allclose(out, base + mmq_linear_ref(x, w, Q4_K, 3, 9, 256), rtol=1e-6)
    with pytest.raises(BadInput):
        mmq_linear_ref(x, w, 8, 3, 9, 256)  # q8_0: no MMQ math
    with pytest.raises(BadInput):
        mmq_linear_ref(x[:, :128], w, Q4_K, 3, 9, 128)  # K not a multiple of 256


def test_q6k_unsigned_derivation():
    """Fed unsigned (q in 0..63), each 16-half needs -32*da*dsv_h*s_h with s_h the A sum of
    that half: equal to the signed form the kernels use (docs/mmq.md)."""
    rng = np.random.default_rng(3)
    N, K, M = 5, 256, 4
    w = rand_weights(rng, Q6_K, N, K)
    a = quantize_q8_1_raw(rng.standard_normal((M, K)).astype(np.float32))
    da_, qa, _ = unpack_q8_1_raw(a, K)
    dsv16, qm = decode_q6k(w, N, K)
    qu = qm.astype(np.int64) + 32
    y = np.zeros((M, N))
    for c in range(K // 32):
        for h in range(2):
            ks = slice(32 * c + 16 * h, 32 * c + 16 * h + 16)
            S = qa[:, ks].astype(np.int64) @ qu[:, ks].T
            s_h = qa[:, ks].astype(np.int64).sum(1)
            y += da_[:, c, None] * dsv16[None, :, 2 * c + h] * (S - 32 * s_h[:, None])
    ref = mmq_linear_ref(a, w, Q6_K, M, N, K)
    assert np.linalg.norm(y - ref) <= 1e-6 * np.linalg.norm(ref)
