"""POST /v1/responses (OpenAI's Responses API, as vLLM serves it) and GET /v1/responses/{id}.

A request is turned into a chat request (convert.py) and answered by the chat path: the same
template, sampling, and tool calls (a call the model makes comes out as a `function_call`
output item; its result goes back as a `function_call_output` input item). With store (the
default) the answer is kept in a bounded in-memory store (store.py), so the next request can
send only its new input and `previous_response_id`.
"""
from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..errors import APIError
from ..limits import MAX_MESSAGES
from ..openapi import STREAMED, errors
from ..responses import Delta
from ..serving import chat_prompt, check_options, start
from ..tool_calls import ToolCallStream
from .convert import answer_messages, chat_request, input_messages, new_id, output_items
from .events import OutputEvents
from .protocol import InputTokensDetails, Response, ResponsesRequest, ResponseUsage
from .store import Entry, ResponseStore

log = logging.getLogger("minillm.server")
router = APIRouter()
INCLUDABLE = {"reasoning.encrypted_content"}       # asks for reasoning items; this server makes none


def response_store(app) -> ResponseStore:
    if getattr(app.state, "response_store", None) is None:
        app.state.response_store = ResponseStore()
    return app.state.response_store


@router.post("/v1/responses", response_model=Response, responses={**STREAMED, **errors(400, 401, 404, 500, 503)})
async def create_response(req: ResponsesRequest, request: Request):
    served, store = request.app.state.served, response_store(request.app)
    bad = next((i for i in req.include or [] if i not in INCLUDABLE), None)
    if bad is not None:
        raise APIError(400, f"include {bad!r} is not supported", "include", "unsupported_parameter")
    history = store.conversation(req.previous_response_id, MAX_MESSAGES) if req.previous_response_id else []
    messages = input_messages(req)
    chat = chat_request(req, history, messages)
    check_options(chat, served)
    try:
        prompts = await chat_prompt(chat, served.tokenizer, served.front.max_model_len, served.chat)
    except APIError as e:                       # chat's field names -> this API's
        if e.param == "messages":
            e.param = "input"
        raise
    gen = await start(served, request, chat, prompts, chat.max_tokens_asked(), "resp")
    rid, created = new_id("resp"), int(time.time())

    def answer(items, finish, usage) -> Response:
        response = describe(req, rid, created, served.model_name, items, finish, usage)
        if req.store is not False and finish is not None:
            store.put(rid, Entry(req.previous_response_id, messages + answer_messages(items), response.model_dump()))
        return response

    if not req.stream:
        (out,) = await gen.final()
        c = out.outputs[0]
        message = ToolCallStream(chat).message(c.text)
        return answer(output_items(message.content, message.tool_calls), c.finish_reason, gen.usage())

    async def events():
        ev, calls, finish = OutputEvents(), ToolCallStream(chat), None
        start_ = describe(req, rid, created, served.model_name, [], None, None).model_dump()
        yield ev.event("response.created", response=start_)
        yield ev.event("response.in_progress", response=start_)
        try:
            async for k, text, fin, _ in gen.deltas():
                finish = fin or finish
                delta = calls.delta(k, text, fin) if calls.active else Delta(content=text or None)
                for e in ev.text(delta.content) if delta.content else ():
                    yield e
                for tc in delta.tool_calls or []:
                    for e in ev.call(tc.id, tc.function.name, tc.function.arguments):
                        yield e
            for e in ev.close():
                yield e
            final = answer(ev.items, finish, gen.usage())
            done = "response.completed" if final.status == "completed" else "response.incomplete"
            yield ev.event(done, response=final.model_dump())
        except APIError as e:
            yield ev.event("error", code=e.code, message=e.message, param=e.param)
        except Exception as e:
            log.exception("internal error while streaming a response")
            yield ev.event("error", code="internal_error", message=f"internal error: {type(e).__name__}", param=None)
    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/v1/responses/{response_id}", response_model=Response, responses=errors(401, 404))
async def retrieve_response(response_id: str, request: Request):
    entry = response_store(request.app).get(response_id)
    if entry is None:
        raise APIError(404, f"no stored response {response_id!r} (never stored, or evicted)", "response_id",
                       "response_not_found")
    return entry.response


def describe(req: ResponsesRequest, rid: str, created: int, model: str, items: list, finish: str | None,
             usage) -> Response:
    """The Response object: in progress (finish None), completed, or incomplete (max_output_tokens)."""
    status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    return Response(
        id=rid, created_at=created, model=model, status=status, output=items, instructions=req.instructions,
        incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
        tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
        tool_choice=(req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump())
        if req.tool_choice is not None else "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False, temperature=req.temperature, top_p=req.top_p,
        max_output_tokens=req.max_output_tokens, previous_response_id=req.previous_response_id, store=req.store is not False,
        metadata=req.metadata, text=req.text.model_dump(exclude_none=True, by_alias=True) if req.text else
        {"format": {"type": "text"}},
        usage=None if usage is None else ResponseUsage(
            input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=usage.prompt_tokens_details.cached_tokens)))
