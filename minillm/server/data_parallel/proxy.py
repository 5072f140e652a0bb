"""Forward one request to the replica the router picked, and its answer back, as it comes.

    client ──► front: route (worker thread) ──► httpx ──► replica's `minillm serve`
    client ◄── status, headers, body or SSE events, relayed untouched ◄──┘

The replica validates the request and answers in OpenAI's shape; the front passes its
status and body through. What the front adds is what only a front can know:
  - a replica that cannot be reached never saw the request: the front marks it down and
    tries the next one; with none left, 503;
  - a replica that fails while answering (it died): 502 in OpenAI's shape, or, once a
    stream has begun (the 200 is sent), an error event and `data: [DONE]`. Events are
    relayed whole (split at the blank line that ends each), so the client never reads half
    an event before the error;
  - a replica that goes silent (health.py: no /health answer for --replica-timeout seconds,
    e.g. a stopped process) does not keep its clients waiting: 504 in OpenAI's shape, or an
    error event and `data: [DONE]`, and the connection to it is closed;
  - a client that leaves closes the connection to the replica, which aborts the request
    and frees its KV blocks, as it would with the client connected directly (a non-streamed
    answer sends nothing until it is complete, so the front watches the client meanwhile).
A client's mistake is never a replica's failure: a body nested too deeply is refused here
(400), oversized headers at the door (door.py), anything else the replica answers itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..errors import error_body
from .off_loop import RoutingText
from .prompts import TooDeep
from .router import NoReplica

log = logging.getLogger("minillm.server")

SKIPPED_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                   "accept-encoding", "proxy-connection", "date", "server"}   # hop-by-hop, or the front's own
REPLICA_HEADER = "x-minillm-replica"                             # which replica answered


def error_json(status: int, message: str, code: str) -> dict:
    body = error_body(status, message, code=code)
    if status in (502, 504):
        body["error"]["type"] = "server_error"
    return body


def error_reply(status: int, message: str, code: str) -> Response:
    return Response(json.dumps(error_json(status, message, code)), status_code=status, media_type="application/json")


class Proxy:
    def __init__(self, replicas, router, client: httpx.AsyncClient, health, metrics):
        self.replicas, self.router, self.client = replicas, router, client
        self.health, self.metrics = health, metrics
        self.routing_text = RoutingText()

    async def generate(self, request: Request) -> Response:
        """/v1/completions and /v1/chat/completions: route by the prompt, then forward."""
        body = await request.body()
        path, tried = request.url.path, set()
        try:                    # parsing is CPU work: a worker thread, or process (off_loop.py)
            text = await self.routing_text(path, body)
        except TooDeep as e:
            return error_reply(400, f"{e}: the body is not valid for any replica", "invalid_json")
        while True:
            try:
                route = await asyncio.to_thread(self.router.route, text, frozenset(tried))
            except NoReplica:
                return error_reply(503, "no replica is available to serve the request", "no_replica")
            self.metrics.routed(route, self.router.policy)
            i = route.replica
            hung = self.health.hung(i)
            try:                # a non-streamed answer's headers come with its body: watch the client
                upstream = await until_over(self._send(i, request, body), request, hung)
            except ClientLeft:
                self.router.done(i)
                return Response(status_code=499)                           # nobody reads this
            except ReplicaHung:
                self.router.done(i)
                return self._silent(i)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:      # it never got the request
                self.router.done(i)
                tried.add(i)
                await self.health.lost(i, e)
                continue
            except BaseException as e:
                self.router.done(i)
                if isinstance(e, httpx.HTTPError):
                    return await self._failed(i, e)
                raise
            return await self._respond(request, i, upstream, hung, counted=True)

    async def forward_any(self, request: Request) -> Response:
        """GET /v1/models: every replica serves the same model; the first one up answers."""
        for _ in self.replicas:
            try:
                i = self.router.any_up()
            except NoReplica:
                break
            try:
                upstream = await self._send(i, request, b"")
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                await self.health.lost(i, e)             # out of rotation if it is down: the next one
                continue
            except httpx.HTTPError as e:
                return await self._failed(i, e)
            return await self._respond(request, i, upstream, self.health.hung(i), counted=False)
        return error_reply(503, "no replica is available to serve the request", "no_replica")

    async def _send(self, i: int, request: Request, body: bytes) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in SKIPPED_HEADERS]
        url = self.replicas[i].url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        upstream = self.client.build_request(request.method, url, headers=headers, content=body)
        return await self.client.send(upstream, stream=True)

    async def _failed(self, i: int, e: Exception) -> Response:
        self.metrics.failed(i)
        await self.health.lost(i, e)
        return error_reply(502, f"replica {i} failed while answering: {type(e).__name__}", "replica_failed")

    def _silent_error(self, i: int) -> dict:
        self.metrics.failed(i)
        return error_json(504, f"replica {i} has not answered for {self.health.replica_timeout:g} s "
                               "(--replica-timeout); it is out of rotation", "replica_timeout")

    def _silent(self, i: int) -> Response:
        body = self._silent_error(i)
        return Response(json.dumps(body), status_code=504, media_type="application/json")

    async def _respond(self, request: Request, i: int, upstream: httpx.Response, hung: asyncio.Event,
                       counted: bool) -> Response:
        """Relay the replica's answer; the request stops counting in flight once it is over."""
        finished = False

        async def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                if counted:
                    self.router.done(i)
                await upstream.aclose()

        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in SKIPPED_HEADERS}
        headers[REPLICA_HEADER] = str(i)
        try:
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                return RelayedStream(self._events(i, upstream, hung), finish, status_code=upstream.status_code,
                                     headers=headers)
            content = await until_over(upstream.aread(), request, hung)
        except httpx.HTTPError as e:
            await finish()
            return await self._failed(i, e)
        except ClientLeft:
            await finish()
            return Response(status_code=499)
        except ReplicaHung:
            await finish()
            return self._silent(i)
        except BaseException:
            await finish()
            raise
        await finish()
        return Response(content, status_code=upstream.status_code, headers=headers)

    async def _events(self, i: int, upstream: httpx.Response, hung: asyncio.Event):
        buffer, pieces = b"", upstream.aiter_raw()
        try:
            while True:
                try:
                    piece = await until_over(anext(pieces), None, hung)
                except StopAsyncIteration:
                    return
                buffer += piece
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    yield event + b"\n\n"
        except httpx.HTTPError as e:
            self.metrics.failed(i)
            await self.health.lost(i, e)
            error = error_json(502, f"replica {i} failed during the stream: {type(e).__name__}", "replica_failed")
        except ReplicaHung:
            error = self._silent_error(i)
        yield f"data: {json.dumps(error)}\n\n".encode()
        yield b"data: [DONE]\n\n"


