"""lab/blk_wgrid.py: the weight-grid variants of the blk emulation experiment ('row' is the
kernel's grid bit for bit; the finer grids err less; every q stays in int8's symmetric range);
lab/blk_signs.py: the sign-diagonal variant stays exact (its grids' product is its GEMM);
lab/blk_agrid.py: its per-token and wider-rotation grids, and the reference it patches."""

import numpy as np
import pytest

from minfer.cuda.paths.blk import twin as blk_ref


@pytest.fixture(scope="module")
def wg():
    return _script("blk_wgrid")


def _script(name):
    from helpers import load_script

    return load_script(f"lab/{name}.py")


def test_signs_variant_is_exact_and_differs(monkeypatch):
    bs = _script("blk_signs")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((20, 576)) + 3.0).astype(np.float32)  # a common offset
    w = (rng.standard_normal((30, 576)) * 0.02).astype(np.float32)
    plain = blk_ref.blk_grid(x)
    monkeypatch.setattr(blk_ref, "_rotated", blk_ref._rotated)  # undone after the test
    monkeypatch.setattr(blk_ref, "blk_grid", blk_ref.blk_grid)
    bs.patch()
    g, gw = blk_ref.blk_grid(x), blk_ref.blk_grid(w, True)
    y = blk_ref.blk_linear_ref(x, w)
    prod = g.astype(np.float64) @ gw.astype(np.float64).T
    assert np.linalg.norm(prod - y) <= 1e-6 * np.linalg.norm(y)
    assert not np.array_equal(g, plain) and np.abs(g - x).max() < 0.05 * np.abs(x).max()


def _weight(R=200, K=576):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((R, K)) * rng.gamma(1.0, 1.0, (R, 1))
    w[3, 5] = 40.0  # an outlier row
    return w.astype(np.float16).astype(np.float32)


def test_row_and_A_are_the_product_grids(wg, monkeypatch):
    """'row' is blk_ref's per_row emulation bit for bit; 'A' the grid per (row, 128) (pair=1;
    the kernel's shares a scale per pair of blocks), up to its quotient y / s where the kernel multiplies by 127 / amax (a last-bit difference
    that moves a value by at most one int8 step, rarely)."""
    w, x = _weight(), _weight(7, 576)
    row = blk_ref.blk_grid(w, weight=True, per_row=True)
    ref_w = blk_ref.blk_grid(w, weight=True, pair=1)
    ref_x = blk_ref.blk_grid(x)
    monkeypatch.setattr(blk_ref, "blk_grid", blk_ref.blk_grid)  # undone after the test
    wg.patch("row")
    assert np.array_equal(blk_ref.blk_grid(w, weight=True), row)
    assert np.array_equal(blk_ref.blk_grid(x), ref_x)  # activations untouched
    wg.patch("A")
    a = blk_ref.blk_grid(w, weight=True, pair=1)
    assert np.mean(a == ref_w) > 0.99 and not np.array_equal(a, row)
    assert np.array_equal(blk_ref.blk_grid(x), ref_x)


@pytest.mark.parametrize("v", ["A", "B", "C", "D", "Dm"])
def test_variants_err_less_and_stay_int8(wg, v):
    y = blk_ref._rotated(_weight())
    err = {u: float(((wg.weight_grid(y, u) - y) ** 2).sum()) for u in ("row", v, "A")}
    assert err[v] <= err["row"] * (1 + 1e-6)
    if v in ("A", "C"):
        assert err[v] <= err["A"] * (1 + 1e-6)
    g = wg.weight_grid(y, v)  # g = q s: q in [-127, 127] integers
    assert g.shape == y.shape and np.isfinite(g).all()
    assert np.abs(g).max() <= np.abs(y).max() * (1 + 1e-6)


def test_agrid_grids(monkeypatch):
    """lab/blk_agrid.py: at rot 128 its weight grid is blk_ref's per (row, 128) (pair=1)
    bit for bit; its token
    grid takes one scale per row (a quiet block of a loud row loses, a one-block row does not),
    and the rot256 grids of x and W still multiply to about x W^T."""
    ag = _script("blk_agrid")
    rng = np.random.default_rng(2)
    w = _weight()
    assert np.array_equal(ag.grid(w, True), blk_ref.blk_grid(w, weight=True, pair=1))
    x = rng.standard_normal((6, 576)).astype(np.float16).astype(np.float32)
    x[:, 128:256] *= 50  # one loud block per row
    err_tok = np.abs(ag.grid(x, False) - x)[:, :128].max()
    err_blk = np.abs(blk_ref.blk_grid(x) - x)[:, :128].max()
    assert err_tok > 10 * err_blk
    assert np.array_equal(ag.grid(x[:, :128], False), blk_ref.blk_grid(x[:, :128]))
    xs, ws = x[:, :512], w[:, :512]
    y = xs.astype(np.float64) @ ws.astype(np.float64).T
    for rot in (256, 512):
        prod = ag.grid(xs, False, rot).astype(np.float64) @ ag.grid(ws, True, rot).T
        assert np.linalg.norm(prod - y) < 0.05 * np.linalg.norm(y)
        assert not np.array_equal(ag.grid(ws, True, rot), ag.grid(ws, True))


def test_agrid_patch_routes_the_reference(tmp_path, monkeypatch):
    """blk_agrid.patch('norm:rot256') changes exactly the reference's GEMMs after a norm (whose
    per-token grid with 128-point rotations is the kernel's own)."""
    from synth_data import small_parts, write_small

    from minfer.gguf.loader import load_model
    from minfer.reference.forward import ReferenceBackend

    ag = _script("blk_agrid")
    monkeypatch.setattr(ReferenceBackend, "weight", ReferenceBackend.weight)  # undone after
    monkeypatch.setattr(ReferenceBackend, "_linear", ReferenceBackend._linear)
    model = load_model(write_small(tmp_path / "s.gguf", *small_parts(seed=4, d_model=384)))
    names = frozenset(
        n
        for n in model.tensors
        if n.startswith("blk.")
        and n.endswith(
            (
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
                "ffn_gate.weight",
                "ffn_up.weight",
                "ffn_down.weight",
            )
        )
    )
    ids = np.arange(12, dtype=np.int32) % 200
    base = ReferenceBackend(model, grids=dict.fromkeys(names, blk_ref.BlkGrid())).forward(ids, 0)
    ag.patch("norm:rot256")
    be = ReferenceBackend(model, grids=dict.fromkeys(names, blk_ref.BlkGrid()))
    got = be.forward(ids, 0)
    assert np.isfinite(got).all() and not np.array_equal(got, base)
    assert np.abs(got - base).max() < 0.1 * np.abs(base).max()
    assert np.array_equal(
        be.weight("blk.0.ffn_down.weight"),  # not in the group
        ReferenceBackend(model, grids=dict.fromkeys(names, blk_ref.BlkGrid())).weight(
            "blk.0.ffn_down.weight"
        ),
    )
