"""`bench serve --structured json`: the same workload with a JSON schema per request.

Each request gets its own schema (property names carry the request's index, so no two
compile to the same grammar and the cache never helps): an array of at least 64 small
objects, so every answer runs to its max_tokens, as long as the unconstrained answer may, and
TPOT compares token for token. The grammar compile time is measured here, in-process, with the engine's own
code (GrammarCache) on the served model's tokenizer: p50 and p99 over the workload's schemas.
"""
from __future__ import annotations

import time

from ..structured.grammar import GrammarCache
from ..structured.params import StructuredOutputsParams


def request_schema(i: int) -> dict:
    item = {"type": "object", "properties": {f"name_{i}": {"type": "string", "maxLength": 16},
                                             f"score_{i}": {"type": "integer", "minimum": 0, "maximum": 1000},
                                             "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                      "maxItems": 3}},
            "required": [f"name_{i}", f"score_{i}"], "additionalProperties": False}
    return {"type": "array", "items": item, "minItems": 64}     # never done before max_tokens


def response_format(i: int) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": f"r{i}", "schema": request_schema(i)}}}


def compile_times_ms(tokenizer, n: int) -> dict:
    """Compile n distinct schemas with the engine's grammar cache: p50 / p99 in ms (plus the
    one-time cost of reading the vocabulary into the grammar engine)."""
    import llguidance.hf
    start = time.perf_counter()
    cache = GrammarCache(llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=len(tokenizer.hf)))
    vocabulary_ms = (time.perf_counter() - start) * 1e3
    times = []
    for i in range(n):
        spec = StructuredOutputsParams(json=request_schema(i))
        start = time.perf_counter()
        cache.get(spec)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {"compile_ms_p50": times[len(times) // 2], "compile_ms_p99": times[min(len(times) - 1, round(0.99 * (
        len(times) - 1)))], "vocabulary_ms": vocabulary_ms}
