"""numpy reference ops vs straightforward float64 formulas (ragged shapes), and the backend's
KV-cache behaviour on the real model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tolerance

from minfer.errors import BadInput
from minfer.reference import ops
from minfer.reference.forward import ReferenceBackend, quantize_act, round_f16

RNG = np.random.default_rng(7)


def _rope_loop(x, pos, base, rope_dim, neox):
    """Textbook RoPE, one element pair at a time, in float64."""
    x = np.asarray(x, np.float64)
    out = x.copy()
    T, H, D = x.shape
    for t in range(T):
        for i in range(rope_dim // 2):
            th = pos[t] * base ** (-2.0 * i / rope_dim)
            c, s = math.cos(th), math.sin(th)
            a, b = (i, i + rope_dim // 2) if neox else (2 * i, 2 * i + 1)
            for h in range(H):
                out[t, h, a] = x[t, h, a] * c - x[t, h, b] * s
                out[t, h, b] = x[t, h, a] * s + x[t, h, b] * c
    return out


def _attention_loop(q, k, v, pos0):
    """Per query, per head: explicit causal softmax over keys 0..pos0+t, kv head h // G."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    T, Hq, D = q.shape
    G = Hq // k.shape[1]
    out = np.zeros_like(q)
    for t in range(T):
        n = pos0 + t + 1
        for h in range(Hq):
            s = k[:n, h // G] @ q[t, h] / math.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[:n, h // G]
    return out


@pytest.mark.parametrize("T,D", [(1, 5), (7, 64), (3, 576)])
def test_rmsnorm(T, D):
    x = RNG.standard_normal((T, D)) * 3
    w = RNG.standard_normal(D)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w
    got64 = ops.rmsnorm(x, w, 1e-5)
    assert got64.dtype == np.float64 and np.allclose(got64, want, rtol=1e-12, atol=1e-12)
    got32 = ops.rmsnorm(x.astype(np.float32), w.astype(np.float32), 1e-5)
    assert got32.dtype == np.float32 and np.allclose(got32, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize(
    "T,H,D,rope_dim,pos0",
    [(1, 1, 2, 2, 0), (5, 3, 64, 64, 0), (4, 2, 64, 32, 100), (3, 9, 64, 64, 4000)],
)
def test_rope_vs_loop(neox, T, H, D, rope_dim, pos0):
    x = RNG.standard_normal((T, H, D))
    pos = np.arange(pos0, pos0 + T)
    want = _rope_loop(x, pos, 100000.0, rope_dim, neox)
    got = ops.rope(x, pos, 100000.0, rope_dim, neox)
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=1e-10, atol=1e-10)
    assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:])  # pass-through dims
    # float32 (ggml's running-product theta) stays close to the exact angles: the error of
    # theta grows with pos (float32 theta at pos 4000 has an ulp of ~2.4e-4)
    got32 = ops.rope(x.astype(np.float32), pos, 100000.0, rope_dim, neox)
    assert got32.dtype == np.float32
    assert np.abs(got32 - want).max() < 2e-5 + 2e-7 * pos0 * np.abs(x).max()


def test_rope_modes_differ_and_pairs_are_adjacent():
    # normal mode mixes x[0] with x[1]; neox mixes x[0] with x[D/2]
    x = np.zeros((1, 1, 8))
    x[0, 0, 1] = 1.0
    n = ops.rope(x, np.array([1]), 10000.0, 8, neox=False)
    z = ops.rope(x, np.array([1]), 10000.0, 8, neox=True)
    assert n[0, 0, 0] == pytest.approx(-math.sin(1.0)) and n[0, 0, 4] == 0
    assert z[0, 0, 0] == 0 and z[0, 0, 1] == pytest.approx(math.cos(10000**-0.25))


def test_rope_cos_sin_follows_ggml_running_product():
    # ggml: theta_scale = powf(base, -2/n_dims); theta = p; theta *= theta_scale (float each step)
    pos = np.array([0, 1, 37, 480, 8191])
    c, s = ops.rope_cos_sin(pos, 100000.0, 64, np.float32)
    ts = np.float32(np.float32(100000.0) ** np.float32(-2.0 / 64))
    for t, p in enumerate(pos):
        th = np.float32(p)
        for i in range(32):
            assert c[t, i] == np.float32(math.cos(float(th))), (p, i)
            assert s[t, i] == np.float32(math.sin(float(th))), (p, i)
            th = np.float32(th * ts)


