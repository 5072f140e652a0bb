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
runs masked attention: easy to read and to check. A kernel reads the blocks in place
behind the same `forward(q, k_cache, v_cache, step)`: `cpu_paged.py` on CPU, as a GPU
paged-attention kernel (vLLM's) does on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import AttentionBackend, write_kv  # noqa: F401  (write_kv: the reference write, imported from here)
from .core import causal_mask, masked_attention


@dataclass
class PagedStep:
    slot_mapping: torch.Tensor     # [N]
    positions: torch.Tensor        # [N]
    query_start: torch.Tensor      # [B + 1]
    seq_lens: torch.Tensor         # [B]
    block_tables: torch.Tensor     # [B, max_blocks]
    query_starts: list[int]        # query_start as a Python list
    max_query_len: int
    decode_seqs: list[int]         # sequences feeding exactly one token this step
    decode_rows: torch.Tensor      # [len(decode_seqs)] their tokens' rows in the flat batch

    @classmethod
    def build(cls, block_tables: list[list[int]], starts: list[int], num_new: list[int],
              block_size: int, device="cpu", slot_mapping_fn=None, padded_tables: torch.Tensor | None = None,
              ) -> "PagedStep":
        """Sequence b writes num_new[b] tokens at positions starts[b], starts[b]+1, ...
        `slot_mapping_fn`: the function below unless another is given (lesson 03's).
        `padded_tables`: the block tables already as the padded tensor (the runner keeps them
        between steps, runner/block_tables.py); else they are padded here."""
        slot_mapping_fn = slot_mapping_fn or slot_mapping
        positions, slots = [], []
        for table, start, n in zip(block_tables, starts, num_new):
            pos = list(range(start, start + n))
            positions += pos
            slots += slot_mapping_fn(table, pos, block_size)
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)
        if padded_tables is None:
            width = max(len(t) for t in block_tables)
            padded_tables = as_long([t + [0] * (width - len(t)) for t in block_tables])
        query_start = [0]
        for n in num_new:
            query_start.append(query_start[-1] + n)
        decode_seqs = [b for b, n in enumerate(num_new) if n == 1]
        return cls(as_long(slots), as_long(positions), as_long(query_start),
                   as_long([s + n for s, n in zip(starts, num_new)]), padded_tables.to(device),
                   query_start, max(num_new), decode_seqs, as_long([query_start[b] for b in decode_seqs]))


def slot_mapping(block_table: list[int], positions: list[int], block_size: int) -> list[int]:
    """Position p of a sequence lives in slot block_table[p // block_size] * block_size + p % block_size."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


class TorchPagedAttention(AttentionBackend):
    """Reference backend: gather blocks -> padded keys -> masked attention.

    Decode tokens (one query per sequence) are batched together; each prefill chunk
    runs on its own. Padding a decode row to a 500-token prefill chunk would make that
    step's attention hundreds of times bigger than it needs to be."""

    name = "torch"

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                step: PagedStep) -> torch.Tensor:
        if step.max_query_len == 1:                   # pure decode
            return self.decode(q, k_cache, v_cache, step.block_tables, step.positions)
        out = torch.empty_like(q)
        starts, rows = step.query_starts, step.decode_rows
        if step.decode_seqs:
            out[rows] = self.decode(q[rows], k_cache, v_cache, step.block_tables[step.decode_seqs],
                                    step.positions[rows])
        for b in range(len(starts) - 1):
            s, e = starts[b], starts[b + 1]
            if e - s > 1:
                out[s:e] = self.attend_gathered(q[None, s:e], k_cache, v_cache, step.block_tables[b:b + 1],
                                       step.positions[None, s:e])[0]
        return out

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One query per sequence: q [B, H, D] at positions [B], sequence b's blocks in
        block_tables[b]. The seam a faster decode kernel replaces (cpu_paged.py)."""
        return self.attend_gathered(q[:, None], k_cache, v_cache, block_tables, positions[:, None])[:, 0]

    @staticmethod
    def attend_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q [B, T, H, D] at `positions` [B, T] attends to its sequence's blocks."""
        block_size = k_cache.shape[1]
        num_blocks = int(positions.max()) // block_size + 1      # only the blocks anyone reads
        tables = block_tables[:, :num_blocks]
        B, L = tables.shape[0], num_blocks * block_size
        keys = k_cache[tables].reshape(B, L, *k_cache.shape[2:])
        values = v_cache[tables].reshape(B, L, *v_cache.shape[2:])
        return masked_attention(q, keys, values, causal_mask(positions, L))
