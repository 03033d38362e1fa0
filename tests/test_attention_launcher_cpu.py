"""The attention launcher's choices without a GPU: which kernel runs (pick_impl) and the wgmma
kernel's shared memory (pinned against attention_sm90a.cu's static_assert)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minfer.cuda.ops.attention import (
    WG_ROWS,
    per_token_pays,
    pick_impl,
    wg_blocks,
    wg_items,
    wg_smem_bytes,
)
from minfer.errors import GPUError

H200 = SimpleNamespace(arch="sm_90", smem_optin=232448)
ADA = SimpleNamespace(arch="sm_89", smem_optin=101376)


def test_wg_smem_matches_the_kernel():
    # attention_sm90a.cu: static_assert(AttnWgSmem<128>::BYTES == 230480 && <64> == 115792)
    assert wg_smem_bytes(128) == 230480
    assert wg_smem_bytes(64) == 115792
    assert wg_smem_bytes(128) <= H200.smem_optin


def test_pick_impl():
    """wgmma on sm_90 for chunks of at least one 128-row block; mma.sync for decode, short
    chunks and other GPUs, and where the opt-in shared memory is too small."""
    assert pick_impl(H200, 512, 4, 128) == "wg"
    assert pick_impl(H200, WG_ROWS // 4, 4, 128) == "wg"
    assert pick_impl(H200, WG_ROWS // 4 - 1, 4, 128) == "mma"
    assert pick_impl(H200, 1, 4, 128) == "mma"
    assert pick_impl(H200, 2048, 1, 64) == "wg"
    assert pick_impl(ADA, 2048, 4, 128) == "mma"
    assert pick_impl(SimpleNamespace(arch="sm_90", smem_optin=200 * 1024), 512, 4, 128) == "mma"


def test_per_token_for_decode_layouts():
    """attention_tok.cu for a decode step's layout (at most 2 tokens per sequence on average,
    padding rows repeated), on any GPU; never for a prefill chunk of a few long runs."""
    decode = np.array([(5, 0), (130, 128), (300, 256), (300, 256)], np.int32)
    assert per_token_pays(decode)
    assert per_token_pays(np.array([(7, 0)], np.int32))  # one sequence's decode
    assert per_token_pays(np.array([(0, 0), (1, 0)], np.int32))
    assert not per_token_pays(np.array([(p, 0) for p in range(3)], np.int32))
    chunk = np.array([(p, 0) for p in range(40)] + [(128 + p, 128) for p in range(9)], np.int32)
    assert not per_token_pays(chunk)
    assert not per_token_pays(np.zeros((0, 2), np.int32))
    for rt in (H200, ADA):
        assert pick_impl(rt, 64, 4, 128, per_token=True) == "tok"


def test_timing_build_options_reach_the_wgmma_build(monkeypatch):
    """build_opts (the timing builds: -DATT_WG_NOLOAD ...) join the wgmma kernel's nvcc
    options; without them it builds as the forward does (-arch=sm_90a alone). The grid is
    wg_blocks' unless given; with TMA the caches travel as [S, Hkv D] tensor maps of 128-key
    boxes after the parameter padding, the magic last."""
    from fake_gpuarray import install

    import minfer.cuda.ops.attention as att
    from minfer.cuda.runtime import devarray as da
    from minfer.cuda.runtime.tma import TMA_PARAM_PAD

    install(monkeypatch)
    maps = []
    monkeypatch.setattr(att, "tmap_f16_2d", lambda *a: maps.append(a) or np.zeros(128, np.uint8))
    rt = SimpleNamespace(
        arch="sm_90", smem_optin=232448, sm_count=132, builds=[], grids=[], args=[]
    )
    rt.launch = lambda fn, grid, block, args, **k: rt.grids.append(grid) or rt.args.append(args)
    rt.function = lambda name, entry, options=(), dyn_smem=0: (
        rt.builds.append((name, entry, tuple(options))) or (name, entry)
    )
    T, Hq, Hkv, D = 256, 8, 2, 128
    q, o = da.view(0x100000, (T, Hq, D), np.float16), da.view(0x300000, (T, Hq, D), np.float16)
    k, v = (da.view(p, (T + 5, Hkv, D), np.float16) for p in (0x500000, 0x700000))
    att.attention(rt, o, q, k, v, 0, tma=False)
    att.attention(rt, o, q, k, v, 0, build_opts=("-DATT_WG_NOLOAD",), tma=False)
    att.attention(rt, o, q, k, v, 0, tma=True)
    assert rt.builds == [
        ("attention_sm90a", "attn_wg_d128", ("-arch=sm_90a",)),
        ("attention_sm90a", "attn_wg_d128", ("-arch=sm_90a", "-DATT_WG_NOLOAD")),
        ("attention_sm90a", "attn_wg_tma_d128", ("-arch=sm_90a",)),
    ]
    assert maps == [(0x500000, T + 5, Hkv * D, 128), (0x700000, T + 5, Hkv * D, 128)]
    a = rt.args[-1]
    assert a[0] is TMA_PARAM_PAD and len(a) == 3 + 14 + 2 + 1 and a[-1] == att.WG_TMA_MAGIC
    assert len(rt.args[0]) == 14
    from minfer.cuda.paths.blk.twin import blk_shape  # the token operand from the epilogue

    tt = da.view(0x900000, blk_shape(T, Hq * D), np.uint8)
    att.attention(rt, o, q, k, v, 0, operand=tt, o_out=False, tma=True)
    a = rt.args[-1]
    assert rt.builds[-1][1] == "attn_wg_tma_d128" and int(a[3 + 4]) == 0  # no o
    assert int(a[-3]) == 0x900000 and int(a[-2]) == 256  # ob, Tp
    # 256 x 4 rows = 8 row blocks x 2 KV heads: 16 items, under the SMs
    assert rt.grids == [(16,)] * 4
    att.attention(rt, o, q, k, v, 0, blocks=3)
    assert rt.grids[-1] == (3,)
    with pytest.raises(GPUError, match="blocks 0"):
        att.attention(rt, o, q, k, v, 0, blocks=0)


def test_wg_grid():
    """The wgmma kernel's items (128 rows of one KV head) and its grid: one block per SM when
    persistent (never more blocks than items), else one per item."""
    assert wg_items(2048, 4, 8) == 512 and wg_items(33, 4, 8) == 16 and wg_items(1, 1, 1) == 1
    assert wg_blocks(132, 2048, 4, 8, persistent=True) == 132
    assert wg_blocks(132, 2048, 4, 8, persistent=False) == 512
    assert wg_blocks(132, 100, 4, 2, persistent=True) == 8


def test_attention_operand_layout_is_the_blk_paths():
    """ops/attention.py restates the blk token operand's layout (ops sit below paths): it must
    stay the blk twin's, at every T and head count the epilogue runs (head_dim 128)."""
    from minfer.cuda.ops.attention import operand_shape
    from minfer.cuda.paths.blk.twin import blk_shape

    for T in (1, 37, 128, 129, 512, 2049):
        for Hq in (1, 8, 32):
            assert operand_shape(T, Hq) == blk_shape(T, Hq * 128)
