"""Helpers shared by the GPU tests."""

from __future__ import annotations

import numpy as np


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; a non-finite output (unwritten poison) fails."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output (unwritten poison?)"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def prefill_and_step(backend, seed: int, n: int = 37):
    """(logits of a random n-token prompt in the backend's chunks, logits of one greedy decode
    step after it): what an epilogue switch must leave bit for bit unchanged."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, backend.c.vocab_size, n).astype(np.int32)
    first = backend.forward(prompt, 0)
    nxt = backend.forward(np.array([int(np.argmax(first))], np.int32), n)
    assert np.isfinite(first).all() and np.isfinite(nxt).all()
    return first, nxt


MOE = ("tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe")  # (qwen2moe: + the shared expert)
MOE_NAMES = [*MOE, *(p + "-q4km" for p in MOE)]


def moe_models(d) -> dict:
    """The MoE GPU tests' models in folder d: each tiny MoE family as its F16 synth file and as
    a Q4_K_M one (name + "-q4km"), loaded."""
    from families_data import synth_family

    from minfer.gguf.loader import load_model
    from minfer.tools.synth import SynthOptions, make_synthetic_model

    out = {p: load_model(synth_family(p, d)) for p in MOE}
    for p in MOE:
        path = d / f"{p}-q4km.gguf"
        make_synthetic_model(
            path,
            SynthOptions(preset=p, qtype="q4_K_M", vocab=1024, tokenizer_from=None, workers=1),
            progress=False,
        )
        out[p + "-q4km"] = load_model(path)
    return out


def check_moe_chain(label: str, out, sel, logits, want, rsel, k: int, bound: float) -> None:
    """A MoE layer's output out [T, d] (host) against its twins' `want`: rows the device routed
    otherwise (sel vs rsel [T, k]) must be router near-ties (< 1e-3) and are left out; the rest
    within `bound` (relative)."""
    from minfer.reference import moe as R

    alike = (sel == rsel).all(1)
    _, _, gap = R.route(logits, k)
    assert (np.abs(gap[~alike]) < 1e-3).all(), "a row routed otherwise is no near-tie"
    assert alike.mean() > 0.95
    err = rel_err(out[alike], want[alike])
    print(f"\n{label}: rel err {err:.2e}, {int((~alike).sum())} near-tie rows")
    assert err <= bound
