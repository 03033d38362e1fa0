"""packed_launch: a packed forward put on the device without waiting for it (the scheduler's
overlap, docs/serve.md "How a request runs").

    h = backend.packed_launch(ids, tok, rows, targets, top=k, hidden=rows)   # returns at once
    ...                                        # the host schedules the next forward meanwhile
    out = h.wait()                             # what packed(...) returns, or its error

At most one launch is outstanding on a backend: launch N+1 may come before N's wait, never
N+2 (the CUDA backend's staging buffers are double, and asserts it). `launch(backend, ...)`
serves a backend without packed_launch (the CPU reference, which computes on the host anyway,
and the tests' fakes): packed() called at once, its value or error kept for wait() (`Ready`).
"""

from __future__ import annotations


class Ready:
    """A handle whose forward already ran: wait() gives its value or raises its error."""

    __slots__ = ("_value", "_error")

    def __init__(self, fn=None, *, error: BaseException | None = None):
        self._value, self._error = None, error
        if fn is not None:
            try:
                self._value = fn()
            except Exception as e:  # (raised at wait, where packed() callers expect it)
                self._error = e

    def wait(self):
        if self._error is not None:
            raise self._error
        return self._value


def launch(backend, ids, tok, rows, targets, top: int = 0, **kw):
    """backend.packed_launch(...), or a Ready of backend.packed(...) when it has none."""
    f = getattr(backend, "packed_launch", None)
    if f is not None:
        return f(ids, tok, rows, targets, top=top, **kw)
    return Ready(lambda: backend.packed(ids, tok, rows, targets, top=top, **kw))
