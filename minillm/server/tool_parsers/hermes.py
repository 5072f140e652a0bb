"""Hermes-style calls (Qwen2.5, Qwen3, Hermes, and minillm's SmolLM2 tool template): each call is
a JSON object {"name": ..., "arguments": {...}} inside <tool_call>...</tool_call>, one per line:

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""
from __future__ import annotations

import json
import re

from .base import Call, ToolParser, as_call

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class HermesToolParser(ToolParser):
    name = "hermes"
    trigger = "<tool_call>"

    def parse_calls(self, calls_text: str) -> list[Call]:
        """The closed calls; a last call that never closed (max_tokens ran out in it, the finish
        reason says "length") is dropped, or read if it is the only one and its JSON is whole."""
        bodies = CALL.findall(calls_text)
        if not bodies:
            bodies = [calls_text[len(self.trigger):]]
        calls = [as_call(_json(body)) for body in bodies]
        return [] if None in calls else calls

    def finished_calls(self, calls_text: str) -> list[Call]:
        calls = [as_call(_json(body)) for body in CALL.findall(calls_text)]
        return [c for c in calls if c is not None]

    def rules(self, parallel: bool) -> str:
        more = ' ("\\n<tool_call>" closed)*' if parallel else ""
        return f'start: TEXT | pre closed{more}\nclosed: "\\n" call "\\n</tool_call>"'


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
