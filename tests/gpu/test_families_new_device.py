"""GPU: what granite, olmo2 and smollm3 (minfer/families/) add to the CUDA forward, against
the numpy twins, and `minfer check` on each at its real layer shape. Their tiny files against
llama.cpp's golden logits (f16 path) and `minfer check` on their tiny Q4_K_M files run in
tests/gpu/test_families_device.py (FAMILIES includes them).
- granite's residual scale: scale_add_f32 (x += t * s, the product rounded first) bit for bit
  as the reference's `x + a * float32(s)`;
- olmo2's q/k norms over the whole projection: head_rmsnorm_f32 with one "head" of H x D
  values (the reference's rmsnorm over the row);
- smollm3's layers without RoPE: rope_qkv on the identity table leaves q and k as they are."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.reference import ops

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T,D", [(1, 256), (37, 2048), (130, 4096)])
def test_scale_add(rt, T, D):
    from minfer.cuda.ops import gemma_layers as G
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T + D)
    x = (rng.standard_normal((T, D)) * 8).astype(np.float32)
    t = (rng.standard_normal((T, D)) * 3).astype(np.float32)
    xd = da.to_device(rt, x)
    G.scale_add(rt, xd, da.to_device(rt, t), 0.22)
    assert np.array_equal(xd.get(), x + t * np.float32(0.22))


@pytest.mark.parametrize(
    "T,H,D,col,ld", [(5, 32, 128, 0, 6144), (3, 8, 128, 4096, 6144), (1, 40, 128, 0, 5120)]
)
def test_head_rmsnorm_over_the_whole_projection(rt, T, H, D, col, ld):
    """olmo2: one norm over H x D values (H 1 in the launcher), in place at column col."""
    from minfer.cuda.ops.layers import head_rmsnorm
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(T * H)
    x = (rng.standard_normal((T, ld)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, H * D).astype(np.float32)
    xd = da.to_device(rt, x)
    head_rmsnorm(rt, xd, col, 1, H * D, da.to_device(rt, w), 1e-6)
    ref = x.copy()
    ref[:, col : col + H * D] = ops.rmsnorm(x[:, col : col + H * D], w, 1e-6)
    got = xd.get()
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max()


def test_identity_rope_table_leaves_q_and_k(rt):
    from minfer.cuda.ops import layers as L
    from minfer.cuda.runtime import devarray as da

    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 4, 64)).astype(np.float32)
    xd = da.to_device(rt, x)
    L.rope(rt, xd, L.RopeTable.identity(rt, 16, 64), 3, 64, False)
    assert np.array_equal(xd.get(), x)


@pytest.mark.parametrize(
    "preset,gemm",
    [
        ("granite-3-8b", "f16"),
        ("granite-3-8b", "blk"),
        ("olmo2-7b", "f16"),
        ("olmo2-7b", "blk"),
        ("smollm3-3b", "f16"),
        ("smollm3-3b", "blk"),
    ],
)
def test_check_at_the_real_shapes(tmp_path, preset, gemm):
    """`minfer check` (parity and tie-aware greedy 32 against the reference) at each family's
    real layer shape, 4 layers (smollm3: layer 3 without RoPE), a vocab of 4096, Q4_K_M."""
    from click.testing import CliRunner

    from minfer.commands.check import check
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    path = tmp_path / f"{preset}.gguf"
    make_synthetic_model(
        path,
        SynthOptions(preset=preset, qtype="q4_K_M", layers=4, vocab=4096, tokenizer_from=None),
        progress=False,
    )
    r = CliRunner().invoke(
        check, ["-m", str(path), "--gemm", gemm, "-p", "The quick brown fox " * 24]
    )
    assert r.exit_code == 0, r.output
    assert "check: PASS" in r.output
