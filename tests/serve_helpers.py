"""A `minfer serve` subprocess for tests: loopback only, any free port (read from its stderr
line), and it stops itself: SIGTERM at the end, and the kernel's parent-death signal if the
test process dies first."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def small_chat_model(folder: Path, seed: int = 0, n_ctx: int = 512) -> Path:
    """The 2-layer test llama (tests/synth_data.small_parts) with a ChatML template."""
    from synth_data import small_parts, write_small

    meta, tensors = small_parts(seed, n_ctx=n_ctx)
    meta["tokenizer.chat_template"] = CHATML
    return write_small(Path(folder) / "small-chat.gguf", meta, tensors)


def _die_with_parent():  # Linux: SIGTERM this child when the test process goes away
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Server:
    def __init__(
        self,
        model: Path,
        *args: str,
        env: dict | None = None,
        wait: float = 300,
        backend: str = "cpu",
    ):
        cmd = [
            sys.executable,
            "-m",
            "minfer",
            "serve",
            "-m",
            str(model),
            "--backend",
            backend,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=_die_with_parent,
        )
        self.lines: list[str] = []
        t0 = time.monotonic()
        self.url = None
        while time.monotonic() - t0 < wait:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"on (http://\S+) \(", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.stop()
            raise RuntimeError(
                "the server did not start:\n" + "".join(self.lines) + self.proc.stderr.read()
            )
        # keep draining stderr so the server never blocks on a full pipe
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def engine_logprobs(engine, ids_list) -> list[np.ndarray]:
    """Each prompt alone through Engine.prefill(logprobs=True): log p of tokens 1..n-1."""
    out = []
    for ids in ids_list:
        r = engine.prefill([list(map(int, ids))], n_predict=0, logprobs=True)[0]
        out.append(np.array(r.logprobs, np.float64))
    return out
