"""The attention launcher's choices without a GPU: which kernel runs (pick_impl) and the wgmma
kernel's shared memory (pinned against attention_sm90a.cu's static_assert)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minfer.cuda.ops.attention import WG_ROWS, per_token_pays, pick_impl, wg_smem_bytes

H200 = SimpleNamespace(arch="sm_90", smem_optin=232448)
ADA = SimpleNamespace(arch="sm_89", smem_optin=101376)


def test_wg_smem_matches_the_kernel():
    # attention_sm90a.cu: static_assert(AttnWgSmem<128>::BYTES == 230456 && <64> == 115768)
    assert wg_smem_bytes(128) == 230456
    assert wg_smem_bytes(64) == 115768
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
    assert per_token_pays(np.array([(7, 0)], np.int32))            # one sequence's decode
    assert per_token_pays(np.array([(0, 0), (1, 0)], np.int32))
    assert not per_token_pays(np.array([(p, 0) for p in range(3)], np.int32))
    chunk = np.array([(p, 0) for p in range(40)] + [(128 + p, 128) for p in range(9)], np.int32)
    assert not per_token_pays(chunk)
    assert not per_token_pays(np.zeros((0, 2), np.int32))
    for rt in (H200, ADA):
        assert pick_impl(rt, 64, 4, 128, per_token=True) == "tok"


def test_timing_build_options_reach_the_wgmma_build(monkeypatch):
    """build_opts (the timing builds: -DATT_WG_NOLOAD ...) join the wgmma kernel's nvcc
    options; without them it builds as the forward does (-arch=sm_90a alone)."""
    from fake_gpuarray import install

    from minfer.cuda.ops.attention import attention
    from minfer.cuda.runtime import devarray as da

    install(monkeypatch)
    rt = SimpleNamespace(arch="sm_90", smem_optin=232448, builds=[],
                         launch=lambda *a, **k: None)
    rt.function = lambda name, entry, options=(), dyn_smem=0: rt.builds.append(
        (name, entry, tuple(options))) or (name, entry)
    T, Hq, Hkv, D = 256, 8, 2, 128
    q, o = da.view(0x100000, (T, Hq, D), np.float16), da.view(0x300000, (T, Hq, D), np.float16)
    k, v = (da.view(p, (T, Hkv, D), np.float16) for p in (0x500000, 0x700000))
    attention(rt, o, q, k, v, 0)
    attention(rt, o, q, k, v, 0, build_opts=("-DATT_WG_NOLOAD",))
    assert rt.builds == [("attention_sm90a", "attn_wg_d128", ("-arch=sm_90a",)),
                         ("attention_sm90a", "attn_wg_d128", ("-arch=sm_90a", "-DATT_WG_NOLOAD"))]
