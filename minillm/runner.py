"""Lay out one step as a flat batch and run the model over the paged cache.

The scheduler says "sequence s feeds its next n tokens"; the runner turns that into
input ids, positions and the paged attention layout, runs the forward once for
everyone, and returns the logits of the sequences whose last fed token is their
newest one (a prompt chunk that ends mid-prompt samples nothing yet).
"""
from __future__ import annotations

import torch

from .attention.paged import PagedStep
from .kv.paged_cache import PagedKVCache


class ModelRunner:
    def __init__(self, model, kv_cache: PagedKVCache):
        self.model = model
        self.kv_cache = kv_cache

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[object, int]]) -> tuple[list, torch.Tensor]:
        """scheduled: [(sequence, num_new_tokens)]. Returns (sequences that sample, logits [S, V])."""
        device = self.kv_cache.device
        input_ids, rows, samplers = [], [], []
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            input_ids += seq.token_ids[start:start + n]
            if start + n == len(seq):                 # fed everything it has: predicts the next token
                rows.append(len(input_ids) - 1)
                samplers.append(seq)
        step = PagedStep.build([s.block_table for s, _ in scheduled],
                               [s.num_computed_tokens for s, _ in scheduled],
                               [n for _, n in scheduled], self.kv_cache.block_size, device)
        self.kv_cache.set_step(step)
        hidden = self.model(torch.tensor(input_ids, device=device), step.positions, self.kv_cache)
        if not rows:
            return [], hidden.new_zeros(0, 0)
        return samplers, self.model.compute_logits(hidden[torch.tensor(rows, device=device)])
