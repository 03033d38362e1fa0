"""The launchers of the blk token operand's fused forms without a GPU (a recording fake runtime
and devarray's stand-in arrays): the attention epilogue's operand (attention(operand=, o_out=))
and the rmsnorm's (blk_operand_rmsnorm): what they launch, and what they refuse before
launching anything."""

from __future__ import annotations

import numpy as np
import pytest
from fake_gpuarray import install

from minfer.cuda.ops.attention import attention, operand_fuses
from minfer.cuda.ops.mmq_blk import NORM_MAX_K, blk_operand_rmsnorm
from minfer.cuda.runtime import devarray as da
from minfer.errors import GPUError
from minfer.quants.blk_ref import BLK_OP, kblocks, pad128

F16, F32, U8 = np.float16, np.float32, np.uint8


class FakeRT:
    sm_count, arch, smem_optin = 132, "sm_90", 232448

    def __init__(self):
        self.launches = []

    def function(self, name, entry, options=(), dyn_smem=0):
        return name, entry

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
    o, q, kc, vc = _attn(70, 8, 4, 128)                 # 70 tokens x 2 heads a KV head
    tt = da.view(0x800000, (8, pad128(70) // 128, BLK_OP), U8)
    assert operand_fuses(rt, 70, 2, 128) and not operand_fuses(rt, 60, 2, 128)
    attention(rt, o, q, kc, vc, 0, operand=tt, o_out=False)
    (fn, grid, args), = rt.launches
    assert fn == ("attention_sm90a", "attn_wg_d128_blk") and grid == (2, 4)
    assert args[4] == 0 and args[-2:] == [0x800000, 128]   # no o; the operand, Tp
    attention(rt, o, q, kc, vc, 0, operand=tt)
    assert rt.launches[-1][2][4] == 0x400000                 # o written too
    attention(rt, o, q, kc, vc, 0)
    assert rt.launches[-1][0] == ("attention_sm90a", "attn_wg_d128")


def test_attention_refuses_an_operand_it_cannot_write():
    rt = FakeRT()
    o, q, kc, vc = _attn(70, 8, 4, 64)
    tt = da.view(0x800000, (4, 1, BLK_OP), U8)
    with pytest.raises(GPUError, match="wgmma kernel at head_dim 128"):
        attention(rt, o, q, kc, vc, 0, operand=tt)           # head_dim 64
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
    (fn, grid, args), = rt.launches
    assert fn == ("mmq_blk", "rmsnorm_blk_operand") and grid == (256,)   # a CTA per token row
    assert args[3] == 0 and args[-3:] == [M, K, 256]                     # no h16
    for bad in ((4, NORM_MAX_K + 256), (4, 100)):
        with pytest.raises(GPUError, match="K a multiple of 8 up to 8192"):
            blk_operand_rmsnorm(rt, da.view(0x100000, bad, F32), da.view(0x200000, bad[1:], F32),
                                1e-5)
    assert len(rt.launches) == 1
