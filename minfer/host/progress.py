"""Progress bars for every step that can take more than a few seconds, in one shape: tqdm on
stderr, transient, only on a terminal (a redirected log gets no `\\r` lines), never under -q."""

from __future__ import annotations

import sys


def bar(enabled: bool = True, **kw):
    """A tqdm bar (kw: tqdm's own: total, iterable, desc, unit, ...) when `enabled` and stderr
    is a terminal, else None."""
    from minfer.host.log import quiet

    if not enabled or quiet():  # -q: errors only
        return None
    from tqdm import tqdm

    b = tqdm(file=sys.stderr, leave=False, disable=None, **kw)  # disable=None: terminals only
    return None if b.disable else b
