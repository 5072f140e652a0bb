"""Lesson 02: a contiguous KV cache, pre-allocated per request to a maximum length.

Prefill runs the prompt once and stores every layer's K and V; each decode step
then feeds only the newest token, which attends to the stored K/V. The price is
memory: each request reserves `max_len` slots up front, whether it uses them or
not. `waste()` measures that, and lesson 03 (paging) removes it. The generation loop
that drives this cache (static batching) is in `minillm/baselines/static_batching.py`.

Layout: per layer, k and v of shape [max_batch, max_len, kv_heads, head_dim]; a
request owns one row. In one step, every participating row adds the same number
of tokens T (a prompt of length T for one row, or T=1 for a decode batch), so the
flat batch of the model is simply rows x T.
"""
from __future__ import annotations

import torch

from ..attention.core import causal_mask, masked_attention


class ContiguousKVCache:
    def __init__(self, num_layers: int, max_batch_size: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype=torch.float32, device="cpu"):
        shape = (max_batch_size, max_len, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.rows = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = torch.zeros(0, 0, dtype=torch.long, device=device)

    @classmethod
    def for_model(cls, model, max_batch_size: int, max_len: int) -> "ContiguousKVCache":
        c = model.config
        return cls(c.num_hidden_layers, max_batch_size, max_len, c.num_key_value_heads, c.head_dim,
                   model.dtype, model.device)

    def set_step(self, rows: list[int], start: list[int], num_tokens: int) -> None:
        """Announce the next forward: row rows[b] adds num_tokens tokens at positions
        start[b], start[b]+1, ...  The model's flat batch is ordered row by row."""
        device = self.k[0].device
        self.rows = torch.tensor(rows, device=device)
        self.positions = torch.tensor(start, device=device)[:, None] + torch.arange(num_tokens, device=device)
        if int(self.positions.max()) >= self.max_len:
            raise ValueError(f"sequence longer than the cache's max_len={self.max_len}")

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k/v in their rows and positions, then attend each query to
        its own row's keys up to its own position. q [N, H, D], k/v [N, Hkv, D]."""
        B, T = self.positions.shape
        rows = self.rows[:, None]
        self.k[layer_idx][rows, self.positions] = k.view(B, T, *k.shape[1:])
        self.v[layer_idx][rows, self.positions] = v.view(B, T, *v.shape[1:])
        num_keys = int(self.positions.max()) + 1
        keys = self.k[layer_idx][self.rows, :num_keys]           # [B, L, Hkv, D]
        values = self.v[layer_idx][self.rows, :num_keys]
        out = masked_attention(q.view(B, T, *q.shape[1:]), keys, values,
                               causal_mask(self.positions, num_keys))
        return out.reshape(B * T, *q.shape[1:])

    def bytes_per_token(self) -> int:
        k = self.k[0]
        return 2 * len(self.k) * k.shape[2] * k.shape[3] * k.element_size()

    def waste(self, lengths: list[int]) -> dict:
        """Memory reserved vs used when the rows hold sequences of these lengths."""
        reserved = len(lengths) * self.max_len * self.bytes_per_token()
        used = sum(lengths) * self.bytes_per_token()
        return {"reserved_bytes": reserved, "used_bytes": used,
                "wasted_fraction": 1 - used / reserved if reserved else 0.0}
