"""CPU: the bound of the blk experts' forward against the grid reference
(tests/gpu/test_moe_blk_device.py) and its derivation (minfer.reference.spread): the grid
reference moves ~10x more than the continuous forward under a perturbation of the MoE input of
an engine's rounding size (the int8 grids' rounding flips), so an engine that rounds exactly
as the grids do sits that far from it; the kernels' bit-exact twins composed into the forward
(moe_ffn_ref in each MoE layer, the rest the grid reference) sit within the derived bound; and
the positions before the first router near-tie (a tie at token 0 leaves none)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minfer.reference import moe as R


def test_positions_before_tie_counts_a_tie_at_token_0():
    far = np.array([1.0, 0.5, 0.2])
    assert R.positions_before_tie([(0, far), (1, far)], 3) == 3
    assert R.positions_before_tie([(0, far), (1, np.array([0.005, 1.0, 1.0]))], 3) == 0
    assert R.positions_before_tie([(0, np.array([1.0, 1.0, -0.002])), (1, far)], 3) == 2


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    from families_data import synth_family

    from minfer.cuda.plan.config import GemmChoice
    from minfer.cuda.plan.routes import plan_routes
    from minfer.gguf.loader import load_model
    from minfer.tools.check import reference_grids

    m = load_model(synth_family("tiny-qwen3moe", tmp_path_factory.mktemp("spread")))
    rt = types.SimpleNamespace(arch="sm_90", smem_optin=232448)  # an H100's routes (blk)
    grids = reference_grids(plan_routes(m, GemmChoice("blk"), rt=rt, ubatch=128), m)
    assert "blk.0.ffn_down_exps.weight" in grids and "blk.0.attn_q.weight" in grids
    # the first 24 tokens of the GPU test's seed-10 prompt: its first router near-tie is at 26
    ids = np.random.default_rng(10).integers(0, m.config.vocab_size, 200)[:24].astype(np.int32)
    return m, grids, ids


def test_the_grids_amplify_a_perturbation_tenfold(moe_model):
    from minfer.reference.spread import grid_spread

    m, grids, ids = moe_model
    r_grid, d_grid, _ = grid_spread(m, grids, ids, len(ids))
    r_none, d_none, _ = grid_spread(m, {}, ids, len(ids))
    print(
        f"\nspread eps {R.SPREAD_EPS:g}: grids rel {r_grid:.2e} max {d_grid:.4f}; "
        f"none rel {r_none:.2e} max {d_none:.4f}"
    )
    assert r_none < 3e-3 and d_none < 0.03  # the continuous forward: ~eps
    assert r_grid > 5 * r_none and d_grid > 3 * d_none


def test_the_twins_forward_sits_within_the_derived_bound(moe_model):
    """The forward with each MoE layer as the kernels compute it bit for bit (moe_ffn_ref on
    f16 h16 and the f16 weights, the GPU's router on them) against the grid reference: within
    SPREAD_MARGIN times the spread, as the GPU test asks of the device."""
    from minfer.cuda.paths.blk import moe as B
    from minfer.reference.forward import ReferenceBackend
    from minfer.reference.spread import grid_spread, rel

    m, grids, ids = moe_model

    class Twins(ReferenceBackend):
        def _moe(self, il, h):
            p, c = f"blk.{il}.", self.cfg
            w16 = [
                self.model.dequant(p + s).astype(np.float16)
                for s in (
                    "ffn_gate_inp.weight",
                    "ffn_gate_exps.weight",
                    "ffn_up_exps.weight",
                    "ffn_down_exps.weight",
                )
            ]
            out, _, _ = B.moe_ffn_ref(
                h.astype(np.float16), *w16, c.n_expert_used, c.moe_norm_w, c.moe_w_scale
            )
            return out.astype(self.dtype)

    ref = ReferenceBackend(m, grids=grids, max_tokens=64)
    ref.router_log = []
    want = ref.window_logits(ids, 0)
    n = R.positions_before_tie(ref.router_log, len(ids))
    assert n == len(ids)
    r, d, base = grid_spread(m, grids, ids, n)
    assert np.array_equal(base, want)
    got = Twins(m, grids=grids, max_tokens=64).window_logits(ids, 0)
    e, dd = rel(got, want), float(np.abs(got - want).max())
    print(
        f"\ntwins' forward: rel {e:.2e} max {dd:.4f}; bound rel {R.SPREAD_MARGIN * r:.2e} "
        f"max {R.SPREAD_MARGIN * d:.4f}"
    )
    assert e <= R.SPREAD_MARGIN * r and dd <= R.SPREAD_MARGIN * d
