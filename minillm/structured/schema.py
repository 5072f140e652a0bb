"""JSON schemas read as vLLM's default backend (xgrammar) and OpenAI's strict mode read them:
an object schema that lists `properties` but does not say `additionalProperties` allows no
other keys (one that lists none, `{"type": "object"}`, stays any object). The JSON-Schema standard reads the silence as "any extra key is fine", and a
small model then invents keys until max_tokens (langchain's `with_structured_output(method=
"function_calling")` and litellm send such schemas). `close_objects` writes the closed reading
out; `minillm serve --structured-outputs-allow-additional-properties` keeps the standard one.
"""
from __future__ import annotations

SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")    # not allOf: each part closed would refuse the others' keys
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def close_objects(schema):
    """A copy of `schema` where every object schema with `properties` and without `additionalProperties` (or
    patternProperties / unevaluatedProperties, which say something about extra keys) gets
    `"additionalProperties": false`. Anything that is not a dict is returned as it is."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(s) for s in out[key]]
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: close_objects(s) for name, s in out[key].items()}
    for key in SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = close_objects(out[key])
    says = {"additionalProperties", "patternProperties", "unevaluatedProperties", "allOf"} & set(out)
    if isinstance(out.get("properties"), dict) and not says:
        out["additionalProperties"] = False
    return out
