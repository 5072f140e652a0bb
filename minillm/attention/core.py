"""Scaled dot-product attention on padded batches, the math every backend shares.

Shapes: q [B, T, H, D] (T new tokens per row), k and v [B, L, Hkv, D] (L keys per
row), mask [B, T, L] with True where a query may look at a key.

GQA: each group of G = H / Hkv consecutive query heads shares one key/value head.
Rather than copying k and v G times, we fold the group into the query axis: the
G heads of a group become G more query rows against the same keys.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) where mask, else -inf) v  ->  [B, T, H, D]."""
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    # [B, T, Hkv, G, D] -> [B, Hkv, T*G, D]: query head h uses kv head h // G
    q = q.view(B, T, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, T * G, D)
    mask = mask[:, None, :, None, :].expand(B, 1, T, G, mask.shape[-1]).reshape(B, 1, T * G, -1)
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.view(B, Hkv, T, G, D).permute(0, 2, 1, 3, 4).reshape(B, T, H, D)


def causal_mask(query_positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, T] positions of the queries -> [B, T, L] mask: key j visible iff j <= position."""
    keys = torch.arange(num_keys, device=query_positions.device)
    return keys[None, None, :] <= query_positions[:, :, None]
