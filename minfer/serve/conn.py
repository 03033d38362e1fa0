"""uvicorn's HTTP/1.1 protocol with a deadline on a request's head.

uvicorn times out a connection only while it idles between requests, and forgets that timer at
the first byte: a client that opens a connection and sends nothing, or a header line a byte at
a time (slowloris), would hold a socket and its buffers forever. Here a connection must send a
request's whole head within read_timeout seconds of connecting (or of its previous answer),
else it is closed. The body has its own deadline (app._Guard: 408).

A request uvicorn cannot parse (a head past h11_max_incomplete_event_size, a malformed request
line) is answered by uvicorn itself, before any app sees it, in plain text: here its
send_400_response is overridden to write OpenAI's JSON error object instead, 431 for a head too
large (h11's own status hint) and 400 for the rest, then close as uvicorn does.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

from minfer.serve.protocol import ApiError


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

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 could not parse, as an error object."""
        limit = self.config.h11_max_incomplete_event_size
        limit = DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if limit is None else limit
        if len(self.conn.trailing_data[0]) > limit:  # h11: "Receive buffer too long"
            e = ApiError(
                431,
                f"the request's head (its line and headers) is longer than {limit} bytes",
                code="request_header_fields_too_large",
            )
        else:
            e = ApiError(
                400,
                f"{msg.rstrip('.')}: the request's head is no valid HTTP/1.1",
                code="invalid_http_request",
            )
        data = json.dumps(e.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        try:
            for ev in (
                h11.Response(
                    status_code=e.status, headers=headers, reason=HTTPStatus(e.status).phrase
                ),
                h11.Data(data=data),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(ev))
        except h11.LocalProtocolError:  # too late to answer (a response was under way)
            pass
        self._linger_close()

    LINGER_S = 2.0

    def _linger_close(self) -> None:
        """Close after an answer given while the client is still sending (a 4 MB head): the
        write side first, then what still arrives is read and dropped for LINGER_S, so the
        close does not reset the connection under the answer (the client would lose it)."""
        self._lingering = True
        try:
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.transport.resume_reading()
        except (OSError, RuntimeError, NotImplementedError):
            self.transport.close()
            return
        self.loop.call_later(self.LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if getattr(self, "_lingering", False):
            return  # after the answer: dropped
        super().data_received(data)

    def _head_late(self) -> None:
        self._head_task = None
        if self.cycle is self._head_of and not self.transport.is_closing():
            self.transport.close()  # no request to answer: nothing but the close to say
