"""The seam the whole course turns on: the KV memory the model attends through.

The forward in models/llama.py never changes between lessons. At every layer it hands
this step's q, k, v to an object and gets the attention output back; what that object
keeps between steps is the lesson:

    lesson 01   attention/no_cache.py      nothing: every step recomputes the whole sequence
    lesson 02   kv/contiguous.py           one pre-allocated [max_len] slab per request
    lesson 03   kv/paged_cache.py          blocks of a shared pool, found through block tables
    lesson 08   runner/fixed_shape_decode  the paged pool behind fixed shapes (compile, CUDA graphs)

A learner's cache plugs in by implementing this one method.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class KVCache(Protocol):
    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v [N, kv_heads, head_dim] of layer `layer_idx` (or not: no cache),
        and return the attention of q [N, heads, head_dim] over each token's sequence so far."""
        ...
