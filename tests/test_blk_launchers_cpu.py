"""The launchers of the blk token operand's fused forms without a GPU (a recording fake runtime
and devarray's stand-in arrays): the attention epilogue's operand (attention(operand=, o_out=))
and the rmsnorm's (blk_operand_rmsnorm), per block or per token: what they launch, and what they
refuse before launching anything; which GEMM entry each operand form takes."""

from __future__ import annotations

import numpy as np
import pytest
from fake_gpuarray import install

from minfer.cuda.ops.attention import attention, operand_fuses
from minfer.cuda.paths.blk.launch import (
    NORM_MAX_K,
    BlkTokens,
    BlkWeight,
    blk_operand,
    blk_operand_rmsnorm,
    blk_weight,
    mmq_blk_linear,
)
from minfer.cuda.paths.blk.twin import BLK_OP, kblocks, pad128
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError

F16, F32, U8 = np.float16, np.float32, np.uint8


class FakeRT:
    sm_count, arch, smem_optin = 132, "sm_90", 232448

    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return name, entry

    def alloc(self, nbytes, what):
        return np.uintp(0xE00000)

    def workspace(self, what, nbytes, zeroed):  # (stream-K's partials and flags)
        return np.uintp(0xF00000), np.uintp(0xF80000)

    def launch(self, fn, grid, block, args, smem=0, stream=None):
        self.launches.append((fn, grid, [int(x) for x in args]))


@pytest.fixture(autouse=True)
def fake_pycuda(monkeypatch):
    install(monkeypatch)


def _attn(T, Hq, Hkv, D):
    q = da.view(0x100000, (T, Hq, D), F16)
    kc, vc = da.view(0x200000, (T, Hkv, D), F16), da.view(0x300000, (T, Hkv, D), F16)
    return da.view(0x400000, (T, Hq, D), F16), q, kc, vc


