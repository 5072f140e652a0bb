"""vLLM's `speculative_config` ({"method": "ngram", "num_speculative_tokens": 4, ...}), checked
when the engine is built so a typo fails before any step."""
from __future__ import annotations

from dataclasses import dataclass

from ..utils.validate import Validated, check_choice, check_int, fail

METHODS = ("ngram", "self_draft", "draft_model")
# Above this many running sequences a step is compute-bound enough that verifying drafts costs
# more than it saves (vLLM and SGLang switch speculation off under load for the same reason).
# Measured (`bench spec`, SmolLM2, 2-core EPYC, n-gram, input-grounded): 2.74x at batch 1,
# 1.21x at batch 8, 0.75x at batch 32.
DEFAULT_MAX_BATCH_SIZE = 8


@dataclass
class SpeculativeConfig(Validated):
    method: str = "ngram"
    num_speculative_tokens: int = 4           # drafts verified per step at most
    prompt_lookup_min: int = 1                # the shortest n-gram looked up
    prompt_lookup_max: int = 4                # the longest (tried first)
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE   # no speculation above this many running sequences
    num_draft_layers: int | None = None       # self_draft: the first layers that draft (default: half)
    model: str | None = None                  # draft_model: a smaller checkpoint with the same tokenizer

    def validate(self) -> None:
        name = "SpeculativeConfig"
        check_choice(name, "method", self.method, METHODS)
        check_int(name, "num_speculative_tokens", self.num_speculative_tokens, minimum=1, maximum=16)
        check_int(name, "prompt_lookup_min", self.prompt_lookup_min, minimum=1, maximum=64)
        check_int(name, "prompt_lookup_max", self.prompt_lookup_max, minimum=self.prompt_lookup_min, maximum=64)
        check_int(name, "max_batch_size", self.max_batch_size, minimum=1)
        check_int(name, "num_draft_layers", self.num_draft_layers, minimum=1, optional=True)
        if (self.method == "draft_model") != isinstance(self.model, str):
            fail(name, "model", "a model name, folder or hub id with method 'draft_model' (and only then)", self.model)

    @classmethod
    def coerce(cls, value) -> "SpeculativeConfig | None":
        """None, an instance, or its fields as a dict (vLLM's `speculative_config`)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            fail("EngineConfig", "speculative_config", "a dict such as {\"method\": \"ngram\", "
                 "\"num_speculative_tokens\": 4} or None", value, TypeError)
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            fail("EngineConfig", "speculative_config", f"a dict of {', '.join(cls.__dataclass_fields__)}",
                 f"unknown key(s) {sorted(unknown)}")
        return cls(**value)
