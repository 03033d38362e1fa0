"""CPU: `minfer perplexity --emulate GRID` (minfer.tools.perplexity.emulate) on the tiny synthetic
q4_K_M model (d 256, ff 512, 2 layers: q4_K and q6_K weights, K % 256 == 0): the grids go on
the weights the GPU path would route to its int8 kernel and never on the LM head; an emulated
run's logits move a little from the exact run's (KLD small but > 0); blk256 is a grid of its
own; blk_ref's block parameter keeps the kernel's 128 results."""

from __future__ import annotations

import numpy as np
import pytest
from cli_inproc import error_lines, run_cli
from ppl_data import run_ppl, short_text
from synth_data import tiny_model

CTX, CHUNKS = 32, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("emu"), seed=7, vocab=512)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return short_text(tmp_path_factory, 400)


def _ppl(model, text, *extra):
    return run_ppl(model, text, CTX, CHUNKS, *extra)


def test_emulated_weights_follow_the_gpu_routes(tiny):
    from minfer.gguf.loader import load_model
    from minfer.tools.perplexity.emulate import emulated_weights

    model = load_model(tiny)
    linear = {n for n, t in model.tensors.items() if len(t.shape) == 2 and "blk." in n}
    kq = {n for n in linear if model.tensors[n].qtype in (12, 14)}
    assert {model.tensors[n].qtype for n in kq} == {12, 14}
    # every K here is a multiple of 256; an attn_v whose type differs from its q and k runs
    # alone, on f16 (routes.plan_routes)
    alone = {
        n
        for n in kq
        if ".attn_v." in n
        and model.tensors[n].qtype != model.tensors[n.replace("attn_v", "attn_q")].qtype
    }
    assert alone and emulated_weights(model, "q8_1") == kq - alone
    # blk leaves ffn_down to f16 (paths.GemmPath.f16_kinds)
    down = {n for n in linear if ".ffn_down." in n}
    assert (
        down
        and emulated_weights(model, "blk") == emulated_weights(model, "blk256") == linear - down
    )
    assert emulated_weights(model, "q8_1-all") == linear  # the q8_1 grid on every GEMM
    for g in ("q8_1", "q8_1-all", "blk"):
        assert model.output_name not in emulated_weights(model, g)


def test_plain_types_take_only_blk(tmp_path):
    """Q8_0 / F16 weights (the 2-layer small model, K = 64 or 128): no q8_1 kernel takes
    them; blk takes every one (any type, K % 32 == 0) but ffn_down (f16 for accuracy)."""
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model
    from minfer.tools.perplexity.emulate import emulated_weights

    model = load_model(write_small(tmp_path / "small.gguf", *small_parts(seed=2, tied=False)))
    linear = {n for n, t in model.tensors.items() if len(t.shape) == 2 and "blk." in n}
    assert emulated_weights(model, "q8_1") == frozenset()
    down = {n for n in linear if ".ffn_down." in n}
    assert emulated_weights(model, "blk") == linear - down and len(linear) == 14
    assert emulated_weights(model, "q8_1-all") == linear


def test_emulated_grid_moves_the_logits_a_little(tiny, text, tmp_path):
    base = tmp_path / "exact.logits"
    exact = _ppl(tiny, text, "--backend", "cpu", "--save-logits", str(base))
    runs = {
        g: _ppl(tiny, text, "--emulate", g, "--kld-base", str(base))
        for g in ("blk", "blk256", "q8_1")
    }
    for g, r in runs.items():
        k = r["kld"]
        assert r["backend"] == f"cpu+{g}" and r["emulate"]["grid"] == g
        assert 0 < k["mean"] < 0.02 and 0 < k["max_abs_dlogit"] < 1, (g, k)
        # a random model's near-uniform rows (PPL ~900 of vocab 512) flip top-1 on near-ties
        assert k["same_top1"] > 0.5 and r["ppl"] != exact["ppl"]
        assert r["ppl"] == pytest.approx(exact["ppl"], rel=0.05)
    assert runs["blk"]["kld"]["mean"] != runs["blk256"]["kld"]["mean"]


def test_emulate_refuses_the_cuda_backend(tiny, text):
    code, _, err = run_cli(
        ["perplexity", "-m", str(tiny), "-f", str(text), "--backend", "cuda", "--emulate", "blk"]
    )
    assert code == 2 and "--emulate blk runs on the CPU backend" in error_lines(err)[0]


def test_blk_block_256_is_a_grid_and_128_the_default():
    from minfer.cuda.paths.blk.twin import blk_grid, quantize_blk

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((9, 320)) * np.exp(rng.standard_normal((9, 320)))).astype(np.float32)
    for weight in (False, True):
        q, s = quantize_blk(x, weight=weight, block=256)
        assert q.shape == (9, 512) and s.shape == (9, 2)
        assert quantize_blk(x, weight=True, per_row=True)[1].shape == (9,)  # the row grid
        g128, g256 = blk_grid(x, weight), blk_grid(x, weight, block=256)
        assert np.array_equal(g128, blk_grid(x, weight, block=128))
        for g in (g128, g256):  # a close grid, not the input
            rel = np.abs(g - x).max() / np.abs(x).max()
            assert 0 < rel < 0.01
        assert not np.array_equal(g128, g256)
        # on the grid already: the 256 grid maps onto itself up to f32 rounding of H
        again = blk_grid(g256, weight, block=256)
        assert np.abs(again - g256).max() <= 1e-3 * np.abs(x).max()


def test_weight_scales_are_shared_by_pairs_of_blocks():
    """A blk weight has one scale per (row, pair of 128-K blocks): the pair's larger block sets
    it, both slots hold it, an odd last block keeps its own; activations stay per block, and
    pair=1 gives the per-block grid back."""
    from minfer.cuda.paths.blk.twin import WPAIR, quantize_blk

    assert WPAIR == 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 576)).astype(np.float16).astype(np.float32)  # 5 blocks
    x[:, 128:256] *= 30  # block 1 loud: it sets pair (0, 1)
    _, s = quantize_blk(x, weight=True)
    _, s1 = quantize_blk(x, weight=True, pair=1)
    assert s.shape == s1.shape == (5, 5)
    assert np.array_equal(s[:, 0], s[:, 1]) and np.array_equal(s[:, 0], s1[:, 1])
    assert np.array_equal(s[:, 2], s[:, 3]) and np.array_equal(s[:, 2], s1[:, 2:4].max(axis=1))
    assert np.array_equal(s[:, 4], s1[:, 4])  # the odd last block alone
    assert (s1[:, 0] < s[:, 0]).all()  # the quiet block shares the loud scale
    _, sa = quantize_blk(x)
    assert not np.array_equal(sa[:, 0], sa[:, 1])  # tokens: per block
