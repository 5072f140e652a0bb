"""A request's spec -> a grammar llguidance compiles, checked once per distinct spec.

Why llguidance (measured on this model's 49,152-token tokenizer, 2-core CPU, a nested schema
with an enum, bounds and a pattern; /tmp-free script in the closing note of the issue):
compile 0.6-0.9 ms a schema and a mask 0.04-0.07 ms per sequence at batch 1, 0.9 ms for 32;
xgrammar 0.2.9 took 4.7 ms, 0.2 ms and 6.4 ms, and pulls triton and a TVM runtime. llguidance
has no runtime dependencies. Neither needs a JSON-schema compiler of our own.

A `choice` list becomes an alternation of literal strings; `json_object` the schema
{"type": "object"}; a Lark `grammar` passes through as llguidance reads it. JSON is
generated without free whitespace (`whitespace_flexible: false`: ", " and ": " between items,
as json.dumps writes them): a model can otherwise pad an answer with newlines until
max_tokens, which a random test model does at once (a schema's own "x-guidance" wins). The
spaces matter: lesson 12 measured SmolLM2 right on 8 of 8 answers with them, 2 of 8 without.
"""
from __future__ import annotations

import json
from collections import OrderedDict

from ..utils.validate import refuse
from .params import StructuredOutputsParams
from .schema import close_objects

CACHE_SIZE = 256          # distinct specs kept compiled
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(spec: StructuredOutputsParams, allow_additional_properties: bool = False) -> str:
    """The llguidance grammar for a spec (not yet checked against a tokenizer). An object schema
    with properties and no additionalProperties allows no other keys (schema.py) unless
    `allow_additional_properties`."""
    from llguidance import LLMatcher
    if spec.kind in ("json", "json_object"):
        schema = spec.json if spec.kind == "json" else {"type": "object"}
        schema = schema if allow_additional_properties else close_objects(schema)
        return LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.regex)
    if spec.kind == "choice":
        return "start: " + " | ".join(json.dumps(c) for c in spec.choice)
    return LLMatcher.grammar_from_lark(spec.grammar)


class GrammarCache:
    """Compiled grammars by spec (kind + text), checked against the tokenizer once: a bad
    schema or regex is refused at add_request with llguidance's own message."""

    def __init__(self, ll_tokenizer, allow_additional_properties: bool = False):
        self.ll_tokenizer, self.allow_additional_properties = ll_tokenizer, allow_additional_properties
        self.grammars: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, spec: StructuredOutputsParams) -> str:
        from llguidance import LLMatcher
        key = (spec.kind, spec.spec_text())
        if key in self.grammars:
            self.grammars.move_to_end(key)
            return self.grammars[key]
        try:
            grammar = grammar_text(spec, self.allow_additional_properties)
        except (ValueError, TypeError) as e:
            refuse("structured_outputs", f"the {spec.kind} spec is not valid: {e}")
        error = LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error:
            refuse("structured_outputs", f"the {spec.kind} spec is not valid: {error.strip()}")
        self.grammars[key] = grammar
        if len(self.grammars) > CACHE_SIZE:
            self.grammars.popitem(last=False)
        return grammar
