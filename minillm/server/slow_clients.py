"""Slow clients may not hold the server: a request's headers must arrive within a deadline.

uvicorn's h11 protocol closes an idle keep-alive connection after `timeout_keep_alive`, but any
byte received cancels that timer, and a connection that never completes its first request has
no timer at all: a client sending its headers a byte a second (slowloris) holds a connection,
and its memory, forever. This protocol arms a timer when a connection opens and after each
response, and disarms it when a request's headers are complete; if it fires, the connection is
closed. (The body has its own deadline in guards.py.)
"""
from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT = 10.0     # seconds for a request line and headers, as nginx's client_header_timeout


def protocol_with_header_timeout(seconds: float) -> type:
    """An H11Protocol class whose connections close when headers take longer than `seconds`."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout": seconds})


class HeaderTimeoutH11Protocol(H11Protocol):
    header_timeout = DEFAULT_HEADER_TIMEOUT
    _header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not None and self.cycle is not cycle:      # a request's headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()                     # the next request's headers (a pipelined one disarms it at once)
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()
