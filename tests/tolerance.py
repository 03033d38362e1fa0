"""The tolerance rule of the CPU identity tests: one computation done two ways (packed vs alone,
waves vs one wave, batch vs single, chunked vs whole) whose results must agree. The two ways
differ only in the order numpy's BLAS sums, and that order depends on the CPU's kernel
(OPENBLAS_CORETYPE), the thread count and the GEMM shapes; so no test states a tolerance
measured on one machine. Each takes it from one of the two rules below (docs/cpu-backend.md).

float64, the oracle mode (ReferenceBackend(dtype=np.float64), Engine(dtype="f64")):
    exact up to rounding. A sum of K terms in float64 is off by at most K*u64 relative (u64 =
    2**-53, Higham, Accuracy and Stability, 2nd ed., eq. 3.5); a forward of L layers chains
    L + 1 such stages (the LM head the last), counted here as adding, not amplifying (each
    layer normalizes its input): two runs differ by delta <= 2 (L + 1) K u64 S, S the outputs'
    magnitude, ~1e-12 S for K = 4096, L = 30. The outputs are float32 (logits, row stats):
    each a rounding of a value within delta, so two differ by at most delta + one f32 ulp
    (<= 2**-23 S), and a statistic of two logits (a log-prob, logit - logsumexp; a margin,
    top1 - top2) by twice that plus its own rounding:
        f64_tol = 2 delta + 4 * 2**-23 * S     (the f32 rounding dominates: ~5e-7 S)
    The f16 KV rounding (kv_f16) stays on in float64; a summation order flips one only where a
    value lies within delta of an f16 rounding boundary, odds ~delta / 2**-11 per value.

float32, llama.cpp's numerics (f16 KV cache, ggml's f16 GELU table): not exact. Another order
    moves a value by f32 ulps, which can flip an f16 rounding of q, K, V or a softmax
    probability (a step of 2**-11 relative) that the later layers carry: the two runs differ
    by up to the size of the f32 computation's own error, not by a few ulps. That error is
    measured on this machine's BLAS: err = max |f32 - f64| over the logits and log-probs of
    the one-at-a-time computation. The other way's run has an error of the same kind and size,
    so the two differ by at most 2 err (one error each), and a statistic of two values (as
    above) by twice that:
        f32_tol = 4 err
    err must itself be rounding-sized, at most F32_ERR_MAX * S (measured: 3e-4 S on the tiny
    families, 2.5e-3 absolute); beyond that the f32 forward is broken, and a tolerance derived
    from it would hide the bug.

Both stay far below what a real bug moves: a sequence attending another's rows, a wrong
position or slot, moves log-probs by O(0.1..1) (test_packed_reference's
test_attending_across_sequences_is_caught).
"""

from __future__ import annotations

import numpy as np

U64 = 2.0**-53  # float64 unit roundoff
ULP32 = 2.0**-23  # an f32 ulp of x is at most ULP32 * |x|
F32_ERR_MAX = 2.0**-6  # 32 f16 unit roundoffs (2**-11) of the output scale


def scale(logits) -> float:
    """S of the rule: a bound on |logit|, |logsumexp| and |log-prob| of these logits [.., V]
    (logsumexp <= max + log V; a log-prob is a logit minus the logsumexp)."""
    x = np.asarray(logits, np.float64)
    return float(2 * np.abs(x).max() + np.log(x.shape[-1]))


def f64_tol(cfg, s: float) -> float:
    """The float64 rule (module docstring) for a model of config cfg and output scale s."""
    k = max(cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim, cfg.n_ctx)  # the longest sum
    delta = 2 * (cfg.n_layers + 1) * k * U64 * s
    return 2 * delta + 4 * ULP32 * s


def f32_err(pairs) -> float:
    """max |a - b| over pairs of arrays (f32 run, f64 oracle run of the same computation)."""
    return max(
        float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()) for a, b in pairs
    )


def f32_tol(err: float, s: float) -> float:
    """The float32 rule (module docstring): err, the f32 run's measured error against the f64
    oracle; s, the output scale (the sanity bound on err)."""
    assert 0 <= err <= F32_ERR_MAX * s, (
        f"the f32 forward is {err:.3g} off the f64 oracle (scale {s:.3g}): beyond rounding"
    )
    return 4 * err


def tol(dtype, cfg, s: float, err: float | None = None) -> float:
    """f64_tol for float64 (dtype np.float64 or "f64"), else f32_tol(err, s)."""
    if dtype == "f64" or (dtype != "f32" and np.dtype(dtype) == np.float64):
        return f64_tol(cfg, s)
    return f32_tol(err, s)
