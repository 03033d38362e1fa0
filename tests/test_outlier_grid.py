"""CPU: ffn_down on int8 with its busiest input channels on f16 (minfer/cuda/paths/blk/outliers.py,
`--emulate blk-int8down`): the channel choice, the grid against blk's and the exact product, the
calibration's statistics (every row of every layer, the cache) and the emulation's binding."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.cuda.paths.blk.outliers import N_OUTLIERS, OutlierGrid, busiest
from minfer.cuda.paths.blk.twin import BlkGrid

DOWN = "blk.0.ffn_down.weight"


def test_busiest_takes_the_largest_mean_squares_in_ascending_order():
    ms = np.array([5.0, 1.0, 9.0, 0.0, 7.0, 2.0])
    assert busiest(ms, 3).tolist() == [0, 2, 4] and busiest(ms, 3).dtype == np.int32
    assert busiest(ms, 99).tolist() == list(range(6))  # K <= n: every channel
    assert len(busiest(np.arange(1000.0))) == N_OUTLIERS


def _massive(seed=0, M=48, N=96, K=512, big=300.0):
    """x [M, K] with one massive channel (SwiGLU's kind), w [N, K]; the channel's index."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    j = 137
    x[:, j] *= big
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    return x, w, j


def test_kept_channels_are_exact_the_rest_is_blks_grid_of_the_zeroed_operand():
    x, w, j = _massive()
    keep = np.array([5, j, 400], np.int32)
    g = OutlierGrid(BlkGrid()).bound({DOWN: keep})
    xa, wa = g.act(x, DOWN), g.weight(w, DOWN)
    f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    assert np.array_equal(xa[:, keep], f16(x)[:, keep])
    assert np.array_equal(wa[:, keep], f16(w)[:, keep])
    xr, wr = x.copy(), w.copy()
    xr[:, keep] = 0
    wr[:, keep] = 0
    rest = np.setdiff1d(np.arange(x.shape[1]), keep)
    assert np.array_equal(xa[:, rest], BlkGrid().act(xr, DOWN)[:, rest])
    assert np.array_equal(wa[:, rest], BlkGrid().weight(wr, DOWN)[:, rest])


def test_a_massive_channel_kept_exact_removes_most_of_the_error():
    """The decomposition's point: blk's error on a product with a massive input channel comes
    from that channel times the weight's rounding; kept exact, the error falls to what the other
    channels' int8 leaves (an order of magnitude here, the bound a factor 4)."""
    x, w, j = _massive()
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    blk = BlkGrid()
    e_blk = np.abs(blk.act(x, DOWN).astype(np.float64) @ blk.weight(w, DOWN).T - exact).max()
    g = OutlierGrid(BlkGrid()).bound({DOWN: busiest((x.astype(np.float64) ** 2).mean(0), 8)})
    assert j in g.cols(DOWN)
    e_out = np.abs(g.act(x, DOWN).astype(np.float64) @ g.weight(w, DOWN).T - exact).max()
    assert e_out < e_blk / 4, (e_out, e_blk)


def test_an_unbound_grid_names_the_weight():
    x, w, _ = _massive()
    with pytest.raises(KeyError, match="no calibrated channels for blk.0.ffn_down.weight"):
        OutlierGrid(BlkGrid()).act(x, DOWN)


@pytest.fixture
def small(tmp_path, monkeypatch):
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "cache"))
    parts = small_parts(seed=2, tied=False, d_ff=512)  # ff 512: 128 of its channels kept
    return load_model(write_small(tmp_path / "small.gguf", *parts))


def _downs(model):
    return sorted(n for n in model.tensors if n.endswith(".ffn_down.weight"))


