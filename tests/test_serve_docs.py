"""docs/serve.md's curl examples, each run against a live server (the 2-layer test llama with a
chat template on the CPU reference): every one answers JSON without an error object."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from serve_helpers import Server, small_chat_model  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "serve.md"


def _examples() -> list[str]:
    block = re.search(r"## Examples.*?```sh\n(.*?)```", DOC.read_text(), re.S).group(1)
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_the_docs_have_examples():
    cmds = _examples()
    assert len(cmds) >= 5 and all(c.startswith("curl ") for c in cmds)


def test_curl_examples_run(tmp_path):
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed (docs/serve.md's examples use it)")
    s = Server(small_chat_model(tmp_path))
    try:
        for cmd in _examples():
            cmd = cmd.replace("http://127.0.0.1:8080", s.url)
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, (cmd, p.stderr)
            out = json.loads(p.stdout)
            assert "error" not in out, (cmd, out)
    finally:
        assert s.stop() == 0
