"""Small helpers the tests share: a repository script loaded as a module (lab/ and scripts/
are not in the package), and a callable run on a thread of its own."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str | None = None):
    """The module of REPO/relpath (e.g. "lab/down_grids.py"), executed fresh."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def on_thread(fn):
    """fn() on a new thread (joined): its value, or its exception raised here."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
