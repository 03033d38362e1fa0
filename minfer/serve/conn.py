"""uvicorn's HTTP/1.1 protocol with a deadline on a request's head.

uvicorn times out a connection only while it idles between requests, and forgets that timer at
the first byte: a client that opens a connection and sends nothing, or a header line a byte at
a time (slowloris), would hold a socket and its buffers forever. Here a connection must send a
request's whole head within read_timeout seconds of connecting (or of its previous answer),
else it is closed. The body has its own deadline (app._Guard: 408).
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol


def protocol(read_timeout: float):
    """The protocol class uvicorn.Config(http=...) takes, with this deadline."""

    class Protocol(_Deadline):
        timeout_head = float(read_timeout)

    return Protocol


class _Deadline(H11Protocol):
    timeout_head = 30.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_of = self.cycle  # a new cycle object: the next request's head arrived
        self._head_task = self.loop.call_later(self.timeout_head, self._head_late)

    def _disarm(self) -> None:
        t = getattr(self, "_head_task", None)
        if t is not None:
            t.cancel()
            self._head_task = None

    def handle_events(self) -> None:
        super().handle_events()
        if getattr(self, "_head_task", None) is not None and self.cycle is not self._head_of:
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # first: a pipelined head that super() handles now disarms it
        super().on_response_complete()
        if self.transport.is_closing():
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_late(self) -> None:
        self._head_task = None
        if self.cycle is self._head_of and not self.transport.is_closing():
            self.transport.close()  # no request to answer: nothing but the close to say
