"""The golden llama.cpp files (tests/golden/, a copy of shared/golden): paths and loaders.

A plain module (not conftest) so tests can import it: tests/gpu/conftest.py would shadow
`import conftest`.
"""

from __future__ import annotations

import json
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"


def golden(kind: str = "q4_1") -> dict:
    return json.loads((GOLDEN / f"smollm2-135m-{kind}.json").read_text())
