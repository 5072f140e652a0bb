"""Responses API <-> chat completions: a /v1/responses request becomes a chat request, so the
template, tool calls (the server's tool parser and grammar) and sampling are the chat path's.

    instructions                       -> a system message first (this turn's only, as OpenAI)
    previous_response_id               -> the stored conversation (store.py), then this turn's input
    input "text"                       -> a user message
    {"type": "message", role, content} -> that message (input_text/output_text parts joined)
    {"type": "function_call", ...}     -> an assistant message's tool_calls (consecutive calls: one message)
    {"type": "function_call_output"}   -> a "tool" message answering call_id
    tools [{"type": "function", "name", "parameters"}]  -> chat's {"type": "function", "function": {...}}
    tool_choice {"type": "function", "name"}            -> chat's {"type": "function", "function": {"name"}}
    text.format                        -> response_format;  max_output_tokens -> max_tokens

And back: the chat answer's text is an output "message" item, each tool call a "function_call" item.
"""
from __future__ import annotations

import uuid

from pydantic import ValidationError

from ..errors import APIError, describe
from ..protocol import ChatCompletionRequest
from .protocol import FunctionCallItem, FunctionCallOut, FunctionCallOutputItem, OutputMessage, OutputText

SAMPLING = ("model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
            "stream", "user")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_messages(req) -> list[dict]:
    """This turn's input items as chat messages (dicts in chat's request shape)."""
    out: list[dict] = []
    for item in req.items():
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
            out.append({"role": item.role, "content": text})
    return out


def chat_request(req, history: list[dict], messages: list[dict]) -> ChatCompletionRequest:
    """The chat request that answers `req`, given the stored conversation and this turn's messages."""
    body = {k: getattr(req, k) for k in SAMPLING if getattr(req, k) is not None}
    system = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    body["messages"] = system + history + messages
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else {
            "type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = {"type": fmt.type} if fmt.type == "json_object" else {
            "type": "json_schema", "json_schema": {k: v for k, v in dict(
                name=fmt.name or "response", description=fmt.description, schema=fmt.schema_ or {"type": "object"},
                strict=fmt.strict).items() if v is not None}}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:               # e.g. a function_call whose arguments are not a JSON object
        message, param = describe(list(e.errors()))
        field = "instructions" if param and param.startswith("messages") and system and param.startswith(
            "messages.0") else "input" if param and param.startswith("messages") else param
        raise APIError(400, message, field) from None


def output_items(content: str | None, tool_calls) -> list:
    """The chat answer (content, tool_calls) as Responses output items."""
    items: list = []
    if content:
        items.append(OutputMessage(id=new_id("msg"), content=[OutputText(text=content)]))
    for c in tool_calls or []:
        items.append(FunctionCallOut(id=new_id("fc"), call_id=c.id, name=c.function.name,
                                     arguments=c.function.arguments))
    return items


def answer_messages(items: list) -> list[dict]:
    """Output items as the chat messages a later turn's history holds."""
    text = "".join(p.text for i in items if isinstance(i, OutputMessage) for p in i.content)
    calls = [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}}
             for i in items if isinstance(i, FunctionCallOut)]
    if not text and not calls:
        return [{"role": "assistant", "content": ""}]
    return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]
