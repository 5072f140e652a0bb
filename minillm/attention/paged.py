"""Attention that reads a paged KV cache: the torch reference backend (CPU and CUDA).

One step's flat batch mixes sequences: some feed a chunk of prompt (many tokens),
some a single decode token. `PagedStep` describes that layout once per step, and
every layer reuses it:

  slot_mapping[i]   the physical slot (block * block_size + offset) where token i's K/V go
  positions[i]      token i's position within its sequence
  query_start[b]    sequence b's tokens are q[query_start[b] : query_start[b+1]]
  seq_lens[b]       keys sequence b attends to after this step (its cached + new tokens)
  block_tables[b]   sequence b's block ids, padded with 0 to the longest table

The reference gathers each sequence's blocks into a padded [B, L] key tensor and
runs masked attention: easy to read and to check. A GPU kernel (lesson 08) reads
the blocks in place behind the same `forward(q, k_cache, v_cache, step)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .core import causal_mask, masked_attention


@dataclass
class PagedStep:
    slot_mapping: torch.Tensor     # [N]
    positions: torch.Tensor        # [N]
    query_start: torch.Tensor      # [B + 1]
    seq_lens: torch.Tensor         # [B]
    block_tables: torch.Tensor     # [B, max_blocks]
    token_seq: torch.Tensor        # [N] which sequence each token belongs to
    token_offset: torch.Tensor     # [N] index of the token within its sequence's chunk
    max_query_len: int

    @classmethod
    def build(cls, block_tables: list[list[int]], starts: list[int], num_new: list[int],
              block_size: int, device="cpu") -> "PagedStep":
        """Sequence b writes num_new[b] tokens at positions starts[b], starts[b]+1, ..."""
        positions, slots, token_seq, token_offset = [], [], [], []
        for b, (table, start, n) in enumerate(zip(block_tables, starts, num_new)):
            pos = list(range(start, start + n))
            positions += pos
            slots += slot_mapping(table, pos, block_size)
            token_seq += [b] * n
            token_offset += list(range(n))
        width = max(len(t) for t in block_tables)
        padded = [t + [0] * (width - len(t)) for t in block_tables]
        query_start = [0]
        for n in num_new:
            query_start.append(query_start[-1] + n)
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)
        return cls(as_long(slots), as_long(positions), as_long(query_start),
                   as_long([s + n for s, n in zip(starts, num_new)]), as_long(padded),
                   as_long(token_seq), as_long(token_offset), max(num_new))


def slot_mapping(block_table: list[int], positions: list[int], block_size: int) -> list[int]:
    """Position p of a sequence lives in slot block_table[p // block_size] * block_size + p % block_size."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store new K/V [N, Hkv, D] into their slots of the [blocks, block_size, Hkv, D] caches."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


class TorchPagedAttention:
    """Reference backend: gather blocks -> padded keys -> masked attention."""

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                step: PagedStep) -> torch.Tensor:
        B, T = len(step.seq_lens), step.max_query_len
        num_blocks_per_seq = step.block_tables.shape[1]
        L = num_blocks_per_seq * k_cache.shape[1]
        keys = k_cache[step.block_tables].reshape(B, L, *k_cache.shape[2:])
        values = v_cache[step.block_tables].reshape(B, L, *v_cache.shape[2:])
        if T == 1:                                    # pure decode: one query per sequence
            q_pad, pos_pad = q[:, None], step.positions[:, None]
        else:
            q_pad = q.new_zeros(B, T, *q.shape[1:])
            q_pad[step.token_seq, step.token_offset] = q
            pos_pad = torch.zeros(B, T, dtype=torch.long, device=q.device)   # pads look at key 0
            pos_pad[step.token_seq, step.token_offset] = step.positions
        out = masked_attention(q_pad, keys, values, causal_mask(pos_pad, L))
        return out[:, 0] if T == 1 else out[step.token_seq, step.token_offset]
