"""Megatron-style tensor parallelism: each rank holds a slice of every layer, and two
all-reduces per layer put the slices' results back together.

In one decoder layer, with N ranks:
  - q, k, v and gate, up are **column-parallel**: rank r holds rows r/N of the weight [out, in],
    so it computes its own heads (attention) or its own slice of the MLP's width from the full
    input, with no communication. Attention needs nothing from other ranks: a head's scores
    use only that head (and its KV head: rank r holds KV heads r/N, and the query heads that read
    them, so N must divide the number of KV heads).
  - o_proj and down_proj are **row-parallel**: rank r holds the columns that read its heads (its
    slice of the width) and produces a partial sum of the full output; one all-reduce adds the N
    partial sums. So each layer costs two all-reduces of [tokens, hidden_size] values.
  - The embedding is **vocab-parallel**: rank r holds rows r/N of the table; a token outside its
    rows gives zeros, and an all-reduce fills in every token. The head is vocab-parallel too:
    each rank scores its slice of the vocabulary, and an all-gather joins the slices (every rank
    gets the full logits, so a rank-side draft pass sees the same tokens everywhere).
Norms, RoPE and residuals are computed in full, identically, on every rank.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


def check_tensor_parallel_size(cfg, n: int) -> None:
    """Refuse a size that does not divide the KV heads (hence the heads) and the MLP width."""
    if n == 1:
        return
    widths = (cfg.num_key_value_heads, cfg.intermediate_size)
    if any(w % n for w in widths):
        fits = [d for d in range(1, cfg.num_key_value_heads + 1)
                if cfg.num_key_value_heads % d == 0 and cfg.intermediate_size % d == 0]
        raise ValueError(f"tensor_parallel_size={n} must divide the model's {cfg.num_key_value_heads} key/value heads "
                         f"({cfg.num_attention_heads} attention heads) and its MLP width {cfg.intermediate_size}: "
                         f"each rank holds whole KV heads; this model can use tensor_parallel_size in {fits}")


def column_shard(linear: nn.Linear, start: int, size: int) -> nn.Linear:
    """Output rows start .. start+size of `linear` (its bias too)."""
    out = nn.Linear(linear.in_features, size, bias=linear.bias is not None, device="meta")
    out.weight = nn.Parameter(linear.weight.detach()[start:start + size].clone(), requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias.detach()[start:start + size].clone(), requires_grad=False)
    return out


def row_shard(linear: nn.Linear, start: int, size: int) -> nn.Linear:
    """Input columns start .. start+size of `linear` (a bias would be added N times: refused)."""
    if linear.bias is not None:
        raise ValueError("a row-parallel linear with a bias is not supported (Llama-family o_proj and down_proj have none)")
    out = nn.Linear(size, linear.out_features, bias=False, device="meta")
    out.weight = nn.Parameter(linear.weight.detach()[:, start:start + size].contiguous(), requires_grad=False)
    return out


class RowParallelLinear(nn.Module):
    """This rank's columns of the weight, then one all-reduce: the sum of the ranks' partial outputs."""

    def __init__(self, linear: nn.Linear, group):
        super().__init__()
        self.linear, self.group = linear, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.linear(x))


class VocabParallelEmbedding(nn.Module):
    """Rows start .. start+len(weight) of the table; other tokens give zeros until the all-reduce."""

    def __init__(self, weight: torch.Tensor, start: int, group):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.group = start, group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return self.group.all_reduce(rows.masked_fill(~inside[:, None], 0))


class VocabParallelHead(nn.Module):
    """This rank's slice of the vocabulary scored, the slices gathered on every rank, padding cut."""

    def __init__(self, linear: nn.Linear, vocab_size: int, group):
        super().__init__()
        self.linear, self.vocab_size, self.group = linear, vocab_size, group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last_dim(self.linear(hidden))[..., :self.vocab_size]


def vocab_slice(weight: torch.Tensor, rank: int, n: int) -> tuple[torch.Tensor, int]:
    """Rank's rows of a [vocab, hidden] table, every slice ceil(vocab / n) rows (the last padded with zeros)."""
    per = -(-weight.shape[0] // n)
    start = rank * per
    part = weight.detach()[start:start + per]
    if part.shape[0] < per:
        part = torch.cat([part, part.new_zeros(per - part.shape[0], weight.shape[1])])
    return part.clone(), start


def shard_decoder_layer(layer, rank: int, n: int, group) -> None:
    """Replace one decoder layer's linears by rank's shards, in place (lesson 10's exercise):
    column-parallel q/k/v (rank's query heads and the KV heads they read, contiguous) and gate/up,
    row-parallel o_proj and down_proj each followed by the all-reduce, and the local head counts."""
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv_heads, d = attn.num_heads // n, attn.num_kv_heads // n, attn.head_dim
    width = mlp.gate_proj.out_features // n
    attn.q_proj = column_shard(attn.q_proj, rank * heads * d, heads * d)
    attn.k_proj = column_shard(attn.k_proj, rank * kv_heads * d, kv_heads * d)
    attn.v_proj = column_shard(attn.v_proj, rank * kv_heads * d, kv_heads * d)
    attn.o_proj = RowParallelLinear(row_shard(attn.o_proj, rank * heads * d, heads * d), group)
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    mlp.gate_proj = column_shard(mlp.gate_proj, rank * width, width)
    mlp.up_proj = column_shard(mlp.up_proj, rank * width, width)
    mlp.down_proj = RowParallelLinear(row_shard(mlp.down_proj, rank * width, width), group)


def shard_model(model, rank: int, n: int, group, shard_layer=shard_decoder_layer):
    """Replace `model`'s layers by rank's shards, in place (the model a worker was handed is its own).
    `shard_layer(layer, rank, n, group)` shards one decoder layer (a lesson passes the learner's)."""
    cfg = model.config
    check_tensor_parallel_size(cfg, n)
    for layer in model.model.layers:
        shard_layer(layer, rank, n, group)
    table, start = vocab_slice(model.model.embed_tokens.weight, rank, n)
    model.model.embed_tokens = VocabParallelEmbedding(table, start, group)
    head = nn.Linear(cfg.hidden_size, table.shape[0], bias=False, device="meta")
    head.weight = (model.model.embed_tokens.weight if cfg.tie_word_embeddings else
                   nn.Parameter(vocab_slice(model.lm_head.weight, rank, n)[0], requires_grad=False))
    model.lm_head = VocabParallelHead(head, cfg.vocab_size, group)
    model.config = dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // n,
                                       num_key_value_heads=cfg.num_key_value_heads // n,
                                       intermediate_size=cfg.intermediate_size // n)
    return model
