"""A decode step with static shapes: what torch.compile and CUDA graphs both need.

The eager runner builds new tensors each step, sized by how many sequences run and
how long their block tables are. A compiled graph or a captured CUDA graph fixes every
shape and every buffer address once, so here a decode step (every sequence feeds one
token) is laid out into tensors allocated once:

  input_ids, positions, slot_mapping, context_lens   [max_batch]
  block_tables                                       [max_batch, max_model_len / block_size]

and the batch is padded to a bucket size (1, 2, 4, 8, 16, 24, 32, ... as vLLM and
nano-vllm capture them), so a handful of callables, one per bucket, cover every batch.
Padding rows feed token 0 at position 0 of a scratch block: one extra block past the
end of the pool that no block table of the block manager can name (vLLM's kernels skip
slot -1 instead; our K/V write is a plain index_copy_, so it needs a real place to write).
A padding row reads only its own scratch slot and its logits are dropped.

Attention inside the step must have static shapes and no host sync:
  - a backend's own `fixed_shape_decode` when it has one: the C kernel as the torch op
    `minillm::paged_decode_attention`, Triton's decode;
  - otherwise (the torch reference, whose decode slices to `int(positions.max())`, a host
    sync): a full-width form that gathers every column of the block table and masks,
    so its cost grows with max_model_len, not with the context actually used.
Mixed and prefill steps keep the eager path (`runner.py`).
"""
from __future__ import annotations

import bisect

import torch

from ..utils import cdiv

from ..attention.core import causal_mask, masked_attention
from ..attention.paged import PagedStep
from ..kv.paged_cache import PagedKVCache, plain_caches


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, and max_num_seqs itself as the last."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def bucket_for(buckets: list[int], n: int) -> int:
    """The smallest bucket that holds n rows."""
    return buckets[bisect.bisect_left(buckets, n)]


