"""Lesson 03: the physical KV pool, laid out by block, and the object the model talks to.

Per layer, k and v are [num_blocks, block_size, kv_heads, head_dim]: a block is a
small contiguous page of token slots. Which blocks belong to which sequence is
the block manager's business (block tables); this object only stores K/V where
the step's slot mapping says and lets the attention backend read them back.
"""
from __future__ import annotations

import torch

from ..attention.base import AttentionBackend
from ..attention.paged import PagedStep
from .swap import SwapSpace


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype=torch.float32, device="cpu", backend: AttentionBackend | None = None):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.block_size = block_size
        self.num_blocks = num_blocks
        if backend is None:
            from ..attention.paged import TorchPagedAttention     # the reference, when none is named
            backend = TorchPagedAttention()
        self.backend = backend
        self.step: PagedStep | None = None

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, backend=None) -> "PagedKVCache":
        c = model.config
        return cls(c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim,
                   model.dtype, model.device, backend)

    @staticmethod
    def bytes_per_block_for(model, block_size: int) -> int:
        c = model.config
        return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * model.dtype.itemsize

    @property
    def device(self):
        return self.k[0].device

    def set_step(self, step: PagedStep) -> None:
        self.step = step

    def attend(self, layer_idx: int, q, k, v):
        self.backend.write(self.k[layer_idx], self.v[layer_idx], k, v, self.step.slot_mapping)
        return self.backend.forward(q, self.k[layer_idx], self.v[layer_idx], self.step)

    def plain_caches(self, layer_idx: int):
        """(k_cache, v_cache, slot_mapping) of a layer for a caller that writes this step's K/V itself
        (models/fused_layer.py), or None when the backend has a write of its own to respect."""
        return plain_caches(self.backend.write, self.k[layer_idx], self.v[layer_idx], self.step)

    def attend_stored(self, layer_idx: int, q):
        """Attention of q over the layer's cache, this step's K/V already written (`plain_caches`)."""
        return self.backend.forward(q, self.k[layer_idx], self.v[layer_idx], self.step)

    def enable_swap(self, num_cpu_blocks: int) -> None:
        self.swap_space = SwapSpace(num_cpu_blocks, self.k + self.v)

    def apply(self, ops) -> None:
        """Do the block manager's queued moves before the forward, in a safe order: save
        swapped-out blocks before anyone reuses them, copy-on-write from blocks that still
        hold their data, and only then restore swapped-in blocks."""
        if ops.swap_out:
            self.swap_space.copy_out(self.k + self.v, ops.swap_out)
        self.copy_blocks(ops.copies)
        if ops.swap_in:
            self.swap_space.copy_in(self.k + self.v, ops.swap_in)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block dst gets block src's K/V in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for cache in self.k + self.v:
            cache[dst] = cache[src]


def plain_caches(write, k_cache, v_cache, step):
    """(k_cache, v_cache, step.slot_mapping) when `write` is the default K/V write, else None."""
    return (k_cache, v_cache, step.slot_mapping) if getattr(write, "__func__", None) is AttentionBackend.write else None
