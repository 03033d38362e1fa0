"""GPU test fixtures: `rt`, the process's minfer Runtime (tests here skip without a GPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def rt():
    from minfer.cuda.runtime import get_runtime

    return get_runtime()
