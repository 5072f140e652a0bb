"""The self-draft proposer: the first layers of the model itself, then its final norm and head,
draft the next tokens (LayerSkip's idea, without its training), so a model drafts for itself
with no second checkpoint.

It runs in the runner, inside the step, before the verification forward. The scheduler has
reserved slots for k drafts (placeholders); draft pass j feeds, for every drafting sequence, its
newest token (the last real one, then each draft) through the first `num_draft_layers` layers
over the same paged cache, and the argmax of the head is draft j + 1. Those passes write K/V
of the first layers at the draft positions; the verification forward then writes every
layer at the same positions from the same tokens, so what the cache holds is what the model
alone would have put there. Drafts are picked greedily, a point-mass proposal, which the
rejection sampler (rejection.py) verifies exactly.
"""
from __future__ import annotations

import torch

from ..attention.paged import PagedStep


def partial_hidden(model, input_ids: torch.Tensor, positions: torch.Tensor, kv, num_layers: int) -> torch.Tensor:
    """The final norm of the hidden state after the first `num_layers` decoder layers."""
    inner = model.model
    x = inner.embed_tokens(input_ids)
    cos, sin = inner.rotary(positions)
    for layer in inner.layers[:num_layers]:
        x = layer(x, cos, sin, kv)
    return inner.norm(x)


@torch.inference_mode()
def draft_in_place(model, kv_cache, seqs: list, num_layers: int, slot_mapping_fn) -> None:
    """Replace each sequence's placeholder drafts (`spec_token_ids`) with the partial model's
    greedy guesses, one pass per draft position, all drafting sequences batched."""
    device = kv_cache.device
    for j in range(max(len(s.spec_token_ids) for s in seqs)):
        active = [s for s in seqs if j < len(s.spec_token_ids)]
        newest = [s.token_ids[-1] if j == 0 else s.spec_token_ids[j - 1] for s in active]
        step = PagedStep.build([s.block_table for s in active], [s.num_computed_tokens + j for s in active],
                               [1] * len(active), kv_cache.block_size, device, slot_mapping_fn)
        kv_cache.set_step(step)
        hidden = partial_hidden(model, torch.tensor(newest, device=device), step.positions, kv_cache, num_layers)
        for seq, token in zip(active, model.compute_logits(hidden).argmax(dim=-1).tolist()):
            seq.spec_token_ids[j] = token
