"""The draft-model proposer: a smaller checkpoint with the same tokenizer drafts the next tokens
(vLLM's `{"method": "draft_model", "model": ...}`, llama.cpp's `--model-draft`).

The draft model keeps its own paged KV pool with the target's block count and block size, and
uses the target's block tables as they are: every step it is fed the same real tokens as the
target (`follow`), so its pool holds K/V for exactly what the target's holds, and the block
manager's moves (swap, copy-on-write) are applied to both pools. Nothing else in the engine
knows it exists: block tables, the prefix cache and preemption stay the target's.

Drafting (`draft`) runs after `follow` inside the step, before the verification forward: the
follow pass's last row of a drafting sequence gives draft 1; pass j feeds draft j and gives
draft j + 1; one last pass feeds draft k, so that if the target accepts every draft, the draft
pool already holds all of them. Drafts are the draft model's argmax (a point mass), which the
rejection sampler (rejection.py) verifies exactly.

Memory: the draft pool is on top of the target's `num_kv_blocks` budget (a 4x smaller model
with as many blocks costs about 1/4 more KV memory).
"""
from __future__ import annotations

import torch

from ..attention.paged import PagedStep
from ..kv.paged_cache import PagedKVCache


class DraftModel:
    def __init__(self, model, num_blocks: int, block_size: int, backend, num_swap_blocks: int = 0):
        self.model = model
        self.kv_cache = PagedKVCache.for_model(model, num_blocks, block_size, backend)
        if num_swap_blocks:
            self.kv_cache.enable_swap(num_swap_blocks)

    def apply_block_ops(self, ops) -> None:
        self.kv_cache.apply(ops)

    def _forward(self, tokens: list[int], block_tables, starts, counts, slot_mapping_fn) -> torch.Tensor:
        device = self.kv_cache.device
        step = PagedStep.build(block_tables, starts, counts, self.kv_cache.block_size, device, slot_mapping_fn)
        self.kv_cache.set_step(step)
        return self.model(torch.tensor(tokens, device=device), step.positions, self.kv_cache)

    @torch.inference_mode()
    def follow_and_draft(self, scheduled: list, slot_mapping_fn) -> None:
        """Feed the step's real tokens (not the placeholder drafts) to the draft model, then replace
        each drafting sequence's placeholders (`spec_token_ids`) with the draft model's guesses."""
        tokens, counts, last_rows = [], [], {}
        for seq, n in scheduled:
            real = n - len(seq.spec_token_ids)
            start = seq.num_computed_tokens
            tokens += seq.input_token_ids[start:start + real]
            counts.append(real)
            if seq.spec_token_ids:
                last_rows[seq.seq_id] = len(tokens) - 1
        hidden = self._forward(tokens, [s.block_table for s, _ in scheduled],
                               [s.num_computed_tokens for s, _ in scheduled], counts, slot_mapping_fn)
        drafting = [(s, n - len(s.spec_token_ids)) for s, n in scheduled if s.spec_token_ids]
        if not drafting:
            return
        rows = torch.tensor([last_rows[s.seq_id] for s, _ in drafting], device=hidden.device)
        newest = self.model.compute_logits(hidden[rows]).argmax(dim=-1).tolist()
        k = max(len(s.spec_token_ids) for s, _ in drafting)
        for j in range(k):                      # pass j feeds draft j + 1 (the last pass only writes K/V)
            active = [(s, real) for s, real in drafting if j < len(s.spec_token_ids)]
            for (seq, _), token in zip(active, newest):
                seq.spec_token_ids[j] = token
            hidden = self._forward(newest, [s.block_table for s, _ in active],
                                   [s.num_computed_tokens + real + j for s, real in active], [1] * len(active),
                                   slot_mapping_fn)
            drafting = [(s, real) for s, real in active if j + 1 < len(s.spec_token_ids)]
            if not drafting:
                break
            keep = [i for i, (s, _) in enumerate(active) if j + 1 < len(s.spec_token_ids)]
            newest = self.model.compute_logits(hidden[torch.tensor(keep, device=hidden.device)]).argmax(dim=-1).tolist()


def load_draft_model(spec, resolved, target, backend, block_size: int) -> DraftModel:
    """The draft model `spec.model` names (a hub id, a folder, or a built-in name), on the target's
    device and dtype, refused when its vocabulary is not the target's (then its token ids would
    mean other words)."""
    from ..models import load_model
    from ..runner.engine_model import model_for_engine
    draft, _ = load_model(spec.model, device=str(resolved.device), dtype=resolved.dtype)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"speculative_config.model {spec.model!r} has a vocabulary of {draft.config.vocab_size} "
                         f"tokens, the target {target.config.vocab_size}: a draft model must share the tokenizer")
    draft = model_for_engine(draft, resolved.device, resolved.dtype, None)
    return DraftModel(draft, resolved.num_kv_blocks, block_size, backend, resolved.num_swap_blocks)
