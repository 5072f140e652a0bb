"""Attention backends: objects with `attend(layer_idx, q, k, v) -> out` that the model calls."""
from .core import causal_mask, masked_attention
from .no_cache import NoCache

__all__ = ["NoCache", "causal_mask", "masked_attention"]
