"""Scaled dot-product attention on padded batches, the math every backend shares.

Shapes: q [B, T, H, D] (T new tokens per row), k and v [B, L, Hkv, D] (L keys per
row), mask [B, T, L] with True where a query may look at a key. GQA: each group of
H / Hkv query heads shares one key/value head, so k and v are repeated to H heads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, L, Hkv, D] -> [B, L, H, D] by repeating each kv head H/Hkv times (GQA)."""
    groups = num_heads // x.shape[2]
    return x if groups == 1 else x.repeat_interleave(groups, dim=2)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) where mask, else -inf) v  ->  [B, T, H, D]."""
    h = q.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, repeat_kv(k, h), repeat_kv(v, h)))  # [B, H, *, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :, :])
    return out.transpose(1, 2)


def causal_mask(query_positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, T] positions of the queries -> [B, T, L] mask: key j visible iff j <= position."""
    keys = torch.arange(num_keys, device=query_positions.device)
    return keys[None, None, :] <= query_positions[:, :, None]
