"""Request bodies above OFF_LOOP_BYTES are parsed and validated in another process.

`json.loads` and pydantic's validation are each one C call that holds the GIL for as long as the
body is big: 1.5 MB of `{"prompt": [[1], [1], ...]}` costs about a second, on the event loop
(every stream stops) and even on another thread (the loop waits for the GIL). So a big body goes
to a worker process, started at the first one: it parses the JSON, validates it against the
route's request model, checks the cheap limits that bound what comes back (prompts per request,
token ids per prompt, chat messages), and returns the validated request or the 400 to answer. The event loop only
awaits; the request that comes back is bounded by those limits (and by the body size, guards.py).

FastAPI then reads that request as the body's JSON (Starlette keeps a request's parsed JSON in
`request._json`), and a validated model validates as itself at once. Small bodies take FastAPI's
usual path on the loop: parsing 64 KB is well under a millisecond.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from .errors import APIError, describe, error_response
from .limits import MAX_MESSAGES, check_prompt_count

OFF_LOOP_BYTES = 64 * 1024


def parse(model: type[BaseModel], body: bytes, max_model_len: int):
    """In the worker: the validated request, or (status, message, param) to answer with."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return 400, f"the request body is not valid JSON: {e.msg}", None
    except (RecursionError, ValueError):                  # nested too deep, or not UTF-8
        return 400, "There was an error parsing the body", None
    try:
        if isinstance(data, dict):
            check_counts(data, max_model_len)             # len() checks first: validating 300k prompts is slow
        return model.model_validate(data)
    except APIError as e:
        return e.status, e.message, e.param
    except ValidationError as e:
        return (400, *describe(e.errors(include_url=False)))


def check_counts(data: dict, max_model_len: int) -> None:
    """Limits serving.py and the engine check too (the same messages), on the parsed JSON before
    its validation, so that a request too big to serve costs neither that nor the trip back."""
    prompt, messages = data.get("prompt"), data.get("messages")
    if isinstance(prompt, list) and prompt:
        one = not isinstance(prompt[0], (list, str))       # one prompt of token ids, or a list of prompts
        if not one:
            check_prompt_count(len(prompt))
        longest = len(prompt) if one else max((len(p) for p in prompt if isinstance(p, list)), default=0)
        if longest >= max_model_len:
            raise APIError(400, f"the prompt has {longest} tokens; max_model_len is {max_model_len} "
                                "(prompt + at least one generated token): shorten the prompt", "prompt")
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        raise APIError(400, f"messages holds {len(messages)} entries; at most {MAX_MESSAGES}", "messages")


class BodyParser:
    """An app's worker process (spawned: a fork of a threaded server is unsafe), started when needed."""

    def __init__(self):
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def parse(self, model: type[BaseModel], body: bytes, max_model_len: int):
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, parse, model, body, max_model_len)
        except concurrent.futures.process.BrokenProcessPool:
            self.pool = None                                 # the worker died (killed?): a new one next time
            raise APIError(503, "the request parser's process died; retry", code="parser_failed") from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None



def json_content(content_type: str | None) -> bool:
    """FastAPI parses a body as JSON only with a JSON content type (strict_content_type)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class ParseBigBodiesOffTheLoop(APIRoute):
    """A route whose JSON body, when big, is parsed and validated by the worker (module doc)."""

    def get_route_handler(self):
        handle = super().get_route_handler()
        field = self.body_field
        model = getattr(field.field_info, "annotation", None) if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return handle

        async def handler(request):
            body = await request.body()
            if len(body) > OFF_LOOP_BYTES and json_content(request.headers.get("content-type")):
                try:
                    max_len = request.app.state.served.front.max_model_len
                    parsed = await request.app.state.body_parser.parse(model, body, max_len)
                except APIError as e:
                    return error_response(e.status, e.message, e.param, e.code)
                if isinstance(parsed, tuple):
                    return error_response(*parsed)
                request._json = parsed
            return await handle(request)
        return handler
