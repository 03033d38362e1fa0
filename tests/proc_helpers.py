"""Process helpers shared by the signal tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest


def group_alive(pgid: int) -> list[int]:
    """Pids still running in process group pgid (zombies excluded)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


def wait_for(cond, proc, timeout: float = 60.0, step: float = 0.01):
    """cond()'s first truthy value, polled every `step` s; None once proc has exited; the
    test fails (proc killed) after `timeout` s."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            return None
        time.sleep(step)
    proc.kill()
    pytest.fail("timed out waiting for the moment to signal")
