"""Llama 3.1 / 3.2 / 3.3 JSON calls: with tools in its template, the model answers a call as the
whole answer, a JSON object {"name": ..., "parameters": {...}} (several separated by "; "),
sometimes after the <|python_tag|> token. An answer that does not start with "{" is text.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
"""
from __future__ import annotations

from .base import Call, ToolParser, as_call, decode_objects

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    trigger = "{"
    arguments_key = "parameters"

    def calls_start(self, text: str) -> int | None:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        return len(text) - len(body) if body.startswith("{") else None

    def held_back(self, text: str) -> int:
        """Nothing is content until the answer's first non-space character says it is text."""
        body = text.lstrip()
        return len(text) if not body or PYTHON_TAG.startswith(body[:len(PYTHON_TAG)]) else 0

    def parse_calls(self, calls_text: str) -> list[Call]:
        values = decode_objects(calls_text, ";")
        calls = [as_call(v) for v in values or []]
        return [] if not calls or None in calls else calls

    def rules(self, parallel: bool) -> str:
        return "start: TEXT | call" + (' ("; " call)*' if parallel else "")

    def text_rules(self) -> str:
        return "TEXT: /[^{\\s](?s:.*)/"        # text: an answer that does not open with "{"
