"""What a request asks its output to match, in vLLM's shape (`SamplingParams.structured_outputs`).

Exactly one of: `json` (a JSON schema, as a dict or its text), `regex`, `choice` (a list of
strings: the output is one of them), `grammar` (a Lark grammar, as llguidance reads it) or
`json_object=True` (any JSON object). Sizes are bounded here, before any compiling: a spec is
compiled once per distinct text (grammar.py), but its size is the client's to choose.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..utils.validate import Validated, fail, refuse

MAX_SPEC_CHARS = 64 * 1024          # a schema, regex or grammar's text
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024


@dataclass
class StructuredOutputsParams(Validated):
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def validate(self) -> None:
        name = "StructuredOutputsParams"
        given = [f for f in ("json", "regex", "choice", "grammar") if getattr(self, f) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            refuse("structured_outputs", f"{name} takes exactly one of json, regex, choice, grammar or "
                   f"json_object, got {', '.join(given) or 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    object.__setattr__(self, "json", json.loads(self.json))
                except ValueError as e:
                    fail(name, "json", "a JSON schema (a dict or its JSON text)", f"text that is not JSON ({e})")
            if not isinstance(self.json, (dict, bool)):
                fail(name, "json", "a JSON schema (a dict or its JSON text)", self.json, TypeError)
        for field in ("regex", "grammar"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and value):
                fail(name, field, "a non-empty string", value, TypeError)
        if self.choice is not None:
            choice = self.choice
            if (not isinstance(choice, (list, tuple)) or not choice or len(choice) > MAX_CHOICES
                    or not all(isinstance(c, str) and c and len(c) <= MAX_CHOICE_CHARS for c in choice)):
                fail(name, "choice", f"a list of 1 to {MAX_CHOICES} non-empty strings of at most "
                     f"{MAX_CHOICE_CHARS} characters", choice)
            object.__setattr__(self, "choice", list(choice))
        if len(self.spec_text()) > MAX_SPEC_CHARS:
            refuse("structured_outputs", f"the {given[0]} spec has {len(self.spec_text())} characters; "
                   f"at most {MAX_SPEC_CHARS}")

    @property
    def kind(self) -> str:
        return next(f for f in ("json", "regex", "choice", "grammar", "json_object")
                    if getattr(self, f) not in (None, False))

    def spec_text(self) -> str:
        """The spec as text: what the compiled-grammar cache is keyed by (with the kind)."""
        value = getattr(self, self.kind)
        if self.kind in ("json", "choice"):
            return json.dumps(value, sort_keys=True)
        return "" if self.kind == "json_object" else value

    @classmethod
    def coerce(cls, value) -> "StructuredOutputsParams | None":
        """None, an instance, or a dict of its fields (as a JSON client sends it)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"json", "regex", "choice", "grammar", "json_object"}
            if unknown:
                refuse("structured_outputs", f"structured_outputs has unknown field(s) {sorted(unknown)}; "
                       "it takes json, regex, choice, grammar or json_object")
            return cls(**value)
        fail("SamplingParams", "structured_outputs", "a StructuredOutputsParams, a dict of its fields or None",
             value, TypeError)