def reserve_scratch_block(kv_cache: PagedKVCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Give every layer's pool one more block, at index num_blocks, that the block manager
    never hands out. The cache keeps views of the first num_blocks blocks (same memory),
    so the rest of the engine sees nothing change. Returns the full per-layer tensors."""
    full = {}
    for caches in (kv_cache.k, kv_cache.v):
        for i, t in enumerate(caches):
            base = t._base
            if base is None or base.shape[0] != t.shape[0] + 1:      # not reserved yet (one layer at a time)
                base = torch.zeros((t.shape[0] + 1, *t.shape[1:]), dtype=t.dtype, device=t.device)
                base[:-1].copy_(t)
                caches[i] = base[:-1]
            full.setdefault(id(caches), []).append(base)
    return full[id(kv_cache.k)], full[id(kv_cache.v)]


def full_width_decode(q, k_cache, v_cache, step: PagedStep) -> torch.Tensor:
    """The reference decode with static shapes: every column of the block table, masked."""
    tables = step.block_tables
    B, L = tables.shape[0], tables.shape[1] * k_cache.shape[1]
    keys = k_cache[tables].reshape(B, L, *k_cache.shape[2:])
    values = v_cache[tables].reshape(B, L, *v_cache.shape[2:])
    return masked_attention(q[:, None], keys, values, causal_mask(step.positions[:, None], L))[:, 0]


def fixed_shape_attention(backend, device: torch.device, dtype: torch.dtype):
    """attention(q, k_cache, v_cache, step) with static shapes and no host sync: the backend's own
    form when it has one (the C kernel, Triton), else the reference's full width (module doc)."""
    return backend.fixed_shape_decode(device, dtype) or full_width_decode


class DecodeKV:
    """The `kv` object the model talks to inside a static step: writes this step's K/V into
    the full pools (scratch block included), with the backend's own write if it has one,
    and attends with the static attention."""

    def __init__(self, k_layers, v_layers, step: PagedStep, attention, write):
        self.k, self.v, self.step, self.attention, self.write = k_layers, v_layers, step, attention, write

    def attend(self, layer_idx: int, q, k, v):
        self.write(self.k[layer_idx], self.v[layer_idx], k, v, self.step.slot_mapping)
        return self.attention(q, self.k[layer_idx], self.v[layer_idx], self.step)

    def plain_caches(self, layer_idx: int):
        return plain_caches(self.write, self.k[layer_idx], self.v[layer_idx], self.step)

    def attend_stored(self, layer_idx: int, q):
        return self.attention(q, self.k[layer_idx], self.v[layer_idx], self.step)


class StaticDecodeStep:
    """Preallocated inputs for up to max_num_seqs decode rows, and `forward(bucket)`, the
    model's decode step (logits included) over the first `bucket` rows of them."""

    def __init__(self, model, kv_cache: PagedKVCache, max_num_seqs: int, max_model_len: int):
        self.model, self.block_size = model, kv_cache.block_size
        self.buckets = bucket_sizes(max_num_seqs)
        self.k, self.v = reserve_scratch_block(kv_cache)
        self.scratch_block = self.k[0].shape[0] - 1
        self.width = cdiv(max_model_len, self.block_size)
        B, device = self.buckets[-1], kv_cache.device
        longs = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(B, **longs)
        self.positions = torch.zeros(B, **longs)
        self.slot_mapping = torch.full((B,), self.scratch_block * self.block_size, **longs)
        self.context_lens = torch.ones(B, **longs)
        self.block_tables = torch.full((B, self.width), self.scratch_block, **longs)
        attention = fixed_shape_attention(kv_cache.backend, device, model.dtype)
        self.kv = {b: DecodeKV(self.k, self.v, self._step(b, longs), attention, kv_cache.backend.write)
                   for b in self.buckets}

    def _step(self, b: int, longs: dict) -> PagedStep:
        """The PagedStep of a bucket: views of the static tensors, one decode row per sequence."""
        rows = torch.arange(b, **longs)
        return PagedStep(self.slot_mapping[:b], self.positions[:b], torch.arange(b + 1, **longs),
                         self.context_lens[:b], self.block_tables[:b], list(range(b + 1)), 1,
                         list(range(b)), rows)

    def fits(self, seqs) -> bool:
        """Can this batch of decode rows run here? (not too many rows, no table too wide)"""
        return len(seqs) <= self.buckets[-1] and all(len(s.block_table) <= self.width for s in seqs)

    @torch.inference_mode()
    def prepare(self, seqs) -> int:
        """Write the step's rows into the static tensors (host side, before the callable);
        rows past len(seqs) up to the bucket become padding. Returns the bucket."""
        n, bs = len(seqs), self.block_size
        b = bucket_for(self.buckets, n)
        positions = [s.num_computed_tokens for s in seqs]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        ids = [s.token_ids[p] for s, p in zip(seqs, positions)]
        widest = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [self.scratch_block] * (widest - len(s.block_table)) for s in seqs]
        pad = b - n
        scratch_slot = self.scratch_block * bs
        rows = torch.tensor([ids + [0] * pad, positions + [0] * pad, slots + [scratch_slot] * pad,
                             [p + 1 for p in positions] + [1] * pad])
        device = self.input_ids.device
        for dst, src in zip((self.input_ids, self.positions, self.slot_mapping, self.context_lens), rows):
            dst[:b].copy_(src, non_blocking=True)
        self.block_tables[:n, :widest].copy_(torch.tensor(tables), non_blocking=device.type == "cuda")
        self.block_tables[n:b, 0] = self.scratch_block
        return b

    @torch.inference_mode()
    def reset_to_padding(self) -> None:
        """Every row a padding row (what a CUDA graph is captured on)."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(self.scratch_block * self.block_size)
        self.context_lens.fill_(1)
        self.block_tables.fill_(self.scratch_block)

    @torch.inference_mode()
    def run(self, seqs) -> torch.Tensor:
        """Logits [len(seqs), V] of this decode batch, the static step run eagerly."""
        return self.forward(self.prepare(seqs))[:len(seqs)]

    def forward(self, bucket: int) -> torch.Tensor:
        """Logits [bucket, V] for the rows `prepare` wrote: no host sync, static shapes."""
        hidden = self.model(self.input_ids[:bucket], self.positions[:bucket], self.kv[bucket])
        return self.model.compute_logits(hidden)
