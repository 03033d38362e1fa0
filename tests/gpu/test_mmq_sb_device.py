"""The super-block MMQ path on the device (sm_90 only; skips elsewhere), q4_K: the q8s split,
the SB repack and the token tables bit-identical to their numpy twins, the kernel's parity
against its float64 oracle on ragged shapes (= and +=, whole tiles and stream-K, a bitwise
second launch), and the engine on it."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _rand(rng, qtype, N, K):
    from quant_data import rand_q4k

    assert qtype == 12
    return rand_q4k(rng, N, K)


def repack_sb(rt, w, qtype, N, K):
    from minfer.cuda.ops.mmq_sb import repack_q4k_sb

    assert qtype == 12
    return repack_q4k_sb(rt, w, N, K)


def test_split_and_repack_bitwise(hopper, same_bytes):
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq_sb import sb_tokens, split_q8s
    from minfer.quants.mmq_sb_ref import repack_q4k_sb_ref, sb_tokens_ref, split_q8s_ref

    rt = hopper
    rng = np.random.default_rng(5)
    x = rng.standard_normal((77, 1280)).astype(np.float32) * 3
    for xin in (x, x.astype(np.float16)):
        got = split_q8s(rt, da.to_device(rt, xin))
        want = split_q8s_ref(xin.astype(np.float32))
        assert all(same_bytes(a, b) for a, b in zip(got, want))
        # the token operand (images, tables), an all-zero super-block included
        x0 = xin.astype(np.float32)
        x0[3, 256:512] = 0
        aq, ta = split_q8s_ref(x0)
        got = sb_tokens(rt, da.to_device(rt, aq), da.to_device(rt, ta))
        assert same_bytes(got, sb_tokens_ref(aq, ta, 77, 1280))
    w = _rand(rng, 12, 333, 1280)
    r = repack_sb(rt, da.to_device(rt, w), 12, 333, 1280)
    wb = repack_q4k_sb_ref(w, 333, 1280)
    assert same_bytes(r.wb, wb) and r.nbytes == wb.nbytes


@pytest.mark.parametrize("qtype", [12])
@pytest.mark.parametrize("M,N,K,sms", [(77, 333, 1280, None), (1, 8, 256, None),
                                       (129, 200, 512, 3), (300, 1000, 4096, 5),
                                       (512, 640, 2048, 7), (65, 129, 768, 2)])
def test_sb_parity(hopper, qtype, M, N, K, sms):
    """Ragged M / N, whole tiles and stream-K (sms caps the grid below the tile count: split
    tiles), = and +=; a second launch is bitwise the first."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq_sb import mmq_sb_linear
    from minfer.quants.mmq_sb_ref import mmq_sb_linear_ref

    rt = hopper
    rng = np.random.default_rng(M + N + K)
    w = _rand(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if K >= 512:
        x[M // 2, 256:512] = 0   # an all-zero super-block (q4_K: its token unit stays finite)
    ref = mmq_sb_linear_ref(x, w, M, N, K, qtype)
    wr = repack_sb(rt, da.to_device(rt, w), qtype, N, K)
    xd = da.to_device(rt, x)
    outs = []
    for _ in range(2):
        out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
        mmq_sb_linear(rt, xd, wr, M, N, K, out, sms=sms)
        outs.append(out.get())
    assert np.isfinite(outs[0]).all() and np.array_equal(outs[0], outs[1])
    assert np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref) < 1e-4
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    mmq_sb_linear(rt, xd, wr, M, N, K, acc, accumulate=True, sms=sms)
    assert np.linalg.norm(acc.get() - base - ref) / np.linalg.norm(ref) < 1e-4


def test_backend_on_sb(hopper, model):
    """The engine on the sb path: q4_K GEMMs route to sb with SbQ4K weights (fused groups as
    one), q6_K to f16; its logits stay close to the q8_1 wide engine's (a coarser activation
    grid, not another product: greedy identity is `minfer check`'s gate)."""
    from minfer.cuda.backend import CudaBackend
    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.ops.mmq_sb import SbQ4K

    rng = np.random.default_rng(2)
    prompt = rng.integers(0, model.config.vocab_size, 37).astype(np.int32)
    b = CudaBackend(model, GemmChoice("sb"), max_tokens=128, ubatch=16)
    sb = [n for n, (p, _) in b.routes.items() if p == "sb"]
    if not sb:
        pytest.skip(f"{model.path.name}: no q4_K GEMM weight")
    assert "MMQ (sb)" in b.route_summary()
    for n in sb:
        assert b.qtypes[n] == 12
        assert isinstance(b.w[b.fused[n][0] if n in b.fused else n], SbQ4K), n
    got = b.forward(prompt, 0)
    ref = CudaBackend(model, GemmChoice("wide-kd4"), max_tokens=128,
                      ubatch=16).forward(prompt, 0)
    assert np.isfinite(got).all()
    # the swiglu epilogue (default) against the plain gate|up GEMM + swiglu: the same product,
    # split differently only where stream-K cuts tiles
    if any(b.qtypes.get(n) == 12 and n.endswith("ffn_gate.weight") for n in sb):
        assert b.glu, "q4_K gate|up on SB without the swiglu epilogue"
    plain = CudaBackend(model, GemmChoice.parse_ab("sb:no-glu", env={}), max_tokens=128,
                        ubatch=16)
    assert not plain.glu
    pl = plain.forward(prompt, 0)
    assert np.linalg.norm(pl - got) / np.linalg.norm(pl) < 1e-3
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-2
    nxt = b.forward(np.array([int(np.argmax(got))], np.int32), len(prompt))   # M = 1 decode
    assert np.isfinite(nxt).all()


@pytest.mark.parametrize("M,K", [(77, 1280), (130, 512)])
def test_sb_operand_bitwise(hopper, same_bytes, M, K):
    """The one-launch token operand (q8s_sb_operand) from f32 and f16 activations is bitwise
    the split + sb_tokens twins' (an all-zero super-block, ragged M, two token tiles; the
    quantizer's division fallback: quotients on and one ulp off half-integers, a super-block
    whose scale is under 2^-125)."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq_sb import SbTokens, sb_operand
    from minfer.quants.mmq_sb_ref import sb_tokens_ref, split_q8s_ref

    rt = hopper
    rng = np.random.default_rng(M + K)
    x = rng.standard_normal((M, K)).astype(np.float32) * 3
    x[3, 256:512] = 0
    half = (np.arange(-127, 129) + 0.5).astype(np.float32) * 0.5   # x / d = j + 0.5, d = 0.5
    half[-1] = 63.5                                                  # amax = 127 d
    x[4, :256] = half
    x[5, :256] = np.nextafter(half, np.float32(np.inf))
    x[6, :256] = np.nextafter(half, np.float32(-np.inf))
    x[7, :256] = rng.standard_normal(256).astype(np.float32) * np.float32(1e-37)   # d < 2^-125
    for xin in (x, x.astype(np.float16)):
        got = sb_operand(rt, da.to_device(rt, xin))
        assert isinstance(got, SbTokens) and (got.M, got.K) == (M, K)
        x32 = xin.astype(np.float32)
        assert same_bytes(got.tt, sb_tokens_ref(*split_q8s_ref(x32), M, K))


def test_sb_operand_swiglu_bitwise(hopper, same_bytes):
    """The swiglu + token operand launch writes exactly the bytes of swiglu into f16 followed by
    sb_operand, from the fused gate|up output [M, 2F] and from g, u apart."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.layers import swiglu_fused
    from minfer.cuda.ops.mmq_sb import sb_operand, sb_operand_swiglu

    rt = hopper
    M, F = 77, 1280
    rng = np.random.default_rng(9)
    gu = (3 * rng.standard_normal((M, 2 * F))).astype(np.float32)
    gu[5, 256:512] = 0.0   # silu(0) * 0: an all-zero super-block
    gu[5, F + 256:F + 512] = 0.0
    gud = da.to_device(rt, gu)
    f16 = da.empty(rt, (M, F), np.float16)
    swiglu_fused(rt, f16, gud)
    want = sb_operand(rt, f16).tt.get()
    for args in ((gud,), (da.to_device(rt, gu[:, :F].copy()), da.to_device(rt, gu[:, F:].copy()))):
        got = sb_operand_swiglu(rt, *args)
        assert (got.M, got.K) == (M, F) and same_bytes(got.tt, want)


@pytest.mark.parametrize("M,K", [(77, 1280), (130, 4096), (1, 8192)])
def test_sb_operand_rmsnorm_bitwise(hopper, same_bytes, M, K):
    """The rmsnorm + token operand launch writes exactly the bytes of rmsnorm into f16 followed
    by sb_operand (and the twins'), and h16 when asked: the bits of rmsnorm's f16 output."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.layers import rmsnorm
    from minfer.cuda.ops.mmq_sb import SbTokens, sb_operand, sb_operand_rmsnorm
    from minfer.quants.mmq_sb_ref import sb_tokens_ref, split_q8s_ref
    from minfer.reference import ops

    rt = hopper
    rng = np.random.default_rng(M + K)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    x[:, 700:710] *= 40   # an outlier run: super-blocks of very different scales
    w = rng.uniform(0.5, 1.5, K).astype(np.float32)
    w[256:512] = 0   # an all-zero super-block in every token
    xd, wd = da.to_device(rt, x), da.to_device(rt, w)
    h16 = da.empty(rt, (M, K), np.float16)
    rmsnorm(rt, h16, xd, wd, 1e-5)
    want = sb_operand(rt, h16).tt.get()
    got = sb_operand_rmsnorm(rt, xd, wd, 1e-5)
    assert isinstance(got, SbTokens) and (got.M, got.K) == (M, K) and same_bytes(got.tt, want)
    hout = da.to_device(rt, np.full((M, K), np.nan, np.float16))
    got2 = sb_operand_rmsnorm(rt, xd, wd, 1e-5, h16=hout)
    assert same_bytes(got2.tt, want) and same_bytes(hout, h16.get())
    href = ops.rmsnorm(x, w, 1e-5).astype(np.float16)
    assert same_bytes(got.tt, sb_tokens_ref(*split_q8s_ref(href.astype(np.float32)), M, K))


@pytest.mark.parametrize("M,F,K,sms", [(77, 200, 1280, None), (300, 512, 2048, 3)])
def test_sb_swiglu_epilogue(hopper, same_bytes, M, F, K, sms):
    """The gate|up GEMM with the swiglu epilogue (rows interleaved by glu_rows). Built with
    SB_GLU_EXACT (the swiglu layer's rounding) it writes the bits of the plain gate|up GEMM
    followed by the swiglu layer where both run whole tiles (M=77: 4 tiles on the grid): the
    row map is exact. The engine's build (fast exp and division) stays within an f16 ulp of
    that; with stream-K (sms=3: tiles split elsewhere than the plain weight's) within f16
    rounding."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.layers import swiglu_fused
    from minfer.cuda.ops.mmq_sb import mmq_sb_linear, sb_operand
    from minfer.quants.glu import glu_rows
    from quant_data import rand_q4k

    rt = hopper
    rng = np.random.default_rng(M + F)
    w = np.concatenate([rand_q4k(rng, F, K), rand_q4k(rng, F, K)])   # [gate; up] raw rows
    x = (0.02 * rng.standard_normal((M, K))).astype(np.float32)   # (silu(g) u stays in f16)
    tok = sb_operand(rt, da.to_device(rt, x))
    plain = repack_sb(rt, da.to_device(rt, w.reshape(-1)), 12, 2 * F, K)
    glu = repack_sb(rt, da.to_device(rt, w[glu_rows(F)].reshape(-1)), 12, 2 * F, K)
    gu = da.to_device(rt, np.full((M, 2 * F), np.nan, np.float32))
    mmq_sb_linear(rt, tok, plain, M, 2 * F, K, gu, sms=sms)
    want = da.empty(rt, (M, F), np.float16)
    swiglu_fused(rt, want, gu)
    b = want.get().astype(np.float32)
    assert np.isfinite(b).all() and np.abs(b).max() > 0
    for opts in (("-DSB_GLU_EXACT",), ()):
        got = da.to_device(rt, np.full((M, F), np.nan, np.float16))
        mmq_sb_linear(rt, tok, glu, M, 2 * F, K, got, sms=sms, swiglu=True, build_opts=opts)
        if sms is None and opts:
            assert same_bytes(got, want.get())
        a = got.get().astype(np.float32)
        tol = (2.0 ** -10 if sms is None else 2e-3) * np.maximum(np.abs(b), 2.0 ** -14)
        assert (np.abs(a - b) <= tol).all(), (opts, float(np.abs(a - b).max()))


def test_sb_linear_takes_the_token_operand(hopper):
    """mmq_sb_linear on an SbTokens gives the bits it gives on x; another shape refuses it."""
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.ops.mmq_sb import mmq_sb_linear, sb_operand
    from minfer.errors import GPUError

    rt = hopper
    rng = np.random.default_rng(11)
    M, N, K = 130, 200, 768
    x = da.to_device(rt, rng.standard_normal((M, K)).astype(np.float32))
    w = repack_sb(rt, da.to_device(rt, _rand(rng, 12, N, K)), 12, N, K)
    a, b = (da.empty(rt, (M, N), np.float32) for _ in range(2))
    mmq_sb_linear(rt, x, w, M, N, K, a)
    tok = sb_operand(rt, x)
    mmq_sb_linear(rt, tok, w, M, N, K, b)
    assert np.array_equal(a.get(), b.get())
    with pytest.raises(GPUError, match="token operand"):
        mmq_sb_linear(rt, tok, w, M - 1, N, K, da.empty(rt, (M - 1, N), np.float32))
