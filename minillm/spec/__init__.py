"""Speculative decoding: propose a few tokens cheaply, let the model verify them all in one
forward, keep what it agrees with (lesson 11).

    config.py     SpeculativeConfig, vLLM's `speculative_config` dict checked
    ngram.py      the n-gram (prompt lookup) proposer
    rejection.py  the rejection sampler: accepted tokens keep the model's own distribution
    speculator.py the engine's side: proposals before a step, verification after it
    self_draft.py the model's first layers draft for it (in the runner)
    draft_model.py a smaller checkpoint drafts, in its own KV pool on the same block tables
"""
from .config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
