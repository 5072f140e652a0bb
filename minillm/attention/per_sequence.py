"""Paged attention one sequence at a time: lesson 03's exercise, in its plainest form.

A step's flat batch mixes sequences: some feed a prompt or a chunk of one, some a single
decode token. For each sequence b this gathers the keys and values its block table points at
(`block_tables[b]`, the first `seq_lens[b]` slots), and runs lesson 02's masked attention with
the causal mask of its queries' positions. `TorchPagedAttention` (paged.py) computes the same
thing with the decode rows batched together; the check of lesson 03 compares a learner's
version with a naive recompute over contiguous keys.
"""
from __future__ import annotations

import torch

from .core import causal_mask, masked_attention


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step) -> torch.Tensor:
    """q [N, H, D], one row per token of the step, attends to its sequence's cached keys and
    values [num_blocks, block_size, Hkv, D] through the block table; returns [N, H, D]."""
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(len(step.query_starts) - 1):
        s, e = step.query_starts[b], step.query_starts[b + 1]         # sequence b's rows of q
        n = int(step.seq_lens[b])                                      # its keys: cached + this step's
        blocks = step.block_tables[b, : -(-n // block_size)]           # the blocks holding them, in order
        keys = k_cache[blocks].flatten(0, 1)[:n]                       # [n, Hkv, D]
        values = v_cache[blocks].flatten(0, 1)[:n]
        mask = causal_mask(step.positions[None, s:e], n)               # a query sees keys up to its position
        out[s:e] = masked_attention(q[None, s:e], keys[None], values[None], mask)[0]
    return out