def test_calibration_counts_every_row_of_every_layer_and_caches(small, monkeypatch):
    """The mean square of each ffn_down input over 2 windows, against a recorder that keeps the
    inputs whole; the last layer too (the forward would run it on the scored rows only); the
    second call reads the cache, a damaged cache file is computed again."""
    from minfer.engine.calib import CALIB_TEXT, calib_windows
    from minfer.host.fileio import cache_root
    from minfer.reference.forward import ReferenceBackend
    from minfer.tools.perplexity import calibrate

    downs = _downs(small)
    ms = calibrate.channel_stats(small, downs, windows=2, ctx=32)

    seen: dict[str, list] = {}

    class Keep:
        name = "keep"

        def weight(self, w, name):
            return w

        def act(self, x, name):
            seen.setdefault(name, []).append(np.asarray(x, np.float16).astype(np.float64))
            return x

    be = ReferenceBackend(small, np.float32, max_tokens=32, grids=dict.fromkeys(downs, Keep()))
    for w in calib_windows(small, CALIB_TEXT.read_text(), 2, 32):
        be.window_logits(w, 0)
    for n in downs:
        xs = np.concatenate([a.reshape(-1, a.shape[-1]) for a in seen[n]])
        assert xs.shape[0] == 64  # 2 windows of 32, every row, the last layer's too
        np.testing.assert_allclose(ms[n], (xs * xs).mean(0), rtol=1e-12)

    files = list(cache_root("calib").glob("*.npz"))
    assert len(files) == 1
    import minfer.reference.forward as fwd

    def no_forward(*a, **k):
        raise AssertionError("the cache was not read")

    monkeypatch.setattr(fwd, "ReferenceBackend", no_forward)
    again = calibrate.channel_stats(small, downs, windows=2, ctx=32)  # from the cache
    assert all(np.array_equal(again[n], ms[n]) for n in downs)
    files[0].write_bytes(b"not an npz")
    monkeypatch.undo()
    monkeypatch.setenv("MINFER_CACHE", str(files[0].parents[1]))
    redone = calibrate.channel_stats(small, downs, windows=2, ctx=32)
    assert all(np.array_equal(redone[n], ms[n]) for n in downs)


def test_emulation_binds_every_ffn_down_to_its_busiest_channels(small):
    """--emulate blk-int8down: ffn_down on the outlier grid with the calibration's busiest
    channels (N_OUTLIERS of ff 512), every other blk weight on blk's grid, the head exact."""
    from minfer.tools.perplexity.calibrate import channel_stats
    from minfer.tools.perplexity.emulate import emulated_grids

    g = emulated_grids(small, "blk-int8down")
    downs = _downs(small)
    ms = channel_stats(small, downs)
    for n, v in g.items():
        if n in downs:
            assert isinstance(v, OutlierGrid)
            assert np.array_equal(v.cols(n), busiest(ms[n])) and len(v.cols(n)) == N_OUTLIERS
        else:
            assert isinstance(v, BlkGrid)
    assert set(downs) <= set(g) and small.output_name not in g


def test_perplexity_runs_the_label(small, tmp_path):
    """The command end to end on the small model: one window, the label in its header."""
    from cli_inproc import run_cli

    args = ["perplexity", "-m", str(small.path), "--emulate", "blk-int8down", "-c", "64",
            "--chunks", "1", "-t", "1", "--json"]  # fmt: skip
    code, out, err = run_cli(args)
    assert code == 0, err
    import json

    rec = json.loads(out)
    assert rec["emulate"]["grid"] == "blk-int8down" and rec["backend"] == "cpu+blk-int8down"
    assert np.isfinite(rec["ppl"])
    # the calibration says so when it runs, and is read from its cache the next time
    assert "calibrating 2 weights' input channels on the exact CPU forward" in err
    code, out2, err2 = run_cli(args)
    assert code == 0 and "calibrating" not in err2 and json.loads(out2)["ppl"] == rec["ppl"]


def test_the_emulation_is_the_split_kernels_math_but_for_noise_times_noise():
    """split_linear_ref (the kernel's math: blk's GEMM of the zeroed operands + the f16 product of
    the kept columns) against the emulated product: they differ only by the int8 GEMM's rounding
    noise on the zeroed columns times the other side's, under 1 % of either's error."""
    from minfer.cuda.paths.blk.outliers import split_linear_ref

    x, w, _ = _massive()
    cols = busiest((x.astype(np.float64) ** 2).mean(0), 128)
    g = OutlierGrid(BlkGrid()).bound({DOWN: cols})
    emu = g.act(x, DOWN).astype(np.float64) @ g.weight(w, DOWN).astype(np.float64).T
    ker = split_linear_ref(x, w, cols)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(emu - ker).max() < 0.01 * np.abs(ker - exact).max()
