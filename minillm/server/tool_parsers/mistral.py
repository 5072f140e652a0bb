"""Mistral calls: the [TOOL_CALLS] token, then a JSON list of {"name": ..., "arguments": {...}}
(Mistral 7B v0.3, Mixtral, Nemo), or, with the newer tokenizers (v11+), each call written as
its name then [ARGS] then the arguments' JSON:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

[TOOL_CALLS] is a special token in Mistral's tokenizers: the grammar names it by id and the server
keeps special tokens in the text of an "auto" answer (as vLLM does), or the trigger would be
dropped (base.py's bind_tokenizer). The grammar writes the list form, which both read.
"""
from __future__ import annotations

import json
import re

from .base import Call, ToolParser, as_call, decode_objects

NAMED = re.compile(r"([a-zA-Z0-9_-]{1,64})\[ARGS\]")


class MistralToolParser(ToolParser):
    name = "mistral"
    trigger = "[TOOL_CALLS]"

    def parse_calls(self, calls_text: str) -> list[Call]:
        body = calls_text[len(self.trigger):].strip()
        if body.startswith("["):
            values = decode_objects(body, ",")
            values = values[0] if values and len(values) == 1 and isinstance(values[0], list) else None
            calls = [as_call(v) for v in values or []]
        else:
            calls = []
            for part in body.split(self.trigger):
                for name, arguments in _named_calls(part.strip()):
                    calls.append(as_call({"name": name, "arguments": arguments}))
        return [] if not calls or None in calls else calls

    def rules(self, parallel: bool) -> str:
        more = ' (", " call)*' if parallel else ""
        return f'start: TEXT | pre "[" call{more} "]"'


def _named_calls(text: str):
    """name[ARGS]{json}name[ARGS]{json}... -> (name, arguments object) pairs; a bad part ends it."""
    decoder, i = json.JSONDecoder(), 0
    while i < len(text):
        m = NAMED.match(text, i)
        if m is None:
            yield "", None
            return
        try:
            arguments, i = decoder.raw_decode(text, m.end())
        except ValueError:
            yield "", None
            return
        yield m.group(1), arguments
        while i < len(text) and text[i].isspace():
            i += 1
