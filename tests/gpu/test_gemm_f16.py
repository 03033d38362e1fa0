"""gemm_f16_nt / gemv_f16 on the GPU against the numpy twin (rel err <= 1e-3), every epilogue,
ragged M/N/K, every compiled variant, poisoned outputs and guard words past the end."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import rel_err as _rel

from minfer.cuda.paths.f16.gemm import (
    GEMVS,
    TILES,
    TMA,
    WGMMA,
    gemm_f16_nt,
    gemm_f16_nt_ref,
    pick_variant,
)
from minfer.cuda.runtime import devarray as da
from minfer.errors import BadInput, GPUError

pytestmark = pytest.mark.gpu
GUARD = 64  # elements past C that must stay untouched


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _run(rt, M, N, K, mode, variant=None, seed=0):
    """One launch with poisoned output and a guard tail; returns (out, ref, tail_ok)."""
    rng = np.random.default_rng([seed, M, N, K, ["f32", "f16", "acc"].index(mode)])
    a, b = _rand(rng, (M, K)), _rand(rng, (N, K), 0.1)
    out_dtype = np.float16 if mode == "f16" else np.float32
    if mode == "acc":
        init = rng.standard_normal((M, N)).astype(np.float32)
    else:  # NaN poison: any element the kernel forgets fails the finiteness check
        init = np.full((M, N), np.nan, out_dtype)
    tail = np.full(GUARD, 12345.0, out_dtype)
    host = np.concatenate([init.ravel(), tail])
    dev = da.to_device(rt, host, "C+guard")
    c = da.view(da.ptr(dev), (M, N), out_dtype, base=dev)  # C: the buffer less its guard tail
    dA, dB = da.to_device(rt, a), da.to_device(rt, b)
    if mode == "acc":
        gemm_f16_nt(dA, dB, np.float32, accumulate=c, rt=rt, variant=variant)
        ref = gemm_f16_nt_ref(a, b, np.float32, accumulate=init)
    else:
        gemm_f16_nt(dA, dB, out_dtype, out=c, rt=rt, variant=variant)
        ref = gemm_f16_nt_ref(a, b, out_dtype)
    rt.synchronize()
    got = dev.get()
    return got[: M * N].reshape(M, N), ref, bool(np.all(got[M * N :] == tail))


@pytest.mark.parametrize("mode", ["f32", "f16", "acc"])
@pytest.mark.parametrize("N", [8, 200, 1000])
@pytest.mark.parametrize("M", [1, 7, 129, 513])
def test_ragged_default_pick(rt, M, N, mode):
    out, ref, tail_ok = _run(rt, M, N, 136, mode)  # K = 136: not a multiple of BK (32/64)
    assert tail_ok, "wrote past the end of C"
    assert _rel(out, ref) <= 1e-3


@pytest.mark.parametrize("variant", sorted(TILES) + sorted(WGMMA) + sorted(TMA))
@pytest.mark.parametrize("mode", ["f32", "f16", "acc"])
def test_every_tile_variant(rt, variant, mode):
    if (variant in WGMMA or variant in TMA) and rt.arch != "sm_90":
        pytest.skip("wgmma kernels need sm_90")
    # ragged in all three dims for every tile size; K = 8 * odd exercises the 8-wide K tail
    # (N = 1: qwen2moe's shared-expert gate, h16 @ ffn_gate_inp_shexp, minfer.cuda.load.moe)
    for M, N, K in ((133, 261, 328), (17, 9, 24), (300, 130, 1000), (64, 256, 64), (129, 1, 256)):
        out, ref, tail_ok = _run(rt, M, N, K, mode, variant=variant)
        assert tail_ok, f"{variant} {M}x{N}x{K}: wrote past the end of C"
        err = _rel(out, ref)
        assert err <= 1e-3, f"{variant} {M}x{N}x{K} {mode}: rel err {err:.2e}"


@pytest.mark.parametrize("variant", sorted(GEMVS))
@pytest.mark.parametrize("mode", ["f32", "f16", "acc"])
def test_every_gemv_variant(rt, variant, mode):
    for N, K in ((1, 8), (37, 264), (1000, 4104), (4099, 1032)):
        out, ref, tail_ok = _run(rt, 1, N, K, mode, variant=variant)
        assert tail_ok, f"{variant} N={N} K={K}: wrote past the end of C"
        err = _rel(out, ref)
        assert err <= 1e-3, f"{variant} N={N} K={K} {mode}: rel err {err:.2e}"


@pytest.mark.parametrize("variant", sorted(TMA))
def test_persistent_blocks_walk_several_tiles(rt, variant):
    # more tiles than SMs: each block runs several tiles and the stage ring wraps across them
    # (ragged in M, N and K; K = 8 * odd; K = 24: a single partial k-tile per tile)
    if rt.arch != "sm_90":
        pytest.skip("wgmma kernels need sm_90")
    for M, N, K, mode in (
        (1000, 4400, 200, "f16"),
        (1100, 4000, 24, "acc"),
        (300, 12000, 1032, "f32"),
    ):
        assert TMA[variant].tiles(M, N) > rt.sm_count
        out, ref, tail_ok = _run(rt, M, N, K, mode, variant=variant)
        assert tail_ok, f"{variant} {M}x{N}x{K}: wrote past the end of C"
        err = _rel(out, ref)
        assert err <= 1e-3, f"{variant} {M}x{N}x{K} {mode}: rel err {err:.2e}"


def test_odd_n_scalar_epilogue(rt):
    for mode in ("f32", "f16", "acc"):
        out, ref, tail_ok = _run(rt, 65, 201, 64, mode, variant="gemm_f16_nt_64x64x64_w2x2_s4")
        assert tail_ok and _rel(out, ref) <= 1e-3


def test_large_k_production_pick(rt):
    # a long reduction (ffn_down-like K) at the production pick: accumulation stays f32
    M, N, K = 256, 384, 14336
    assert pick_variant(M, N, K, rt.sm_count, rt.arch) in {**TILES, **WGMMA, **TMA}
    out, ref, tail_ok = _run(rt, M, N, K, "acc")
    assert tail_ok and _rel(out, ref) <= 1e-3


def test_repeatable(rt):
    # the same inputs give bit-identical outputs (no races, no order-dependent reductions)
    outs = [_run(rt, 257, 520, 1024, "f32", seed=3)[0] for _ in range(3)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_launcher_rejects(rt):
    rng = np.random.default_rng(1)
    a = da.to_device(rt, _rand(rng, (4, 20)))
    b = da.to_device(rt, _rand(rng, (8, 20)))
    with pytest.raises(BadInput, match="multiple of 8"):
        gemm_f16_nt(a, b, rt=rt)
    a = da.to_device(rt, _rand(rng, (4, 16)))
    b = da.to_device(rt, _rand(rng, (8, 16)))
    acc = da.empty(rt, (4, 9), np.float32)
    with pytest.raises(BadInput, match="accumulate buffer"):
        gemm_f16_nt(a, b, accumulate=acc, rt=rt)
    with pytest.raises(BadInput, match="float16"):
        gemm_f16_nt(da.to_device(rt, np.zeros((4, 16), np.float32)), b, rt=rt)
    with pytest.raises(BadInput, match="out is"):
        gemm_f16_nt(a, b, np.float16, out=da.empty(rt, (4, 8), np.float32), rt=rt)
    # rejected before any launch: nothing reads the 2 bytes past a's end
    with pytest.raises(GPUError, match="gemm_f16_nt A: device pointer 0x[0-9a-f]+ not 16-byte"):
        gemm_f16_nt(da.view(da.ptr(a) + 2, (4, 16), np.float16, base=a), b, rt=rt)
    with pytest.raises(GPUError, match="gemm_f16_nt B: not contiguous"):
        gemm_f16_nt(a, b[:, :8], rt=rt)
    with pytest.raises(GPUError, match="gemm_f16_nt A: expected a device array"):
        gemm_f16_nt(a.get(), b, rt=rt)
    with pytest.raises(BadInput, match="M == 1 only"):
        gemm_f16_nt(a, b, rt=rt, variant="gemv_f16_r4")


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("variant", sorted(TILES) + sorted(WGMMA) + sorted(TMA) + [None])
def test_glu_epilogue_is_the_swiglu_layer_bit_for_bit(rt, variant, act, same_bytes):
    # modes 3 / 5 on a gate|up weight interleaved per 16 rows: against the twin, and bitwise the
    # same variant's f32 product followed by the interleaved swiglu / geglu launch (the same
    # sums, the same glu1 rounding); N ragged against every tile (208 = 13 x 16), M = 1 on the
    # default pick
    from minfer.cuda.ops.gemma_layers import geglu_interleaved
    from minfer.cuda.ops.layers import swiglu_interleaved
    from minfer.cuda.paths.f16.gemm import GLU_TILE
    from minfer.quants.glu import glu_rows

    if (variant in WGMMA or variant in TMA) and rt.arch != "sm_90":
        pytest.skip("wgmma kernels need sm_90")
    for M, F, K in ((133, 104, 328), (17, 32, 24), (300, 520, 1000), (1, 64, 136)):
        if variant is not None and M == 1:
            continue
        rng = np.random.default_rng([M, F, K])
        a = _rand(rng, (M, K))
        w = _rand(rng, (2 * F, K), 0.1)[glu_rows(F)]  # [gate; up], interleaved
        dA, dW = da.to_device(rt, a), da.to_device(rt, w)
        out = da.to_device(rt, np.full((M, F), np.nan, np.float16))
        gemm_f16_nt(dA, dW, np.float16, out=out, rt=rt, variant=variant, glu=act)
        # (M == 1 by default: glu takes GLU_TILE, where f32 out would take the GEMV)
        gu = gemm_f16_nt(
            dA, dW, np.float32, rt=rt, variant=variant or (GLU_TILE if M == 1 else None)
        )
        ref = da.empty(rt, (M, F), np.float16)
        (geglu_interleaved if act == "gelu" else swiglu_interleaved)(rt, ref, gu)
        rt.synchronize()
        got = out.get()
        assert _rel(got, gemm_f16_nt_ref(a, w, np.float16, glu=act)) <= 1e-3, (variant, M, F)
        assert same_bytes(out, ref.get()), f"{variant} {M}x{F}x{K}: {act} glu != f32 GEMM + layer"
