"""What every tool-call parser shares: a model family writes its calls in its own format after a
*trigger* (hermes: `<tool_call>`, Mistral: `[TOOL_CALLS]`, Llama 3: a JSON object as the whole
answer). A parser does two things with that format:

  - `parse(text)`: the finished answer -> (content, calls), what the client gets;
  - `grammar(tools, parallel)`: a Lark grammar (llguidance) for the whole answer in "auto":
    free text, or text up to the trigger and from there calls that match one of the tools'
    schemas. Until the trigger the grammar allows any text; after it, only valid calls. This is
    the lazy grammar llama.cpp's server uses: the model chooses *whether* to call, the grammar
    holds *how*.

The free text is one lexeme that cannot contain the trigger, and the text before a call is a
lexeme that *ends* with it: a lexer that took the longest match of "text" would otherwise eat
the trigger's first characters as text and then fail on the rest.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ...structured.grammar import COMPACT
from ...structured.schema import close_objects


@dataclass
class Call:
    name: str
    arguments: str               # the JSON text of an object


class ToolParser:
    name = ""
    trigger = ""                 # the text that opens the calls
    arguments_key = "arguments"  # the key the family writes a call's arguments under
    trigger_token: int | None = None     # the trigger's id where the tokenizer has it as one special token

    def bind_tokenizer(self, tokenizer) -> "ToolParser":
        """Look the trigger up in the model's tokenizer: a special token (Mistral's [TOOL_CALLS])
        is not text, so the grammar names it by id and the answer's text must keep it."""
        hf = getattr(tokenizer, "hf", tokenizer)
        ids = hf.convert_tokens_to_ids([self.trigger]) if self.trigger else []
        if ids and ids[0] is not None and ids[0] != hf.unk_token_id and ids[0] in set(hf.all_special_ids) | {
                i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if t.special}:
            self.trigger_token = int(ids[0])
        return self

    # ---- reading an answer -------------------------------------------------------------
    def parse(self, text: str) -> tuple[str | None, list[Call]]:
        """(content, calls) of a finished answer. An answer whose calls do not parse (max_tokens
        ran out inside one) is returned whole as content, with no calls."""
        start = self.calls_start(text)
        if start is None:
            return text, []
        calls = self.parse_calls(text[start:])
        if not calls:
            return text, []
        return (text[:start].strip() or None), calls

    def calls_start(self, text: str) -> int | None:
        """Where the calls begin in `text` (the trigger's position), or None."""
        i = text.find(self.trigger)
        return None if i < 0 else i

    def held_back(self, text: str) -> int:
        """How many characters at the end of streamed `text` (no trigger yet) might be the start of
        the trigger, so are not sent as content yet."""
        for n in range(min(len(self.trigger) - 1, len(text)), 0, -1):
            if self.trigger.startswith(text[-n:]):
                return n
        return 0

    def finished_calls(self, calls_text: str) -> list[Call]:
        """The calls already complete in a stream's calls text (sent before the answer ends).
        By default none: the calls are parsed when the answer ends."""
        return []

    def parse_calls(self, calls_text: str) -> list[Call]:
        raise NotImplementedError

    # ---- holding the answer ------------------------------------------------------------
    def grammar(self, tools: list[dict], parallel: bool, allow_additional_properties: bool = False) -> str:
        """The Lark grammar of an "auto" answer for `tools` ([{"name", "parameters"}])."""
        schema = call_schema(tools, self.arguments_key, allow_additional_properties)
        return f"{self.rules(parallel)}\n{self.text_rules()}\ncall: %json {json.dumps(schema)}"

    def rules(self, parallel: bool) -> str:
        """The start rule: TEXT, or `pre` (text, then the trigger) then the calls."""
        raise NotImplementedError

    def text_rules(self) -> str:
        if self.trigger_token is not None:            # a special token: never inside text, named by id
            return f"TEXT: /(?s:.+)/\npre: TEXT? <[{self.trigger_token}]>"
        return free_text_rules(self.trigger) + "\npre: PRE"


def call_schema(tools: list[dict], arguments_key: str, allow_additional_properties: bool = False) -> dict:
    """One call: {"name": one tool's name, <arguments_key>: that tool's parameters}, keys in that
    order, nothing else (JSON written as json.dumps writes it: grammar.py's COMPACT)."""
    options = []
    for tool in tools:
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if not allow_additional_properties:
            parameters = close_objects(parameters)
        options.append({"type": "object", "properties": {"name": {"const": tool["name"]}, arguments_key: parameters},
                        "required": ["name", arguments_key], "additionalProperties": False})
    return {"anyOf": options, "x-guidance": COMPACT}


def free_text_rules(trigger: str) -> str:
    """TEXT: any text without the trigger; PRE: such text, then the trigger (one lexeme)."""
    no_trigger = f"/(?s:.*)/ & ~/(?s:.*{lark_regex(trigger)}.*)/"
    return f"TEXT: {no_trigger}\nPRE: ({no_trigger}) {json.dumps(trigger)}"


def lark_regex(text: str) -> str:
    """`text` as a literal inside a Lark /regex/."""
    return re.escape(text).replace("/", "\\/")


def decode_objects(text: str, separator: str) -> list | None:
    """JSON values written one after the other, `separator` (and spaces) between them; None if
    anything else is in the text."""
    decoder, values, i = json.JSONDecoder(), [], 0
    text = text.strip()
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)
        rest = text[i:].lstrip()
        if rest.startswith(separator.strip()):
            rest = rest[len(separator.strip()):].lstrip()
        elif rest:
            return None
        i = len(text) - len(rest)
    return values


def as_call(value, arguments_keys=("arguments", "parameters")) -> Call | None:
    """{"name": str, "arguments" | "parameters": object} -> a Call (None for anything else)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in arguments_keys if k in value), None)
    arguments = value.get(key, {}) if key else {}
    if isinstance(arguments, str):                # some models write the arguments' JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(value["name"], json.dumps(arguments, ensure_ascii=False))
