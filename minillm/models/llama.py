"""The Llama-family forward pass, written out: RMSNorm, RoPE, GQA attention, SwiGLU.

One file reads like the architecture diagram. It covers Llama, SmolLM2, Mistral,
Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on q and k per head). Module names match
Hugging Face checkpoints, so a checkpoint's state dict loads with no renaming.

The seam the whole course turns on: the forward never stores keys and values
itself. Each layer hands this step's q, k, v to a `kv` object —
`kv.attend(layer_idx, q, k, v)` — which stores k/v wherever its memory scheme
says and returns the attention output. Lesson 01 passes "no cache", lesson 02 a
contiguous cache, lesson 03 a paged cache; this file never changes.

Tokens travel as one flat batch: `input_ids[N]` and `positions[N]`, where N is the
sum of the new tokens of every sequence in the step (the `kv` object knows which
token belongs to which sequence).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 like the reference."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """The rotation speed of each pair of dimensions, with optional long-context scaling."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    scaling = cfg.rope_scaling
    if not scaling:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "linear":            # positions squeezed by a constant factor
        return inv_freq / scaling["factor"]
    if kind == "llama3":            # low frequencies slowed, high kept, smooth in between
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(is_mid, mid, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: linear, llama3)")


class RotaryEmbedding(nn.Module):
    """cos/sin of each token's position, computed once per forward for all layers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inverse_frequencies(cfg), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]   # [N, D/2]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]        # [N, 1, D]
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + D/2) pair of x by its position's angle. x: [N, heads, D]."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)           # rotate_half(xf)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv):
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = kv.attend(self.layer_idx, q, k, v)          # [N, heads, head_dim]
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)

    def forward(self, input_ids, positions, kv):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions)
        for layer in self.layers:
            x = layer(x, cos, sin, kv)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """hidden = forward(input_ids[N], positions[N], kv); logits = compute_logits(hidden[rows])."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv) -> torch.Tensor:
        return self.model(input_ids, positions, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Only the rows that sample a token need logits: the vocab projection is the
        biggest single matmul of a small model, so never run it on every prompt token."""
        return self.lm_head(hidden).float()

    def use_column_major_weights(self) -> "LlamaForCausalLM":
        """Re-lay every projection weight [out, in] in memory as the transpose of a
        contiguous [in, out] tensor. Same values, shapes and state dict; only the byte
        order changes. Why: on CPU, F.linear reads weights laid out this way 1.5-3x faster
        at the small batch sizes of decode (measured here: [32, 576] x [576, 1536] took
        0.97 ms row-major, 0.42 ms column-major)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.data = module.weight.data.t().contiguous().t()
        return self

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device    # the embedding: never quantized (quant/)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype
