"""single.run (chunking, greedy feedback, validation) on a scripted fake backend, and the
tie-aware greedy gate (minfer.tools.gates)."""

from __future__ import annotations

import numpy as np
import pytest

from minfer.batch import single
from minfer.errors import BadInput
from minfer.tools import gates


class FakeBackend:
    """Logits = one-hot-ish of (last id + 1) % V, with a tie at id 0 vs 1 after token 7."""

    name = "fake"

    def __init__(self, vocab=11):
        self.vocab = vocab
        self.calls: list[tuple[list[int], int]] = []
        self.n_past = 0
        self.resets = 0

    def reset(self):
        self.n_past = 0
        self.resets += 1

    def synchronize(self):
        pass

    def forward(self, ids, pos0):
        assert ids.dtype == np.int32 and pos0 == self.n_past
        self.calls.append((ids.tolist(), pos0))
        self.n_past += len(ids)
        out = np.zeros(self.vocab, np.float32)
        last = int(ids[-1])
        if last == 7:
            out[0] = out[1] = 5.0  # a tie: argmax must take the first index
        else:
            out[(last + 1) % self.vocab] = 3.0
            out[(last + 2) % self.vocab] = 1.0
        return out


def test_run_chunks_and_feeds_back_greedy():
    be = FakeBackend()
    r = single.run(be, [1, 2, 3, 4, 5, 6, 7], n_greedy=4, ubatch=3, n_ctx=64)
    assert be.resets == 1
    assert be.calls[:3] == [([1, 2, 3], 0), ([4, 5, 6], 3), ([7], 6)]
    # after 7: tie 0/1 -> 0; then 1, 2, 3 ; the last greedy id is never fed back
    assert r.greedy_ids == [0, 1, 2, 3]
    assert be.calls[3:] == [([0], 7), ([1], 8), ([2], 9)]
    assert r.step_margins == [0.0, 2.0, 2.0, 2.0]
    assert r.prompt_ids == [1, 2, 3, 4, 5, 6, 7] and r.last_logits[0] == 5.0
    assert r.prefill_s > 0 and r.prefill_tok_s > 0 and r.decode_tok_s > 0


def test_run_zero_greedy():
    be = FakeBackend()
    r = single.run(be, [3], n_greedy=0, n_ctx=8)
    assert r.greedy_ids == [] and len(be.calls) == 1 and np.isnan(r.decode_tok_s)


@pytest.mark.parametrize(
    "ids,n,ub,match",
    [
        ([], 4, 512, "empty prompt"),
        ([1, 2], -1, 512, "greedy must be >= 0"),
        ([1, 2], 4, 0, "ubatch"),
        ([1] * 60, 5, 512, r"60 tokens \+ 5 greedy tokens = 65 exceeds the model's context of 64"),
    ],
)
def test_run_validation_before_any_work(ids, n, ub, match):
    be = FakeBackend()
    with pytest.raises(BadInput, match=match):
        single.run(be, ids, n_greedy=n, ubatch=ub, n_ctx=64)
    assert be.calls == [] and be.resets == 0


def test_run_takes_n_ctx_from_the_model(default_model):
    class WithModel(FakeBackend):
        model = default_model

    n_ctx = default_model.config.n_ctx
    with pytest.raises(BadInput, match=f"{n_ctx - 1} tokens.*context of {n_ctx}"):
        single.run(WithModel(), [1] * (n_ctx - 1), n_greedy=32)


# -- gates ------------------------------------------------------------------------------------
def test_gate_exact():
    v = gates.compare_greedy([1, 2, 3], [1, 2, 3], [0.5, 0.01, 0.3], tau=0.1)
    assert v.ok and v.exact == 3 and v.identical_through == 3 and v.describe() == "3/3 exact"
    assert v.near_tie == 0.01 and v.near_tie_step == 2


def test_gate_divergence_after_near_tie_is_ok():
    v = gates.compare_greedy([1, 2, 9, 9], [1, 2, 3, 4], [1.0, 0.05, 2.0, 2.0], tau=0.1)
    assert v.ok and v.exact == 2 and v.identical_through == 2
    assert v.describe().startswith(
        "2/4 exact; identical through step 2, then a divergence at "
        "margin 2, after the first near-tie (margin 0.05 < tau 0.1 "
        "at step 2)"
    )
    # divergence exactly at the near-tie step is legitimate too
    v = gates.compare_greedy([1, 9, 9], [1, 2, 3], [1.0, 0.05, 2.0], tau=0.1)
    assert v.ok and v.identical_through == 1
    assert v.describe() == (
        "1/3 exact; identical through step 1, then a near-tie of margin 0.05 < tau 0.1"
    )


def test_gate_divergence_at_large_margin_is_a_bug():
    v = gates.compare_greedy([1, 9, 3, 4], [1, 2, 3, 4], [1.0, 0.5, 0.01, 2.0], tau=0.1)
    assert not v.ok and v.exact == 3 and v.identical_through == 1 and v.diverged_margin == 0.5
    assert "DIVERGENCE at step 2" in v.describe()
    with pytest.raises(ValueError, match="lengths"):
        gates.compare_greedy([1], [1, 2], [1, 1], 0.1)


def test_logit_error_and_tau():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([1.0, 2.5, 2.75], np.float32)
    assert gates.logit_error(a, b) == 0.5 and gates.tau_from(a, b) == 1.0
    with pytest.raises(ValueError):
        gates.logit_error(a, b[:2])