class RelayedStream(StreamingResponse):
    """A streamed answer that always runs `finish` (close the replica's response, count the
    request done), however the stream ends: finished, failed, or the client gone."""

    def __init__(self, events, finish, **kwargs):
        super().__init__(events, **kwargs)
        self.finish = finish

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.finish()


class ClientLeft(Exception):
    """The client disconnected before its answer was complete."""


class ReplicaHung(Exception):
    """The replica went silent (health.py) before the answer was complete."""


async def until_over(work, request: Request | None, hung: asyncio.Event):
    """Await `work` (sending to the replica, reading its answer); if the client disconnects
    first (when `request` is given) or the replica is declared hung, cancel it, which closes
    the connection to the replica (that aborts the request there and frees its KV blocks), and
    raise ClientLeft or ReplicaHung."""
    async def client_left():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(work)
    watchers = [asyncio.ensure_future(hung.wait())] + ([asyncio.ensure_future(client_left())] if request else [])
    try:
        await asyncio.wait({work, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
        if not work.done():             # let httpx close the connection before we go on; asyncio.wait,
            work.cancel()               # not `await work`: if we are cancelled meanwhile (a client gone from a
            with contextlib.suppress(BaseException):    # stream), that must not cancel httpx's cleanup too
                await asyncio.wait({work})
    if work.cancelled():
        raise ReplicaHung() if hung.is_set() else ClientLeft()
    return work.result()
