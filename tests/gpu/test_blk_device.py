"""The block-scaled int8 path on the device (sm_90 only; skips elsewhere): the token and weight
operands bit-identical to their numpy twins (minfer.cuda.paths.blk.twin), the GEMM's parity against
its float64 twin on ragged M, N, K (= and +=, the swiglu epilogue, whole tiles and stream-K,
both fold builds, a bitwise second launch), with one activation scale per (token, 128) and per
token (the mmq_blk_tok entries, whose fold runs once per pair of blocks: the weight's scale;
K = 576, 1000, 2944: an odd block count, and stream-K parts starting at odd blocks; more token
tiles than a group of the tile order, the last group ragged)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _x(rng, M, K):
    x = (rng.standard_normal((M, K)) * 2).astype(np.float16)
    x[:, 3 % K] *= 40  # an outlier channel
    if M > 2:
        x[1] = 0  # an all-zero row: scale 0
    return x


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("M,K", [(1, 128), (77, 576), (130, 1000), (300, 4096), (9, 2944)])
def test_blk_operands_bitwise(hopper, same_bytes, M, K, per_token):
    from minfer.cuda.paths.blk.launch import blk_operand, blk_weight
    from minfer.cuda.paths.blk.twin import blk_operand as op_ref
    from minfer.cuda.paths.blk.twin import quantize_blk
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    rng = np.random.default_rng(M + K)
    x = _x(rng, M, K)
    got = blk_operand(rt, da.to_device(rt, x), per_token=per_token)
    assert got.per_token == per_token
    assert same_bytes(got.tt, op_ref(*quantize_blk(x, per_token=per_token)))
    w = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)
    gw = blk_weight(rt, da.to_device(rt, w))
    assert same_bytes(gw.wb, op_ref(*quantize_blk(w, weight=True)))


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("M,K", [(77, 576), (130, 4096), (1, 8192), (3, 1000)])
def test_blk_operand_rmsnorm_bitwise(hopper, same_bytes, M, K, per_token):
    """The rmsnorm + blk operand launch writes exactly the bytes of rmsnorm into f16 followed by
    blk_operand (and the twin's), and h16 when asked: the bits of rmsnorm's f16 output."""
    from minfer.cuda.ops.layers import rmsnorm
    from minfer.cuda.paths.blk.launch import BlkTokens, blk_operand, blk_operand_rmsnorm
    from minfer.cuda.paths.blk.twin import blk_operand as op_ref
    from minfer.cuda.paths.blk.twin import quantize_blk
    from minfer.cuda.runtime import devarray as da
    from minfer.reference import ops

    rt = hopper
    rng = np.random.default_rng(M + K)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    x[:, 300:310] *= 40  # an outlier run
    w = rng.uniform(0.5, 1.5, K).astype(np.float32)
    w[128:256] = 0  # an all-zero block in every token
    xd, wd = da.to_device(rt, x), da.to_device(rt, w)
    h16 = da.empty(rt, (M, K), np.float16)
    rmsnorm(rt, h16, xd, wd, 1e-5)
    want = blk_operand(rt, h16, per_token=per_token).tt.get()
    got = blk_operand_rmsnorm(rt, xd, wd, 1e-5, per_token=per_token)
    assert isinstance(got, BlkTokens) and (got.M, got.K, got.per_token) == (M, K, per_token)
    assert same_bytes(got.tt, want)
    hout = da.to_device(rt, np.full((M, K), np.nan, np.float16))
    got2 = blk_operand_rmsnorm(rt, xd, wd, 1e-5, h16=hout, per_token=per_token)
    assert same_bytes(got2.tt, want) and same_bytes(hout, h16.get())
    href = ops.rmsnorm(x, w, 1e-5).astype(np.float16)
    assert same_bytes(got.tt, op_ref(*quantize_blk(href, per_token=per_token)))


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("M,K", [(77, 576), (130, 4096), (1, 8192)])
def test_blk_operand_olmo2_forms_bitwise(hopper, same_bytes, M, K, per_token):
    """A family without pre-norms (olmo2): the operand launch with no weight writes the bytes
    of to_f16 then blk_operand; with t it adds the post-norm into x first, x's bits those of
    gemma_layers.rmsnorm_add, then the operand of f16(x) (and h16 when asked)."""
    from minfer.cuda.ops.gemma_layers import rmsnorm_add
    from minfer.cuda.ops.layers import to_f16
    from minfer.cuda.paths.blk.launch import blk_operand, blk_operand_rmsnorm
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    rng = np.random.default_rng(M * K + 5)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    t = (rng.standard_normal((M, K)) * 50).astype(np.float32)
    w = rng.uniform(0.5, 1.5, K).astype(np.float32)
    h16 = da.empty(rt, (M, K), np.float16)
    # f16(x)
    xd = da.to_device(rt, x)
    to_f16(rt, h16, xd)
    want = blk_operand(rt, h16, per_token=per_token).tt.get()
    got = blk_operand_rmsnorm(rt, xd, None, 1e-5, per_token=per_token)
    assert same_bytes(got.tt, want) and same_bytes(xd, x)
    # x += rmsnorm(t) * w, then f16(x)
    x1, td, wd = da.to_device(rt, x), da.to_device(rt, t), da.to_device(rt, w)
    rmsnorm_add(rt, x1, td, wd, 1e-5)
    to_f16(rt, h16, x1)
    want = blk_operand(rt, h16, per_token=per_token).tt.get()
    x2 = da.to_device(rt, x)
    hout = da.to_device(rt, np.full((M, K), np.nan, np.float16))
    got = blk_operand_rmsnorm(rt, x2, wd, 1e-5, h16=hout, per_token=per_token, t=td)
    assert same_bytes(x2, x1.get()) and same_bytes(got.tt, want) and same_bytes(hout, h16.get())
    assert same_bytes(td, t)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize(
    "M,N,K,sms,opts",
    [
        (77, 333, 576, None, ()),
        (1, 16, 128, None, ()),
        (129, 200, 1000, 3, ()),
        (300, 1024, 4096, 5, ()),
        (512, 640, 2048, 7, ("-DBLK_FOLD=1",)),
        (65, 129, 768, 2, ("-DBLK_FOLD=1",)),
        (256, 512, 4096, None, ("-DBLK_STAGES=4",)),
        (200, 384, 2048, None, ("-DBLK_GROUP=8",)),
        (1300, 384, 512, 5, ()),
        (1300, 640, 640, None, ("-DBLK_GROUP_M=3",)),
    ],
)
def test_blk_parity(hopper, M, N, K, sms, opts, per_token):
    from minfer.cuda.paths.blk.launch import blk_operand, blk_weight, mmq_blk_linear
    from minfer.cuda.paths.blk.twin import blk_gemm, quantize_blk
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    rng = np.random.default_rng(M + N + K)
    x = _x(rng, M, K)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float16)
    ref = blk_gemm(*quantize_blk(x, per_token=per_token), *quantize_blk(w, weight=True))
    wb = blk_weight(rt, da.to_device(rt, w))
    tt = blk_operand(rt, da.to_device(rt, x), per_token=per_token)
    outs = []
    for _ in range(2):
        out = da.to_device(rt, np.full((M, N), np.nan, np.float32))
        mmq_blk_linear(rt, tt, wb, M, N, K, out, sms=sms, build_opts=opts)
        outs.append(out.get())
    assert np.isfinite(outs[0]).all() and np.array_equal(outs[0], outs[1])
    assert np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref) < 1e-5
    assert np.abs(outs[0] - ref).max() / np.abs(ref).max() < 1e-4
    if per_token:  # (no C += entry: no GEMM after a norm adds to C)
        return
    base = rng.standard_normal((M, N)).astype(np.float32)
    acc = da.to_device(rt, base)
    mmq_blk_linear(rt, tt, wb, M, N, K, acc, accumulate=True, sms=sms, build_opts=opts)
    assert np.linalg.norm(acc.get() - base - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("M,F,K,sms", [(77, 256, 576, None), (200, 512, 1024, 3)])
def test_blk_swiglu(hopper, M, F, K, sms, per_token, act):
    """The glu epilogue (gate|up rows interleaved per 16) against the plain product's swiglu /
    geglu (gemma's GELU: the formula in double, f16 rounding inside the kernel's)."""
    from minfer.cuda.paths.blk.launch import blk_weight, mmq_blk_linear
    from minfer.cuda.paths.blk.twin import blk_gemm, quantize_blk
    from minfer.cuda.runtime import devarray as da
    from minfer.quants.glu import glu_rows
    from minfer.reference.ops import gelu

    rt = hopper
    rng = np.random.default_rng(F + K)
    x = _x(rng, M, K)
    w = (rng.standard_normal((2 * F, K)) * 0.05).astype(np.float16)[glu_rows(F)]
    y = blk_gemm(*quantize_blk(x, per_token=per_token), *quantize_blk(w, weight=True))
    inv = np.argsort(glu_rows(F))
    y = y[:, inv]
    g, u = y[:, :F], y[:, F:]
    ref = (gelu(g.astype(np.float64)) if act == "gelu" else g / (1 + np.exp(-g))) * u
    out = da.to_device(rt, np.full((M, F), np.nan, np.float16))
    mmq_blk_linear(
        rt,
        da.to_device(rt, x),
        blk_weight(rt, da.to_device(rt, w)),
        M,
        2 * F,
        K,
        out,
        glu=act,
        sms=sms,
        per_token=per_token,
    )
    got = out.get().astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("T,Hq,Hkv,pos0", [(64, 32, 8, 0), (300, 8, 2, 17), (130, 4, 4, 0)])
def test_attention_epilogue_operand_bitwise(hopper, same_bytes, T, Hq, Hkv, pos0):
    """The wgmma attention's epilogue writes the block path's token operand of o: the bytes
    blk_operand makes of the plain kernel's o (padding token rows untouched), with o itself
    too, or without it (o_out=False)."""
    from minfer.cuda.ops.attention import attention, operand_fuses
    from minfer.cuda.paths.blk.launch import blk_operand
    from minfer.cuda.paths.blk.twin import BLK_OP, pad128
    from minfer.cuda.runtime import devarray as da

    rt = hopper
    assert operand_fuses(rt, T, Hq // Hkv, 128)
    rng = np.random.default_rng(T + Hq)
    S = pos0 + T
    q = da.to_device(rt, rng.standard_normal((T, Hq, 128)).astype(np.float16))
    kc = da.to_device(rt, rng.standard_normal((S, Hkv, 128)).astype(np.float16))
    vc = da.to_device(rt, (rng.standard_normal((S, Hkv, 128)) * 3).astype(np.float16))
    o = da.empty(rt, (T, Hq, 128), np.float16)
    attention(rt, o, q, kc, vc, pos0)
    want = blk_operand(rt, da.reshape(o, (T, Hq * 128))).tt.get()
    shape = (Hq, pad128(T) // 128, BLK_OP)
    for o_out in (True, False):
        tt = da.to_device(rt, np.zeros(shape, np.uint8))
        o2 = da.to_device(rt, np.full((T, Hq, 128), np.nan, np.float16))
        attention(rt, o2, q, kc, vc, pos0, operand=tt, o_out=o_out)
        assert same_bytes(tt, want)
        if o_out:
            assert same_bytes(o2, o.get())
        else:
            assert np.isnan(o2.get().astype(np.float32)).all()


def test_fused_operands_give_the_unfused_logits(hopper, tmp_path):
    """A blk forward at head_dim 128 whose norm and attention launches write the GEMMs' token
    operands gives the logits, bit for bit, of the same forward with one prepass launch per
    GEMM (the tuning variant blk:no-fused-prepass): the wiring of the fused forms."""
    from synth_data import small_parts, write_small

    from minfer.cuda import backend as B
    from minfer.cuda.ops.attention import operand_fuses
    from minfer.cuda.plan.config import GemmChoice
    from minfer.gguf.loader import load_model

    model = load_model(
        write_small(
            tmp_path / "hd128.gguf", *small_parts(seed=2, d_model=256, n_heads=2, n_kv_heads=1)
        )
    )
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 70).astype(np.int32)
    assert operand_fuses(hopper, len(ids), 2, 128)  # 70 tokens x 2 heads a KV head >= 128 rows
    fused = B.CudaBackend(model, GemmChoice("blk"), max_tokens=96, ubatch=96).forward(ids, 0)
    plain = B.CudaBackend(
        model, GemmChoice("blk", frozenset({"fused-prepass"})), max_tokens=96, ubatch=96
    ).forward(ids, 0)
    assert np.all(np.isfinite(fused)) and np.array_equal(fused, plain)
