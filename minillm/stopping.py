"""When does a sequence end? EOS, a stop token, a stop string, or max_tokens.

Stop strings are matched on decoded text, because one string can span several
tokens and one token can hold several characters. The text shown to the user is
cut just before the stop string, as vLLM does.
"""
from __future__ import annotations

from .sampling import SamplingParams


class StopChecker:
    def __init__(self, params: SamplingParams, tokenizer=None, eos_token_ids=()):
        if params.stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode text")
        self.params = params
        self.tokenizer = tokenizer
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.text = ""

    def check(self, output_ids: list[int]) -> str | None:
        """Call after each new token; returns "stop", "length" or None (keep going)."""
        p, last = self.params, output_ids[-1]
        if self.tokenizer is not None:
            self.text = self.tokenizer.decode(output_ids)
        if last in self.eos_token_ids or last in p.stop_token_ids:
            return "stop"
        if p.stop:
            hits = [i for i in (self.text.find(s) for s in p.stop) if i != -1]
            if hits:
                self.text = self.text[:min(hits)]
                return "stop"
        if len(output_ids) >= p.max_tokens:
            return "length"
        return None
