"""Lesson 01's memory scheme: none. Attend over the whole sequence, recomputed each step.

The model calls `attend(layer, q, k, v)` with the q/k/v of *every* token of each
sequence, because nothing was kept from the previous step. The cost of a step
therefore grows with the sequence length: that is the motivation for lesson 02.
"""
from __future__ import annotations

import torch

from .core import causal_mask, masked_attention


class NoCache:
    """Causal attention within each sequence of a flat batch; stores nothing.

    `seq_lens` says how the flat batch of N tokens splits into sequences; each
    sequence's tokens are its positions 0..len-1.
    """

    def __init__(self, seq_lens: list[int]):
        self.seq_lens = list(seq_lens)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs, start = [], 0
        for n in self.seq_lens:
            sl = slice(start, start + n)
            positions = torch.arange(n, device=q.device)[None, :]
            out = masked_attention(q[None, sl], k[None, sl], v[None, sl], causal_mask(positions, n))
            outs.append(out[0])
            start += n
        return torch.cat(outs, dim=0)
