"""How this server turns a chat into a prompt and reads tool calls back: the serve flags of
vLLM's spelling, gathered into ChatSettings (one per server).

    --enable-auto-tool-choice --tool-call-parser NAME   tool_choice "auto" (or absent) with tools:
                                                        the model may answer text or calls (tool_parsers/)
    --chat-template FILE_OR_TEXT                        a Jinja chat template instead of the model's own
    --trust-request-chat-template                       let a request send its own `chat_template`
    --structured-outputs-allow-additional-properties    read JSON schemas as JSON-Schema does (structured/schema.py)

The embedded SmolLM2 has no tool format of its own: unless told otherwise, the server gives it
minillm's hermes-style template (text/templates/smollm2_tools.jinja) and the hermes parser, so
an agent loop works out of the box on the default model.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from .errors import APIError
from .tool_parsers import TOOL_PARSERS, ToolParser, get_tool_parser

TEMPLATES = Path(__file__).resolve().parent.parent / "text" / "templates"
EMBEDDED_TOOLS_TEMPLATE = TEMPLATES / "smollm2_tools.jinja"
MAX_TEMPLATE_CHARS = 64 * 1024


@dataclass
class ChatSettings:
    tool_parser: ToolParser | None = None          # None: tool_choice "auto" is refused (400 naming the flag)
    chat_template: str | None = None               # None: the tokenizer's own
    trust_request_chat_template: bool = False
    allow_additional_properties: bool = False

    def template_for(self, req) -> str | None:
        """The template a request renders with: its own `chat_template` (when the server trusts
        request templates), else the server's."""
        own = getattr(req, "chat_template", None)
        if own is None:
            return self.chat_template
        if not self.trust_request_chat_template:
            raise APIError(400, "chat_template in a request needs a server started with "
                                "--trust-request-chat-template (as vLLM)", "chat_template")
        if len(own) > MAX_TEMPLATE_CHARS:
            raise APIError(400, f"chat_template has {len(own)} characters; at most {MAX_TEMPLATE_CHARS}",
                           "chat_template")
        return own


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chat and tools", "vLLM's flags for chat templates, tool calls and JSON schemas")
    g.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=None,
                   help="allow tool_choice 'auto' (the model decides whether to call); needs --tool-call-parser "
                        "(default: on, with hermes, for the embedded model only)")
    g.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="the model's tool-call format (tool_parsers/)")
    g.add_argument("--chat-template", default=None, metavar="FILE_OR_TEXT",
                   help="a Jinja chat template (a file, or the template's text) instead of the model's own")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template sent in a request")
    g.add_argument("--structured-outputs-allow-additional-properties", action="store_true",
                   help="an object schema without additionalProperties takes extra keys (the JSON-Schema "
                        "reading); by default it takes none, as vLLM's xgrammar and OpenAI strict mode")


def chat_argv(args) -> list[str]:
    """The flags above as a command line again (a data-parallel replica gets the front's)."""
    argv = []
    if args.enable_auto_tool_choice is not None:
        argv.append("--enable-auto-tool-choice" if args.enable_auto_tool_choice else "--no-enable-auto-tool-choice")
    for flag, value in (("--tool-call-parser", args.tool_call_parser), ("--chat-template", args.chat_template)):
        if value is not None:
            argv += [flag, value]
    if args.trust_request_chat_template:
        argv.append("--trust-request-chat-template")
    if args.structured_outputs_allow_additional_properties:
        argv.append("--structured-outputs-allow-additional-properties")
    return argv


def chat_settings_from_args(args, tokenizer, embedded: bool) -> ChatSettings:
    """The settings the flags ask for, checked before the server listens: an unknown parser,
    auto tool choice without a parser, or a template that is not a file and not a template, or
    that fails to render a short chat, is a ValueError naming the flag."""
    auto = args.enable_auto_tool_choice if args.enable_auto_tool_choice is not None else embedded
    parser_name = args.tool_call_parser or ("hermes" if embedded else None)
    if args.tool_call_parser is not None:
        get_tool_parser(args.tool_call_parser)                 # an unknown name fails even when auto is off
    if auto and parser_name is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME "
                         f"({', '.join(sorted(TOOL_PARSERS))})")
    template = read_template(args.chat_template) if args.chat_template is not None else (
        EMBEDDED_TOOLS_TEMPLATE.read_text() if embedded else None)
    if args.chat_template is not None:
        check_template(tokenizer, template)
    parser = get_tool_parser(parser_name).bind_tokenizer(tokenizer) if auto else None
    return ChatSettings(tool_parser=parser, chat_template=template,
                        trust_request_chat_template=args.trust_request_chat_template,
                        allow_additional_properties=args.structured_outputs_allow_additional_properties)


def read_template(value: str) -> str:
    """--chat-template's value: a file's text, or the template itself (as vLLM: text that holds
    Jinja's braces is a template, anything else must be a readable file)."""
    path = Path(value).expanduser()
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    if "{" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a readable file nor a Jinja template")


def check_template(tokenizer, template: str) -> None:
    """Render a short chat (with a tool and a tool-call turn when the template reads them)."""
    chat = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = None
    if "tool" in template:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]
    try:
        tokenizer.apply_chat_template(chat, True, tools=tools, chat_template=template)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--chat-template does not render a one-message chat: {e}") from None


def bind_chat(req, chat: ChatSettings) -> dict:
    """The request's template inputs ({"tools", "chat_template"}); the request keeps the settings
    (tool calls read them when its answer comes back). A parser that reads special tokens
    (Mistral's [TOOL_CALLS]) keeps them in the text, as vLLM does."""
    req._chat = chat
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    if tools and req.tool_choice in (None, "auto") and getattr(chat.tool_parser, "trigger_token", None) is not None:
        req.skip_special_tokens = False
    return {"tools": tools, "chat_template": chat.template_for(req)}
