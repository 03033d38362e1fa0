"""Helpers shared by the GPU tests."""

from __future__ import annotations

import numpy as np


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; a non-finite output (unwritten poison) fails."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output (unwritten poison?)"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