def test_attention_writes_the_operand_from_the_wgmma_epilogue():
    rt = FakeRT()
    o, q, kc, vc = _attn(70, 8, 4, 128)  # 70 tokens x 2 heads a KV head
    tt = da.view(0x800000, (8, pad128(70) // 128, BLK_OP), U8)
    assert operand_fuses(rt, 70, 2, 128) and not operand_fuses(rt, 60, 2, 128)
    attention(rt, o, q, kc, vc, 0, operand=tt, o_out=False, tma=False)
    ((fn, grid, args),) = rt.launches
    assert fn == ("attention_sm90a", "attn_wg_d128_blk") and grid == (8,)  # 2 x 4 items
    assert args[4] == 0 and args[-2:] == [0x800000, 128]  # no o; the operand, Tp
    attention(rt, o, q, kc, vc, 0, operand=tt, tma=False)
    assert rt.launches[-1][2][4] == 0x400000  # o written too
    attention(rt, o, q, kc, vc, 0, tma=False)
    assert rt.launches[-1][0] == ("attention_sm90a", "attn_wg_d128")


def test_attention_refuses_an_operand_it_cannot_write():
    rt = FakeRT()
    o, q, kc, vc = _attn(70, 8, 4, 64)
    tt = da.view(0x800000, (4, 1, BLK_OP), U8)
    with pytest.raises(GPUError, match="wgmma kernel at head_dim 128"):
        attention(rt, o, q, kc, vc, 0, operand=tt)  # head_dim 64
    o, q, kc, vc = _attn(60, 8, 4, 128)
    with pytest.raises(GPUError, match=r"\(kernel mma, head_dim 128\)"):
        attention(rt, o, q, kc, vc, 0, operand=da.view(0x800000, (8, 1, BLK_OP), U8))
    o, q, kc, vc = _attn(70, 8, 4, 128)
    with pytest.raises(GPUError, match="o_out False needs operand"):
        attention(rt, o, q, kc, vc, 0, o_out=False)
    with pytest.raises(GPUError, match="attention operand"):  # the wrong shape
        attention(rt, o, q, kc, vc, 0, operand=da.view(0x800000, (8, 2, BLK_OP), U8))
    assert not rt.launches


def test_rmsnorm_operand_launch_and_refusals():
    rt = FakeRT()
    M, K = 130, 576
    x, w = da.view(0x100000, (M, K), F32), da.view(0x200000, (K,), F32)
    tt = da.view(0x800000, (kblocks(K), pad128(M) // 128, BLK_OP), U8)
    got = blk_operand_rmsnorm(rt, x, w, 1e-5, tt)
    assert (got.M, got.K) == (M, K)
    ((fn, grid, args),) = rt.launches
    assert fn == ("mmq_blk", "rmsnorm_blk_operand") and grid == (256,)  # a CTA per token row
    assert args[3] == 0 and args[-5:] == [M, K, 256, 0, 0]  # no h16, per block, no t
    assert not got.per_token
    got = blk_operand_rmsnorm(rt, x, w, 1e-5, tt, per_token=True)
    assert got.per_token and rt.launches[-1][2][-2] == 1
    # olmo2's forms: f16(x) (no weight), and x += rmsnorm(t) * w (t: the post-norm's input)
    blk_operand_rmsnorm(rt, x, None, 1e-5, tt)
    assert rt.launches[-1][2][1] == 0 and rt.launches[-1][2][-1] == 0
    t = da.view(0x400000, (M, K), F32)
    blk_operand_rmsnorm(rt, x, w, 1e-5, tt, t=t)
    assert rt.launches[-1][2][1] == 0x200000 and rt.launches[-1][2][-1] == 0x400000
    with pytest.raises(GPUError, match="needs its norm weight"):
        blk_operand_rmsnorm(rt, x, None, 1e-5, tt, t=t)
    with pytest.raises(GPUError, match="t"):
        blk_operand_rmsnorm(rt, x, w, 1e-5, tt, t=da.view(0x400000, (M, K + 8), F32))
    assert len(rt.launches) == 4
    for bad in ((4, NORM_MAX_K + 256), (4, 100)):
        with pytest.raises(GPUError, match="K a multiple of 8 up to 8192"):
            blk_operand_rmsnorm(
                rt, da.view(0x100000, bad, F32), da.view(0x200000, bad[1:], F32), 1e-5
            )
    assert len(rt.launches) == 4


def test_per_token_operand_picks_its_prepass_and_gemm_entries():
    """A per-token operand: blk_operand_f16_tok (a warp per row), then the mmq_blk_tok entries
    (C =, swiglu; no C +=), a per-block operand the mmq_blk ones (C =, C +=, swiglu)."""
    rt = FakeRT()
    M, N, K = 130, 256, 576
    x16 = da.view(0x100000, (M, K), F16)
    tt = da.view(0x800000, (kblocks(K), pad128(M) // 128, BLK_OP), U8)
    op = blk_operand(rt, x16, tt, per_token=True)
    ((fn, grid, args),) = rt.launches
    assert fn == ("mmq_blk", "blk_operand_f16_tok") and grid == (pad128(M) // 8,)
    assert op.per_token and args[2:5] == [M, K, pad128(M)]
    blk_operand(rt, x16, tt)
    assert rt.launches[-1][0] == ("mmq_blk", "blk_operand_f16")
    assert rt.launches[-1][2][-1] == 1  # tokens: a scale per block
    quads = pad128(M) * kblocks(K)
    assert rt.launches[-1][1] == ((quads + 63) // 64,)
    blk_weight(rt, x16)  # a weight: a scale per pair of blocks
    (fn, grid, args) = rt.launches[-1]
    assert fn == ("mmq_blk", "blk_operand_f16") and args[-1] == 2
    assert grid == ((pad128(M) * -(-kblocks(K) // 2) + 63) // 64,)
    w = BlkWeight(da.view(0x900000, (kblocks(K), N // 128, BLK_OP), U8), N, K)
    out = da.view(0xA00000, (M, N), F32)
    for per_token, entry in ((True, "mmq_blk_tok"), (False, "mmq_blk")):
        x = BlkTokens(tt, M, K, per_token)
        rt.launches.clear()
        mmq_blk_linear(rt, x, w, M, N, K, out)
        if per_token:
            with pytest.raises(GPUError, match="per-token"):
                mmq_blk_linear(rt, x, w, M, N, K, out, accumulate=True)
        else:
            mmq_blk_linear(rt, x, w, M, N, K, out, accumulate=True)
        for glu in (True, "gelu"):
            mmq_blk_linear(rt, x, w, M, N, K, da.view(0xA00000, (M, N // 2), F16), glu=glu)
        with pytest.raises(GPUError, match="'tanh' is not one of"):
            mmq_blk_linear(rt, x, w, M, N, K, da.view(0xA00000, (M, N // 2), F16), glu="tanh")
        glus = [entry + "_swiglu", entry + "_geglu"]
        want = [entry] + glus if per_token else [entry, entry + "_acc"] + glus
        assert [f[1] for f, _, _ in rt.launches] == want
    rt.launches.clear()
    mmq_blk_linear(rt, x16, w, M, N, K, out, per_token=True)  # the operand made here
    assert [f[1] for f, _, _ in rt.launches] == ["blk_operand_f16_tok", "mmq_blk_tok"]
