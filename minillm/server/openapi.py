"""The published OpenAPI schema (/openapi.json, /docs) says what the server really does.

FastAPI documents every route with a 200 and a 422 ("Validation Error"); this server never
answers 422 (a bad field is a 400 in OpenAI's shape, errors.py) and answers statuses FastAPI
cannot see: the door (guards.py) refuses a wrong key (401, /v1 routes only), a body too large
(413) or too slow (408) before any route runs; a full queue is a 503. So each route lists the
statuses it can return with the error model, the 422 is dropped, a streamed answer is
documented as `text/event-stream`, and the API key appears as a bearer scheme only when the
server has one. tests/test_openapi.py holds the server to it with schemathesis.
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

WHY = {400: "a bad request: the field at fault is in `param`",
       401: "a missing or wrong API key (only when the server has one)",
       404: "the model named is not the one served",
       408: "the request body did not arrive in time",
       413: "the request body is too large",
       500: "the engine failed this request (the server keeps serving)",
       503: "the waiting queue is full, or the engine loop has stopped: retry later"}
AT_THE_DOOR = (408, 413)             # guards.py answers these on every route


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def errors(*statuses: int) -> dict:
    """FastAPI `responses=` for a route that can answer these error statuses (and the door's)."""
    return {s: {"model": ErrorResponse, "description": WHY[s]} for s in sorted({*statuses, *AT_THE_DOOR})}


STREAMED = {200: {"description": "the answer; with stream=true, Server-Sent Events ending in `data: [DONE]`",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


def install_truthful_openapi(app: FastAPI, api_key: str | None) -> None:
    """Replace FastAPI's schema builder with one that drops the 422s it never sends, and
    declares the bearer key on /v1 routes when the server has one."""
    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                if api_key and path.startswith("/v1"):
                    operation["security"] = [{"bearer": []}]
                elif path.startswith("/v1"):
                    operation["responses"].pop("401", None)
        components = schema.setdefault("components", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(name, None)
        if api_key:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
