"""The Hopper wgmma MMQ path on the device (sm_90 only; skips elsewhere), q4_K and q6_K: the
split prepasses and the weight repacks bit-identical to their numpy twins, the kernels' parity
against mmq_ref on ragged shapes (= and +=), and the engine on them (routes, repacked weights,
logits)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _weights(rng, qtype, N, K):
    from test_mmq_wgmma import rand_q4k, rand_q6k

    return (rand_q6k if qtype == 14 else rand_q4k)(rng, N, K)


def _split(qtype):
    from minfer.cuda.mmq_wgmma import split6_q8_1, split_q8_1
    from minfer.quants.mmq_wgmma_ref import split6_q8_1_ref, split_q8_1_ref

    return (split6_q8_1, split6_q8_1_ref) if qtype == 14 else (split_q8_1, split_q8_1_ref)


@pytest.mark.parametrize("qtype", [12, 14])
def test_split_and_repack_bitwise(hopper, same_bytes, qtype):
    from minfer.cuda import devarray as da
    from minfer.cuda.mmq_wgmma import repack
    from minfer.quants.mmq_wgmma_ref import repack_q4k_ref, repack_q6k_ref

    rt = hopper
    split, split_ref = _split(qtype)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((77, 1280)).astype(np.float32)
    for xin in (x, x.astype(np.float16)):
        got, want = split(rt, da.to_device(rt, xin)), split_ref(xin.astype(np.float32))
        assert all(same_bytes(a, b) for a, b in zip(got, want))
    w = _weights(rng, qtype, 333, 1280)
    r = repack(rt, da.to_device(rt, w), qtype, 333, 1280)
    rwq, rtw = (repack_q6k_ref if qtype == 14 else repack_q4k_ref)(w, 333, 1280)
    assert same_bytes(r.wq, rwq) and same_bytes(r.tw, rtw)
    assert r.nbytes == rwq.nbytes + rtw.nbytes


@pytest.mark.parametrize("qtype", [12, 14])
@pytest.mark.parametrize("M,F", [(1, 128), (77, 1280), (300, 384)])
def test_split_swiglu_bitwise(hopper, qtype, M, F):
    """The swiglu + prepass launch writes exactly the bytes of swiglu into f16 followed by the
    split prepass of the type, from the fused gate|up output [M, 2F] and from g, u apart."""
    from minfer.cuda import devarray as da
    from minfer.cuda.layers import swiglu_fused
    from minfer.cuda.mmq_wgmma import split_swiglu
    from minfer.quants.mmq_wgmma_ref import split_swiglu_ref

    rt = hopper
    split, _ = _split(qtype)
    rng = np.random.default_rng(M + F)
    gu = (3 * rng.standard_normal((M, 2 * F))).astype(np.float32)
    gu[0, :7] = 0.0   # silu(0) * u = 0: a block with zeros
    gud = da.to_device(rt, gu)
    f16 = da.empty(rt, (M, F), np.float16)
    swiglu_fused(rt, f16, gud)
    want = [w.get() for w in split(rt, f16)]
    for args in ((gud,), (da.to_device(rt, gu[:, :F].copy()), da.to_device(rt, gu[:, F:].copy()))):
        got = split_swiglu(rt, qtype, *args)
        assert all(np.array_equal(a.get().view(np.uint8), w.view(np.uint8))
                   for a, w in zip(got, want))
    # the numpy twin: np.exp and the device's expf may put a value on either side of an f16
    # rounding boundary, so almost every byte, not all
    twin = split_swiglu_ref(qtype, gu)
    vals = [np.ascontiguousarray(w).view(np.uint8).ravel() for w in want]
    ref = [np.ascontiguousarray(r).view(np.uint8).ravel() for r in twin]
    assert vals[0].shape == ref[0].shape and np.mean(vals[0] == ref[0]) > 0.99
    assert np.mean(vals[1] == ref[1]) > 0.99


@pytest.mark.parametrize("qtype", [12, 14])
@pytest.mark.parametrize("M,N,K", [(1, 8, 256), (77, 333, 1280), (128, 128, 512),
                                   (129, 200, 512), (65, 129, 768), (300, 1000, 4096)])
def test_parity_ragged(hopper, qtype, M, N, K):
    from minfer.cuda import devarray as da
    from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack
    from minfer.quants.mmq_ref import mmq_linear_ref

    rt = hopper
    split, _ = _split(qtype)
    rng = np.random.default_rng(M * N + qtype)
    w = _weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, qtype, M, N, K)
    wr = repack(rt, da.to_device(rt, w), qtype, N, K)
    xd = da.to_device(rt, x)
    out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
    mmq_wgmma_linear(rt, xd, wr, M, N, K, out)
    y = out.get()
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4   # measured ~1e-6; gate 1e-3
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    mmq_wgmma_linear(rt, split(rt, xd), wr, M, N, K, acc, accumulate=True)
    assert np.linalg.norm(acc.get() - base - ref) / np.linalg.norm(ref) < 1e-4


@pytest.mark.parametrize("qtype", [12, 14])
@pytest.mark.parametrize("M,N,K", [(200, 300, 768), (77, 333, 1280), (300, 1000, 512),
                                   (129, 129, 256)])
@pytest.mark.parametrize("cap", ["most", "fewest"])
def test_stream_k(hopper, qtype, M, N, K, cap):
    """Stream-K on a grid capped below the tile count (so small ragged problems split tiles by
    k): `most` = the largest cap that leaves a ragged wave (all tiles stream-K), `fewest` = the
    smallest (whole waves round-robin, then stream-K). Parity against mmq_ref (= and +=), the
    same sums as whole tiles up to f32 reassociation, and bitwise the same output on a second
    launch (a fixed summation order; the flags the first launch raised were all cleared)."""
    from minfer.cuda import devarray as da
    from minfer.cuda.mmq_wgmma import mmq_wgmma_linear, repack
    from minfer.cuda.stream_k import schedule
    from minfer.quants.mmq_ref import mmq_linear_ref

    rt = hopper
    tiles = -(-M // (64 if qtype == 14 else 128)) * -(-N // 128)
    caps = [s for s in range(2, tiles) if tiles % s]
    sms = caps[-1] if cap == "most" else caps[0]
    grid, dp = schedule(tiles, sms)
    assert dp < tiles and grid == sms
    rng = np.random.default_rng(M + N + K + qtype)
    w = _weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, qtype, M, N, K)
    wr = repack(rt, da.to_device(rt, w), qtype, N, K)
    xd = da.to_device(rt, x)
    outs = []
    for sk in (True, True, False):
        out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
        mmq_wgmma_linear(rt, xd, wr, M, N, K, out, stream_k=sk, sms=sms)
        outs.append(out.get())
    y, y2, whole = outs
    assert np.isfinite(y).all() and np.array_equal(y, y2)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4
    assert np.abs(y - whole).max() <= 1e-5 * np.abs(whole).max()
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    mmq_wgmma_linear(rt, xd, wr, M, N, K, acc, accumulate=True, sms=sms)
    assert np.linalg.norm(acc.get() - base - ref) / np.linalg.norm(ref) < 1e-4


@pytest.mark.parametrize("qtype", [12, 14])
def test_mmq_linear_routes_to_wgmma(hopper, qtype):
    """mmq_linear on the wgmma config: raw weights are repacked per call, raw q8_1 activations
    (a form the wgmma kernels cannot read) run the wide kernel, and both say which ran; with
    wgmma_q6k off, q6_K runs the wide kernel."""
    from minfer.cuda import devarray as da
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq import mmq_linear, quantize_q8_1
    from minfer.quants.mmq_ref import mmq_linear_ref

    rt = hopper
    rng = np.random.default_rng(9)
    M, N, K = 40, 96, 512
    w = _weights(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ref = mmq_linear_ref(x, w, qtype, M, N, K)
    wd, xd = da.to_device(rt, w), da.to_device(rt, x)
    q4only = "wide" if qtype == 14 else "wgmma"
    for xin, cfg, kind in ((xd, GemmConfig(mmq=True), "wgmma"),
                           (quantize_q8_1(rt, xd), GemmConfig(mmq=True), "wide"),
                           (xd, GemmConfig(mmq=True, wgmma_q6k=False), q4only)):
        out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
        v = mmq_linear(rt, xin, wd, qtype, M, N, K, cfg, out)
        assert v.kind == kind
        assert np.linalg.norm(out.get() - ref) / np.linalg.norm(ref) < 1e-4


def test_backend_on_wgmma(hopper, model):
    """The engine with MMQ on: q4_K and q6_K GEMMs route to mmq-wgmma with repacked weights
    (fused groups as one); logits match the wide-kernel engine's."""
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.config import GemmConfig
    from minfer.cuda.mmq_wgmma import WgmmaQ4K, WgmmaQ6K

    rng = np.random.default_rng(2)
    prompt = rng.integers(0, model.config.vocab_size, 37).astype(np.int32)
    b = CudaBackend(model, GemmConfig(mmq=True), max_tokens=128, ubatch=16)
    wg = [n for n, (p, _) in b.routes.items() if p == "mmq-wgmma"]
    if not wg:
        pytest.skip(f"{model.path.name}: no q4_K GEMM weight")
    assert "mmq-wgmma" in b.route_summary()
    for n in wg:
        key = b.fused[n][0] if n in b.fused else n
        want = WgmmaQ6K if b.qtypes[n] == 14 else WgmmaQ4K
        assert isinstance(b.w[key], want), key
    got = b.forward(prompt, 0)
    ref = CudaBackend(model, GemmConfig(mmq=True, wgmma=False), max_tokens=128,
                      ubatch=16).forward(prompt, 0)
    assert np.isfinite(got).all()
    # same math, other summation order: the q8_1 prepass of the next GEMM's input turns f32
    # differences into whole quantization steps, so engines differ at ~1e-2 (test_backend_mmq
    # holds MMQ vs f16 to 3e-2; greedy identity is `minfer check`'s gate)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 3e-2
    nxt = b.forward(np.array([int(np.argmax(got))], np.int32), len(prompt))   # M = 1 decode
    assert np.isfinite(nxt).all()
    # the fused swiglu + prepass of a wgmma ffn_down writes the bytes of swiglu -> f16 ->
    # prepass, so the engine's logits are bitwise those of the unfused flow
    downs = [n for n in wg if n.endswith("ffn_down.weight")]
    assert downs, "the Q4_K_M mix puts ffn_down on wgmma"
    b.reset()
    b2 = CudaBackend(model, GemmConfig(mmq=True, fused_prepass=False), max_tokens=128, ubatch=16)
    assert np.array_equal(b.forward(prompt, 0), b2.forward(prompt, 0))