def test_rope_rejects_bad_shapes():
    with pytest.raises(ValueError, match="rope_dim"):
        ops.rope(np.zeros((2, 1, 8)), np.arange(2), 1e4, 10, False)
    with pytest.raises(ValueError, match="pos"):
        ops.rope(np.zeros((2, 1, 8)), np.arange(3), 1e4, 8, False)


@pytest.mark.parametrize(
    "T,pos0,Hq,Hkv,D,extra",
    [(1, 0, 1, 1, 4, 0), (5, 0, 9, 3, 64, 0), (3, 6, 4, 2, 16, 5), (1, 11, 6, 1, 8, 0)],
)
def test_attention_vs_loop(T, pos0, Hq, Hkv, D, extra):
    q = RNG.standard_normal((T, Hq, D))
    k = RNG.standard_normal((pos0 + T + extra, Hkv, D))
    v = RNG.standard_normal((pos0 + T + extra, Hkv, D))
    got = ops.attention(q, k, v, pos0)
    assert got.dtype == np.float64 and got.shape == (T, Hq, D)
    assert np.allclose(got, _attention_loop(q, k, v, pos0), rtol=1e-10, atol=1e-12)
    got32 = ops.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), pos0)
    assert got32.dtype == np.float32 and np.allclose(got32, got, atol=1e-5)


def test_attention_is_causal_and_groups_heads():
    T, Hq, Hkv, D = 6, 4, 2, 8
    q = RNG.standard_normal((T, Hq, D))
    k = RNG.standard_normal((T, Hkv, D))
    v = RNG.standard_normal((T, Hkv, D))
    base = ops.attention(q, k, v, 0)
    k2, v2 = k.copy(), v.copy()
    k2[4:] += 10
    v2[4:] -= 10  # future of queries 0..3
    moved = ops.attention(q, k2, v2, 0)
    assert np.array_equal(moved[:4], base[:4]) and not np.allclose(moved[4:], base[4:])
    # query heads 0,1 read KV head 0; heads 2,3 read KV head 1
    k3 = k.copy()
    k3[:, 1] = RNG.standard_normal((T, D))
    g = ops.attention(q, k3, v, 0)
    assert np.array_equal(g[:, :2], base[:, :2]) and not np.allclose(g[:, 2:], base[:, 2:])
    with pytest.raises(ValueError, match="multiple"):
        ops.attention(np.zeros((1, 3, 8)), np.zeros((1, 2, 8)), np.zeros((1, 2, 8)), 0)
    with pytest.raises(ValueError, match="cached keys"):
        ops.attention(np.zeros((2, 2, 8)), np.zeros((2, 2, 8)), np.zeros((2, 2, 8)), 1)


def test_swiglu_linear_embedding():
    g, u = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 5))
    assert np.allclose(ops.swiglu(g, u), g / (1 + np.exp(-g)) * u)
    assert ops.swiglu(g.astype(np.float32), u.astype(np.float32)).dtype == np.float32
    x, w, b = RNG.standard_normal((3, 7)), RNG.standard_normal((5, 7)), RNG.standard_normal(5)
    assert np.allclose(ops.linear(x, w, b), np.einsum("tk,nk->tn", x, w) + b)
    table = RNG.standard_normal((10, 4))
    assert np.array_equal(ops.embedding(table, np.array([3, 3, 9])), table[[3, 3, 9]])
    with pytest.raises(ValueError, match="out of range"):
        ops.embedding(table, np.array([10]))


def test_round_f16_equals_numpy_cast():
    parts = [
        RNG.standard_normal(20000).astype(np.float32) * s
        for s in (1e-9, 1e-6, 3e-5, 1e-3, 1, 300, 3e4, 1e5)
    ]
    h = RNG.standard_normal(20000).astype(np.float16).astype(np.float32)
    ties = (h.astype(np.float64) * (1 + 2.0**-11)).astype(np.float32)  # halfway cases
    edges = np.array(
        [0, -0.0, 65504, 65519, 65520, -65520, 2**-14, 2**-24, 2**-25, 3 * 2**-26, -(2**-25)],
        np.float32,
    )
    x = np.concatenate(parts + [h, ties, np.nextafter(h, np.float32(1e9)), edges])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = round_f16(x)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    x64 = x.astype(np.float64)[:100]
    assert round_f16(x64).dtype == np.float64


