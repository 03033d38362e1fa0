"""kernels/attention.cu (causal GQA flash attention) vs minfer.reference.ops.attention."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.reference import ops

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "T,pos0,Hq,Hkv,D",
    [
        (1, 0, 4, 4, 64),
        (5, 0, 9, 3, 64),
        (77, 0, 9, 3, 64),
        (64, 0, 8, 2, 128),
        (130, 21, 32, 8, 128),
        (1, 300, 32, 8, 128),
        (1, 1000, 9, 3, 64),
        (257, 100, 4, 1, 128),
        (513, 0, 8, 8, 64),
        (1, 0, 4, 4, 96),
        (77, 5, 32, 32, 96),
        (200, 0, 8, 4, 256),
        (1, 700, 8, 4, 256),
        (33, 0, 4, 1, 256),
    ],
)
@pytest.mark.parametrize("geom", ["default", "4x64", "wg", "tok"])
def test_attention(rt, T, pos0, Hq, Hkv, D, geom):
    """attention.cu's default geometry (8 warps x 128 keys) and the earlier 4 x 64, the wgmma
    kernel (attention_sm90a.cu, Hopper) and the one-token-per-block kernel (attention_tok.cu):
    ragged T, decode, positions past 0, GQA groups of 1-4, rows of a block past T * G."""
    from minfer.cuda.ops.attention import DEFAULT, WG_HEAD_DIMS, AttnGeometry, attention
    from minfer.cuda.runtime import devarray as da

    if geom == "wg" and (rt.arch != "sm_90" or D not in WG_HEAD_DIMS):
        pytest.skip("the wgmma attention kernel is sm_90 only, at head_dim 64 / 128")
    if geom == "default" and D > 128:
        pytest.skip("head_dim 256 runs 4 x 64 (pick_geometry)")
    g = {"default": DEFAULT, "4x64": AttnGeometry(4, 64), "wg": None, "tok": None}[geom]
    impl = geom if geom in ("wg", "tok") else "mma"

    rng = np.random.default_rng(T * 7 + pos0 + D)
    S = pos0 + T + 37  # rows past pos0 + T hold garbage (NaN) that must never be read
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    k[pos0 + T :] = np.nan
    v[pos0 + T :] = np.nan
    o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    attention(
        rt,
        o,
        da.to_device(rt, q),
        da.to_device(rt, k),
        da.to_device(rt, v),
        pos0,
        geom=g,
        impl=impl,
    )
    got = o.get().astype(np.float64)
    ref = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos0)
    assert np.all(np.isfinite(got)), "unwritten or NaN output"
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 2e-3, rel  # f16 P and f16 output: ~5e-4 typical


@pytest.mark.parametrize("impl", ["mma", "wg", "tok"])
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 9, 3), (96, 8, 8), (128, 32, 8), (256, 8, 4)])
@pytest.mark.parametrize(
    "window,softcap,scale",
    [
        (1, 0.0, None),
        (37, 0.0, None),
        (128, 0.0, None),
        (300, 0.0, None),
        (0, 5.0, None),
        (0, 0.0, 0.3),
        (100, 3.0, 0.05),
    ],
)
def test_window_softcap_scale(rt, impl, D, Hq, Hkv, window, softcap, scale):
    """A model's per-layer attention options (attention_common.cuh) in every kernel, on a
    packed layout (sequences of 1 .. 700 tokens, windows narrower and wider than a tile and
    than a sequence): the sliding window, soft-capped scores (gemma2) and a given softmax
    scale (gemma's query scale) against the numpy twin."""
    from minfer.cuda.ops.attention import WG_HEAD_DIMS, attention
    from minfer.cuda.runtime import devarray as da

    if impl == "wg" and (rt.arch != "sm_90" or D not in WG_HEAD_DIMS):
        pytest.skip("the wgmma attention kernel is sm_90 only, at head_dim 64 / 128")
    lengths, rows, base = [700, 1, 37, 129, 300], [], 0
    for n in lengths:
        rows += [(base + p, base) for p in range(n)]
        base += -(-n // 128) * 128
    tok, S = np.array(rows, np.int32), base
    T = len(tok)
    rng = np.random.default_rng(D + window + Hq)
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
    attention(
        rt,
        o,
        da.to_device(rt, q),
        da.to_device(rt, k),
        da.to_device(rt, v),
        0,
        da.to_device(rt, tok),
        S,
        impl=impl,
        window=window,
        softcap=softcap,
        scale=scale,
    )
    got = o.get().astype(np.float64)
    ref = ops.attention_packed(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        tok,
        window=window,
        softcap=softcap,
        scale=scale,
    )
    assert np.all(np.isfinite(got)), "unwritten or NaN output"
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 2e-3, rel
    if window == 1:  # each query sees itself alone: o is its own v
        G = Hq // Hkv
        assert np.allclose(got, np.repeat(v[tok[:, 0]], G, axis=1).astype(np.float64), atol=1e-3)


def test_attention_rejects(rt):
    from minfer.cuda.ops.attention import attention
    from minfer.cuda.runtime import devarray as da
    from minfer.errors import GPUError

    q = da.empty(rt, (4, 4, 80), np.float16)
    kv = da.empty(rt, (8, 2, 80), np.float16)
    with pytest.raises(GPUError, match="head_dim 80"):
        attention(rt, da.empty(rt, (4, 4, 80), np.float16), q, kv, kv, 0)
    q = da.empty(rt, (4, 4, 96), np.float16)
    kv = da.empty(rt, (8, 2, 96), np.float16)
    with pytest.raises(GPUError, match="wgmma kernel needs"):
        attention(rt, da.empty(rt, (4, 4, 96), np.float16), q, kv, kv, 0, impl="wg")
    q = da.empty(rt, (4, 4, 64), np.float16)
    kv = da.empty(rt, (8, 2, 64), np.float16)
    with pytest.raises(GPUError, match="exceed"):
        attention(rt, da.empty(rt, (4, 4, 64), np.float16), q, kv, kv, 5)
    with pytest.raises(GPUError, match="unknown kernel"):
        attention(rt, da.empty(rt, (4, 4, 64), np.float16), q, kv, kv, 0, impl="flash")


def test_pick_impl(rt):
    """The wgmma kernel for prefill chunks of at least one block on sm_90; attention.cu for
    decode and elsewhere."""
    from minfer.cuda.ops.attention import pick_impl

    hopper = rt.arch == "sm_90"
    assert pick_impl(rt, 512, 4, 128) == ("wg" if hopper else "mma")
    assert pick_impl(rt, 1, 4, 128) == "mma"
    assert pick_impl(rt, 31, 4, 64) == "mma"
    assert pick_impl(rt, 64, 4, 128, per_token=True) == "tok"
    assert pick_impl(rt, 512, 4, 96) == pick_impl(rt, 512, 4, 256) == "mma"


@pytest.mark.parametrize("D,Hq,Hkv,window", [(128, 32, 8, 0), (64, 9, 3, 0), (128, 8, 2, 200)])
@pytest.mark.parametrize("packed", [False, True])
def test_wg_persistent_grid_bitwise(rt, D, Hq, Hkv, window, packed):
    """The wgmma kernel's grid and its loads are a schedule, not a result: 1, 3 and 7 blocks
    walking many items each (the K/V ring and the Q rows carried from item to item, items of
    different lengths, snaking rounds) write the bits one block per item writes, and the
    default grid (wg_blocks) the same, with the K/V tiles by cp.async or TMA; on one sequence
    past pos0 and on a packed layout with a window."""
    from minfer.cuda.ops.attention import attention, wg_items
    from minfer.cuda.runtime import devarray as da

    if rt.arch != "sm_90":
        pytest.skip("the wgmma attention kernel is sm_90 only")
    rng = np.random.default_rng(D + Hq + window)
    if packed:
        lengths, rows, base = [300, 1, 129, 37, 260], [], 0
        for n in lengths:
            rows += [(base + p, base) for p in range(n)]
            base += -(-n // 128) * 128
        tok, S, pos0 = da.to_device(rt, np.array(rows, np.int32)), base, 0
        T = len(rows)
    else:
        T, pos0, tok = 611, 90, None
        S = pos0 + T
    q = (rng.standard_normal((T, Hq, D)) * 2).astype(np.float16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float16)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float16)
    q, k, v = (da.to_device(rt, x) for x in (q, k, v))
    n = wg_items(T, Hq // Hkv, Hkv)
    outs = {}
    for blocks in (n, 1, 3, 7, None):
        for tma in (False, True):
            o = da.to_device(rt, np.full((T, Hq, D), np.nan, np.float16))
            attention(
                rt,
                o,
                q,
                k,
                v,
                pos0,
                tok,
                S if packed else None,
                impl="wg",
                window=window,
                blocks=blocks,
                tma=tma,
            )
            outs[blocks, tma] = o.get()
    ref = outs[n, False]
    assert np.all(np.isfinite(ref))
    for key, got in outs.items():
        assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), key
