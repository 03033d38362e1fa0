"""gemm_f16 without a GPU: the numpy twin, launcher validation, the variant picker, the
launcher's tile table against the .cu entry list, and ptxas's report (no spills, smem fits)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from minfer.cuda.paths.f16.gemm import (
    GEMVS,
    TILES,
    TMA,
    TMA_MAGIC,
    TMA_PARAM_PAD,
    VARIANTS,
    WGMMA,
    _check_out,
    _check_shapes,
    gemm_f16_nt_ref,
    pick_variant,
)
from minfer.cuda.runtime.build import KERNEL_DIR, compile_cubin, parse_ptxas
from minfer.errors import BadInput

H200_SMEM_OPTIN = 232448


def test_twin_matches_float64():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 40)).astype(np.float16)
    b = rng.standard_normal((9, 40)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    out = gemm_f16_nt_ref(a, b)
    assert out.dtype == np.float32 and out.shape == (7, 9)
    assert np.abs(out - ref).max() < 1e-4
    assert gemm_f16_nt_ref(a, b, np.float16).dtype == np.float16
    r = rng.standard_normal((7, 9)).astype(np.float32)
    np.testing.assert_allclose(gemm_f16_nt_ref(a, b, accumulate=r), r + ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "ashape,bshape,adt,msg",
    [
        ((4, 20), (8, 20), np.float16, "multiple of 8"),
        ((4, 16), (8, 24), np.float16, "inner dimensions"),
        ((4, 16), (8, 16), np.float32, "float16"),
        ((0, 16), (8, 16), np.float16, "empty"),
        ((4, 16, 1), (8, 16), np.float16, "2-D"),
    ],
)
def test_validation(ashape, bshape, adt, msg):
    with pytest.raises(BadInput, match=msg):
        _check_shapes(ashape, bshape, adt, np.float16)


def test_validation_out():
    with pytest.raises(BadInput, match="float32 or float16"):
        _check_out(np.float64, None, 2, 2)
    with pytest.raises(BadInput, match="accumulate buffer"):
        _check_out(np.float32, np.zeros((2, 3), np.float32), 2, 2)
    with pytest.raises(BadInput, match="float32 buffer"):
        _check_out(np.float16, np.zeros((2, 2), np.float32), 2, 2)


def test_pick_variant():
    assert pick_variant(1, 49152, 4096).startswith("gemv_f16_")
    for M in (2, 7, 16, 33, 64, 129, 512, 513, 2048):
        for N in (8, 200, 1024, 4096, 14336):
            v = pick_variant(M, N, 4096, 132, "sm_80")
            assert v in TILES, (M, N, v)  # no wgmma off Hopper
            assert pick_variant(M, N, 4096, 132, "sm_90") in {**TILES, **WGMMA, **TMA}
    assert pick_variant(2048, 14336, 4096, 132, "sm_90") in TMA


def test_pick_tma_follows_the_wave_fill():
    # the 8B shapes as measured on the H200 (TMA_TILE_SPEED): M = 512 takes the
    # narrow tile where the wide one leaves SMs idle (o, down: 64 wide tiles; gate|up: 85% of
    # 4 waves), 128 x 192 for qkv (128 tiles against 96 wide ones), the wide one at M = 2048
    pick = {
        (M, N): pick_variant(M, N, 4096, 132, "sm_90").replace("wgmma_f16_tma_", "")
        for M in (512, 2048)
        for N in (4096, 6144, 28672)
    }
    assert pick == {
        (512, 4096): "128x128x64_s6",
        (512, 6144): "128x192x64_s5",
        (512, 28672): "128x128x64_s6",
        (2048, 4096): "128x256x64_s4",
        (2048, 6144): "128x256x64_s4",
        (2048, 28672): "128x256x64_s4",
    }
    # too few tiles for either: the cp.async wgmma tiles (more, smaller blocks)
    assert pick_variant(128, 4096, 4096, 132, "sm_90") in WGMMA
    assert pick_variant(512, 4096, 4096, 132, "sm_80") in TILES  # never off Hopper


def test_tma_magic_and_param_pad_match_the_kernel():
    src90 = (KERNEL_DIR / "gemm_f16_sm90a.cu").read_text()
    magic = re.search(r"#define TMA_MAGIC (0x[0-9a-fA-F]+)", src90)
    assert magic and int(magic.group(1), 16) == TMA_MAGIC
    assert "0x210" in src90 and TMA_PARAM_PAD.size == 48 and not TMA_PARAM_PAD.any()


def test_tma_map_rejects_bad_tensors_before_the_driver():
    from minfer.cuda.runtime.tma import tmap_f16_2d
    from minfer.errors import GPUError

    for ptr, rows, cols, box in ((8, 16, 64, 128), (256, 16, 60, 128), (256, 16, 64, 512)):
        with pytest.raises(GPUError, match="TMA tensor map: bad"):
            tmap_f16_2d(ptr, rows, cols, box)
    assert TILES[pick_variant(2048, 14336, 4096, 132, "sm_80")].bm == 128


def test_table_mirrors_kernel_entries():
    src = (KERNEL_DIR / "gemm_f16.cu").read_text()
    tiles = {
        f"gemm_f16_nt_{bm}x{bn}x{bk}_w{wm}x{wn}_s{st}"
        for bm, bn, bk, wm, wn, st in re.findall(
            r"^GEMM_ENTRY\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+), \d+\)", src, re.M
        )
    }
    gemvs = {f"gemv_f16_r{r}" for r in re.findall(r"^GEMV_ENTRY\((\d+), \d+\)", src, re.M)}
    assert tiles == set(TILES) and gemvs == set(GEMVS)
    src90 = (KERNEL_DIR / "gemm_f16_sm90a.cu").read_text()
    wg = {
        f"wgmma_f16_nt_{bm}x{bn}x64_s{st}"
        for bm, bn, st in re.findall(r"^WGMMA_ENTRY\((\d+), (\d+), (\d+), \d+\)", src90, re.M)
    }
    assert wg == set(WGMMA)
    tma = {
        f"wgmma_f16_tma_128x{bn}x64_s{st}"
        for bn, st in re.findall(r"^TMA_ENTRY\((\d+), (\d+)\)", src90, re.M)
    }
    assert tma == set(TMA)
    # TmaTile.smem mirrors TmaSmem<BN, STAGES>::BYTES, which the .cu pins by static_assert
    pinned = dict(re.findall(r"TmaSmem<(\d+), \d+>::BYTES == (\d+)", src90))
    assert {int(bn): int(b) for bn, b in pinned.items()} == {t.bn: t.smem for t in TMA.values()}
    for t in (*WGMMA.values(), *TMA.values()):
        assert t.smem <= H200_SMEM_OPTIN, t.entry
    for t in TILES.values():
        assert t.smem <= H200_SMEM_OPTIN, t.entry
        assert (t.bm * t.bk // 8) % t.threads == 0 and (t.bn * t.bk // 8) % t.threads == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ptxas_no_spills_sm90():
    _, rep = compile_cubin("gemm_f16", "sm_90", report=True)
    res = parse_ptxas(rep)
    assert set(res) == set(TILES) | set(GEMVS)
    _, rep90 = compile_cubin("gemm_f16_sm90a", "sm_90", ("-arch=sm_90a",), report=True)
    res90 = parse_ptxas(rep90)
    assert set(res90) == set(WGMMA) | set(TMA)
    assert "serialized" not in rep90  # ptxas would say if it had to serialize the wgmma
    res.update(res90)
    assert set(res) == set(VARIANTS)
    for r in res.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack == 0, r
        assert r.registers <= 255, r


def test_glu_twin_is_swiglu_of_the_deinterleaved_product():
    from minfer.quants.glu import glu_rows
    from minfer.reference.ops import swiglu

    rng = np.random.default_rng(7)
    M, F, K = 5, 24, 40
    a = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal((2 * F, K)) * 0.3).astype(np.float16)  # [gate; up]
    c = a.astype(np.float32) @ w.astype(np.float32).T
    want = swiglu(c[:, :F], c[:, F:]).astype(np.float16)
    got = gemm_f16_nt_ref(a, w[glu_rows(F)], np.float16, glu=True)
    assert got.shape == (M, F) and np.array_equal(got, want)
    with pytest.raises(BadInput, match="N % 16"):
        gemm_f16_nt_ref(a, w[:40], np.float16, glu=True)
    with pytest.raises(BadInput, match="glu writes float16"):
        gemm_f16_nt_ref(a, w, np.float32, glu=True)
    with pytest.raises(BadInput, match="'relu' is not one of"):
        gemm_f16_nt_ref(a, w[glu_rows(F)], np.float16, glu="relu")


def test_geglu_twin_is_geglu_of_the_deinterleaved_product():
    """glu="gelu" (gemma): ops.geglu (ggml's f16-table GELU) of the de-interleaved product;
    glu=True stays silu."""
    from minfer.quants.glu import glu_rows
    from minfer.reference.ops import geglu

    rng = np.random.default_rng(8)
    M, F, K = 6, 32, 48
    a = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal((2 * F, K)) * 0.3).astype(np.float16)
    c = a.astype(np.float32) @ w.astype(np.float32).T
    want = geglu(c[:, :F], c[:, F:]).astype(np.float16)
    got = gemm_f16_nt_ref(a, w[glu_rows(F)], np.float16, glu="gelu")
    assert got.shape == (M, F) and np.array_equal(got, want)
    assert not np.array_equal(got, gemm_f16_nt_ref(a, w[glu_rows(F)], np.float16, glu=True))
