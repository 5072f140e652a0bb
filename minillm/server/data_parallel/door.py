"""What the front refuses itself, so that a client's bad request never reaches a replica, and
never counts as the replica's failure.

Headers: a replica's HTTP parser (h11, under uvicorn) holds at most 16 KiB of a request's line
and headers while it waits for their end; past that it drops the connection, which the front
would read as a replica failing (a 502, counted, and the replica checked), a false alarm anyone
could raise. The front's own parser is the same, but it may receive a large header block in one
piece and accept it, so the front measures the headers itself and answers 431 (Request Header
Fields Too Large) above the replica's limit less what the front adds when it forwards
(its Host, Content-Length, ...). A body nested too deeply is refused in proxy.py (prompts.TooDeep).
"""
from __future__ import annotations

from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE

from ..guards import reply

REPLICA_HEADER_LIMIT = DEFAULT_MAX_INCOMPLETE_EVENT_SIZE   # bytes of request line + headers a replica reads
FORWARDING_ROOM = 1024                                     # what the front's forwarding may add
MAX_HEADER_BYTES = REPLICA_HEADER_LIMIT - FORWARDING_ROOM


def header_bytes(scope) -> int:
    """The size of the request line and headers as they came, near enough: name: value CRLF."""
    line = len(scope["method"]) + len(scope.get("raw_path") or scope["path"]) + len(scope.get("query_string", b""))
    return line + 12 + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


class HeaderLimit:
    """ASGI middleware: 431 for a request whose headers a replica would not read."""

    def __init__(self, app, max_bytes: int = MAX_HEADER_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and header_bytes(scope) > self.max_bytes:
            return await reply(send, 431, f"the request's headers are larger than {self.max_bytes} bytes",
                               code="request_header_fields_too_large", headers=[(b"connection", b"close")])
        return await self.app(scope, receive, send)
