"""The attention-backend seam: how a paged KV cache is written and read (lessons 03 and 08).

`PagedKVCache.attend` stores a step's K/V with `write` and reads them back with `forward`;
the backend decides how (gather + SDPA, a C kernel reading blocks in place, Triton). What
a backend can do is declared here as attributes and methods every backend has, so the
engine asks them directly instead of probing:

    capture_safe          its decode can be recorded in a CUDA graph (no host sync)
    unusable_reason()     why it cannot run on a device and dtype (None: it can)
    fixed_shape_decode()  its decode for a step with fixed shapes, or None (the runner then
                          uses the reference's full-width form)

Backends register their name in `minillm.utils.registry.ATTENTION_BACKENDS`.
"""
from __future__ import annotations

import abc

import torch


class AttentionBackend(abc.ABC):
    name: str = ""
    capture_safe: bool = False

    @classmethod
    def unusable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this backend cannot run on `device` with `dtype`, with the fix; None when it can."""
        return None

    def write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              slots: torch.Tensor) -> None:
        """Store new K/V [N, Hkv, D] into their slots of the caches (default: `write_kv`)."""
        write_kv(k_cache, v_cache, k, v, slots)

    @abc.abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step) -> torch.Tensor:
        """Attention of a whole step's queries q [N, H, D] over the paged cache, laid out by
        `step` (a PagedStep: slot mapping, positions, query starts, block tables)."""

    @abc.abstractmethod
    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One query per sequence: q [B, H, D] at positions [B] reads block_tables[b] up to its position."""

    def fixed_shape_decode(self, device: torch.device, dtype: torch.dtype):
        """attention(q, k_cache, v_cache, step) for a decode step with fixed shapes and no host
        sync (runner/fixed_shape_decode.py), or None when this backend has no such form."""
        return None


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store new K/V [N, Hkv, D] into their slots of the [blocks, block_size, Hkv, D] caches."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)
