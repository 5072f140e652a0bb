"""Checks at the door, before any route runs: the API key, the request body's size and how
long it takes to arrive.

A plain ASGI middleware (a callable that wraps the app), so it sees a request before
FastAPI reads or parses anything: a wrong key is a 401 even when the body is not JSON,
and an oversized body is refused (413) without ever being held in memory whole.
"""
from __future__ import annotations

import asyncio
import hmac
import json

from .errors import error_body

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 30.0      # seconds for a whole request body (a slow client holds a handler)


class Guards:
    def __init__(self, app, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.api_key and scope["path"].startswith("/v1") and not self._authorized(headers):
            return await reply(send, 401, "invalid or missing API key: send 'Authorization: Bearer KEY'",
                               code="invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return await self._too_large(send)
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.body_timeout)
        except asyncio.TimeoutError:
            return await reply(send, 408, f"the request body did not arrive within {self.body_timeout:g} s",
                               code="request_timeout")
        if body is None:                       # the client left
            return
        if len(body) > self.max_body_bytes:
            return await self._too_large(send)
        return await self.app(scope, replay(body, receive), send)

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, counting as it comes (chunked bodies too); stops reading past the limit."""
        body, size, more = [], 0, True
        while more and size <= self.max_body_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body.append(message.get("body", b""))
            size += len(body[-1])
            more = message.get("more_body", False)
        return b"".join(body)

    def _authorized(self, headers: dict) -> bool:
        given = headers.get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self.api_key.encode())   # constant time

    async def _too_large(self, send):
        await reply(send, 413, f"the request body is larger than {self.max_body_bytes} bytes",
                    code="request_too_large")


def replay(body: bytes, receive):
    """A receive() that hands the app the body we already read, then passes through (so the
    app still hears http.disconnect when the client goes away)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again():
        return pending.pop() if pending else await receive()
    return receive_again


async def reply(send, status: int, message: str, code: str | None = None, headers=()):
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