def test_quantize_act_q8_grid():
    import gguf

    x = (RNG.standard_normal((3, 64)) * 5).astype(np.float32)
    x[1, :32] = 0  # an all-zero block stays zero
    y = quantize_act(x, int(gguf.GGMLQuantizationType.Q4_1))
    b, yb = x.reshape(3, 2, 32), y.reshape(3, 2, 32)
    d = (np.abs(b).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    q = np.divide(yb, d, out=np.zeros_like(yb), where=d > 0)
    assert np.allclose(q, np.rint(q), atol=1e-4) and np.abs(q).max() <= 127
    # q is computed with the unrounded 127/amax, so the f16 rounding of d adds up to 127|dd|
    d_exact = np.abs(b).max(-1, keepdims=True) / 127
    bound = 0.5 * d + 127 * np.abs(d - d_exact) + 1e-6
    assert np.all(np.abs(yb - b) <= bound) and not np.array_equal(y, x)
    assert np.array_equal(quantize_act(x, int(gguf.GGMLQuantizationType.F32)), x)
    # q8_K (k-quant weights): blocks of 256, d = max / -127 with max the signed extreme
    xk = (RNG.standard_normal((2, 512)) * 3).astype(np.float32)
    yk = quantize_act(xk, int(gguf.GGMLQuantizationType.Q4_K)).reshape(2, 2, 256)
    bk = xk.reshape(2, 2, 256)
    ext = np.take_along_axis(bk, np.abs(bk).argmax(-1)[..., None], -1)
    qk = yk / (ext / -127)
    assert np.allclose(qk, np.rint(qk), atol=1e-3) and np.abs(qk).max() <= 127.001
    assert np.allclose(yk[np.abs(bk) == np.abs(ext)], bk[np.abs(bk) == np.abs(ext)])


# -- the backend on the real model --------------------------------------------------------------
@pytest.fixture(scope="module")
def small_backend(default_model):
    return ReferenceBackend(default_model, max_tokens=16)


@pytest.fixture(scope="module")
def small_oracle(default_model):
    return ReferenceBackend(default_model, dtype=np.float64, max_tokens=16)


def _whole_and_chunked(be, kv_f16):
    """The last logits of 7 tokens at once, and in chunks of 3, 3, 1."""
    ids = np.array([504, 1462, 282, 260, 3575, 2240, 282], np.int32)
    be.kv_f16 = kv_f16
    try:
        be.reset()
        whole = be.forward(ids, 0)
        be.reset()
        be.forward(ids[:3], 0)
        be.forward(ids[3:6], 3)
        return whole, be.forward(ids[6:], 6)
    finally:
        be.kv_f16 = True


@pytest.mark.identity
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("kv_f16", [False, True])
def test_chunked_prefill_equals_one_shot(small_backend, small_oracle, kv_f16, dtype):
    """Prefill in chunks == prefill at once, to tests/tolerance.py's rule: only BLAS blocking
    differs (sums in another order). In f32 with the f16 KV emulation such ulp changes can flip
    f16 roundings of q, K, V and the probabilities, which 30 layers carry to the size of the
    f32 forward's own error: measured here against the f64 oracle."""
    w64, p64 = _whole_and_chunked(small_oracle, kv_f16)
    s = tolerance.scale(w64)
    if dtype == "f64":
        whole, part, tol = w64, p64, tolerance.f64_tol(small_oracle.cfg, s)
    else:
        whole, part = _whole_and_chunked(small_backend, kv_f16)
        tol = tolerance.f32_tol(tolerance.f32_err([(whole, w64)]), s)
    assert whole.dtype == np.float32 and whole.shape == (small_backend.cfg.vocab_size,)
    assert np.abs(whole - part).max() <= tol


def test_backend_errors(small_backend):
    be = small_backend
    be.reset()
    with pytest.raises(BadInput, match="pos0 3"):
        be.forward(np.array([1], np.int32), 3)
    with pytest.raises(BadInput, match="out of range"):
        be.forward(np.array([be.cfg.vocab_size], np.int32), 0)
    with pytest.raises(BadInput, match="non-empty"):
        be.forward(np.array([], np.int32), 0)
    with pytest.raises(BadInput, match="exceed"):
        be.reserve(be.cfg.n_ctx + 1)
    with pytest.raises(BadInput, match="dtype"):
        ReferenceBackend(be.model, dtype=np.float16)
    cap = be._k[0].shape[0]
    assert cap < 1000  # sized from the request, not n_ctx
    be.reserve(cap + 1)
    assert cap < be._k[0].shape[0] <= be.cfg.n_ctx
