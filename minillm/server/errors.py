"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Whatever a client sends, the answer is one of these with a 4xx status, never a 500 or a
traceback: clients (the `openai` package among them) read this shape to raise the right
exception. A bug of ours is a 500 in the same shape, and its traceback goes to our log only.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("minillm.server")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable",
               500: "internal_server_error"}


class APIError(Exception):
    """`headers`: sent with the answer (a 503's Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param=None, code=None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def bad_request(e: Exception, structured_field: str = "structured_outputs") -> APIError:
    """A ValueError/TypeError from SamplingParams or add_request: the client's mistake. Those
    that one field caused name it (`utils.validate.refuse`), which becomes `param` (a bad
    grammar is named by the request field it came from: response_format, tool_choice, ...)."""
    param = getattr(e, "param", None)
    if param in ("structured_outputs", "json", "regex", "choice", "grammar"):
        param = structured_field
    return APIError(400, str(e), param)


def describe(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic's errors -> (message, param) about the first bad field. A field that is a
    union (prompt: str | list[str] | ...) gets one error per alternative; they are
    summed up as "expected one of: ...", the alternatives being the names after the field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}", None
    locs = [[p for p in e["loc"] if p != "body"] for e in errors]
    locs = [loc for loc in locs if loc[:1] == locs[0][:1]]          # the first bad field only
    n = 0
    while all(len(loc) > n and loc[n] == locs[0][n] for loc in locs):
        n += 1
    if any(len(loc) > n and isinstance(loc[n], int) for loc in locs):    # two list items are wrong: the first
        locs = [loc for loc in locs if loc[:n + 1] == locs[0][:n + 1]]
        while all(len(loc) > n and loc[n] == locs[0][n] for loc in locs):
            n += 1
    param = ".".join(str(p) for p in locs[0][:n]) or None
    if param is None:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    if first["type"] == "extra_forbidden":
        return f"unknown field '{param}'", param
    if len(locs) > 1:
        kinds = list(dict.fromkeys(str(loc[n]) for loc in locs if len(loc) > n))
        return f"{param}: {first.get('input')!r:.60} is not valid; expected one of: {', '.join(kinds)}", param
    return f"{param}: {first['msg']}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(e.status, e.message, e.param, e.code, e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errors = list(e.errors())
        message, param = describe(errors) if errors else ("invalid request", None)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = {404: f"no route {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}.get(e.status_code, e.detail)
        return error_response(e.status_code, message, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(e).__name__}")
