"""Tool-call parsers, one per model family's format (vLLM's --tool-call-parser names):

    hermes       <tool_call>{"name": ..., "arguments": ...}</tool_call>    Qwen2.5, Qwen3, SmolLM2 here
    llama3_json  {"name": ..., "parameters": ...}                          Llama 3.1-3.3
    mistral      [TOOL_CALLS][{"name": ..., "arguments": ...}]             Mistral, Mixtral

Each reads a finished answer into content and calls, and writes the lazy grammar that holds an
"auto" answer's calls to the tools' schemas (base.py).
"""
from __future__ import annotations

from .base import Call, ToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesToolParser, Llama3JsonToolParser,
                                                                  MistralToolParser)}


def get_tool_parser(name: str) -> ToolParser:
    """The parser called `name`; an unknown name is a ValueError that lists the known ones."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown --tool-call-parser {name!r}; choose one of {', '.join(sorted(TOOL_PARSERS))}")
    return TOOL_PARSERS[name]()


__all__ = ["Call", "TOOL_PARSERS", "ToolParser", "get_tool_parser"]
