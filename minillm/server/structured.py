"""Structured outputs and tool calls on the HTTP API, all turned into one engine spec
(`SamplingParams.structured_outputs`, minillm/structured/):

    response_format {"type": "json_object"}                  -> json_object
    response_format {"type": "json_schema", "json_schema": {"schema": ...}}  -> json
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"}  (vLLM's extra)
    tools + tool_choice {"type": "function", "function": {"name": f}}  -> json: f's parameters
    tools + tool_choice "required"  -> json: {"name": one of the tools, "arguments": its parameters}

    tools + tool_choice "auto" or absent  -> grammar: free text, or text then calls in the model's
                                             own format (the --tool-call-parser's lazy grammar)

A tool call's answer comes back as `message.tool_calls` (OpenAI's shape) with finish reason
"tool_calls". "auto" needs the model's tool-call format: a server started without
--enable-auto-tool-choice --tool-call-parser refuses it, naming the flags (as vLLM).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from .errors import APIError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class JsonSchemaFormat(Strict):
    name: StrictStr = "response"
    description: Optional[StrictStr] = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionDefinition(Strict):
    name: StrictStr = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[StrictStr] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[StrictBool] = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: StrictStr


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]
MAX_TOOLS = 128


def structured_spec(req) -> Optional[dict]:
    """The engine spec a request asks for (or None), from whichever of the fields above it set."""
    asked = [f for f in ("response_format", "structured_outputs") if getattr(req, f, None) is not None]
    if getattr(req, "response_format", None) is not None and req.response_format.type == "text":
        asked.remove("response_format")
    called, parser = tool_called(req), auto_tool_parser(req)
    if len(asked) + (called is not None or parser is not None) > 1:
        names = asked + (["tool_choice"] if called is not None or parser is not None else [])
        raise APIError(400, f"{' and '.join(names)} each constrain the output: set only one", names[-1])
    if called is not None:
        return {"json": called}
    if parser is not None:
        chat = req._chat
        tools = [{"name": t.function.name, "parameters": t.function.parameters} for t in req.tools]
        return {"grammar": parser.grammar(tools, req.parallel_tool_calls is not False,
                                          chat.allow_additional_properties)}
    if "structured_outputs" in asked:
        return req.structured_outputs
    if "response_format" in asked:
        fmt = req.response_format
        if fmt.type == "json_object":
            return {"json_object": True}
        if fmt.json_schema is None:
            raise APIError(400, "response_format of type json_schema needs a json_schema", "response_format")
        return {"json": fmt.json_schema.schema_}
    return None


def constraint_field(req) -> str:
    """The request field a constraint came from (named in a 400 about it)."""
    if getattr(req, "tools", None) and getattr(req, "tool_choice", None) not in (None, "none"):
        return "tool_choice" if req.tool_choice != "auto" else "tools"
    if getattr(req, "tools", None) and getattr(req, "tool_choice", None) is None:
        return "tools"
    return "response_format" if getattr(req, "response_format", None) is not None else "structured_outputs"


def tool_called(req) -> Optional[dict]:
    """The JSON schema a tool call's answer must match, or None when no call is forced."""
    tools, choice = getattr(req, "tools", None), getattr(req, "tool_choice", None)
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", "tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise APIError(400, f"tools lists {len(tools)} functions; at most {MAX_TOOLS}", "tools")
    if choice is None or choice == "auto" or choice == "none":
        return None
    parameters = {t.function.name: t.function.parameters or {"type": "object"} for t in tools}
    if choice == "required":
        return {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                           "required": ["name", "arguments"], "additionalProperties": False}
                          for name, schema in parameters.items()]}
    if choice.function.name not in parameters:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools", "tool_choice")
    return parameters[choice.function.name]


def auto_tool_parser(req):
    """The parser that reads an "auto" answer (tools given, tool_choice "auto" or absent), or None
    when the request is not one. A server without one refuses "auto" by the flags' names."""
    tools, choice = getattr(req, "tools", None), getattr(req, "tool_choice", None)
    if not tools or choice not in (None, "auto"):
        return None
    chat = getattr(req, "_chat", None)
    if chat is None or chat.tool_parser is None:
        raise APIError(400, "tool_choice \"auto\" (the default with tools) needs a server started with "
                            "--enable-auto-tool-choice --tool-call-parser NAME (as vLLM); or name a function "
                            "({\"type\": \"function\", \"function\": {\"name\": ...}}) or send \"required\"",
                       "tool_choice", "unsupported_parameter")
    return chat.tool_parser


def tool_calls_from(req, text: str) -> Optional[list[dict]]:
    """The answer of a forced tool call as OpenAI's tool_calls (None when the request forced none).
    A text that does not parse (max_tokens ran out mid-answer) gives its raw text as arguments."""
    if tool_called(req) is None:
        return None
    if req.tool_choice == "required":
        try:
            call = json.loads(text)
            name, arguments = call["name"], json.dumps(call["arguments"])
        except (ValueError, KeyError, TypeError):
            name, arguments = "", text
    else:
        name, arguments = req.tool_choice.function.name, text
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": arguments}}]
