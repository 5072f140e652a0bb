"""LoRA adapters through the front: every replica serves the same ones.

At startup each replica the front starts gets the front's --lora-modules (replicas.py), and
each replica given by URL must list them (remote.py). A request's `model` names the adapter;
the replica resolves it, and the router's key includes it (prompts.py), so a prefix cached
under one adapter never draws another adapter's (or the base model's) requests.

At runtime (MINILLM_ALLOW_RUNTIME_LORA_UPDATING=1, as for one server: lora_routes.py),
/v1/load_lora_adapter and /v1/unload_lora_adapter go to every replica. The answer is 200 only
if every replica said 200; otherwise the first failure's status, naming each replica that
failed. A load that failed anywhere is undone where it succeeded, so no adapter is served by
some replicas and not others. The adapters now served are remembered by the launcher: a
replica the front starts again (healing.py) gets them, not only those of the command line.
"""
from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from ..errors import error_response
from ..lora_routes import runtime_updating_allowed
from .proxy import SKIPPED_HEADERS

UPDATE_TIMEOUT = 120.0      # seconds a replica has to read an adapter's folder


def install(app: FastAPI, replicas, client, launcher=None, environ=None) -> bool:
    """Add the two broadcasting routes when the environment allows it; True if added.
    `client()` gives the front's httpx.AsyncClient."""
    if not (runtime_updating_allowed() if environ is None else runtime_updating_allowed(environ)):
        return False

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body, name, path = await _read(request)
        results = await broadcast(client(), replicas, request, body)
        failed = [(i, r) for i, r in results if r.status_code != 200]
        if failed:
            undo = json.dumps({"lora_name": name}).encode()
            loaded = [i for i, r in results if r.status_code == 200]
            await broadcast(client(), [replicas[i] for i in loaded], request, undo, "/v1/unload_lora_adapter")
            return failure(failed, "; it is loaded on no replica" + (f" (undone on {_names(loaded)})" if loaded else ""))
        if launcher is not None and isinstance(name, str) and isinstance(path, str):
            launcher.lora_modules[name] = path
        return PlainTextResponse(results[0][1].text)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body, name, _ = await _read(request)
        results = await broadcast(client(), replicas, request, body)
        if launcher is not None and any(r.status_code == 200 for _, r in results):
            launcher.lora_modules.pop(name, None)           # gone from some: never back on a restart
        failed = [(i, r) for i, r in results if r.status_code != 200]
        if failed:
            return failure(failed, "" if len(failed) == len(results) else
                           f"; it was unloaded from {_names([i for i, r in results if r.status_code == 200])}")
        return PlainTextResponse(results[0][1].text)
    return True


async def _read(request: Request):
    body = await request.body()
    try:
        fields = json.loads(body)
    except ValueError:
        fields = None
    fields = fields if isinstance(fields, dict) else {}
    return body, fields.get("lora_name"), fields.get("lora_path")


class Unreachable:
    """A replica that did not answer, in the shape of a response."""

    def __init__(self, error: Exception):
        self.status_code, self.text = 503, f"the replica did not answer: {type(error).__name__}"


async def broadcast(client: httpx.AsyncClient, replicas, request: Request, body: bytes, path: str | None = None):
    """POST `body` to `path` (the request's own by default) on every replica, at once:
    [(replica index, response or Unreachable)]."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in SKIPPED_HEADERS]

    async def one(r):
        try:
            return r.index, await client.post(r.url + (path or request.url.path), content=body, headers=headers,
                                              timeout=UPDATE_TIMEOUT)
        except httpx.HTTPError as e:
            return r.index, Unreachable(e)
    return list(await asyncio.gather(*(one(r) for r in replicas)))


def failure(failed, tail: str) -> Response:
    """The first failure's status; each failing replica's message; the param a replica named."""
    messages, param = [], None
    for i, r in failed:
        try:
            error = json.loads(r.text)["error"]
            message, param = error["message"], param or error.get("param")
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        messages.append(f"replica {i}: {r.status_code} {message}")
    return error_response(failed[0][1].status_code, "; ".join(messages) + tail, param, "lora_update_failed")


def _names(indices) -> str:
    return "replica" + ("s " if len(indices) > 1 else " ") + ", ".join(map(str, indices))
