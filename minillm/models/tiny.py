"""Tiny random models built in-process from a config and a seed, for fast tests.

They share the embedded model's tokenizer (same vocab size), so text prompts work.
The init is scaled up from the usual 0.02 so that logits are well separated: with
near-uniform logits, float rounding would flip greedy argmaxes between two correct
implementations and tests would judge noise.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from .llama import LlamaForCausalLM

_COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               rms_norm_eps=1e-5, max_position_embeddings=4096, bos_token_id=1, eos_token_ids=[2])

TINY_CONFIGS = {
    "tiny-llama": ModelConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              rope_theta=10000.0, model_type="llama"),
    "tiny-qwen2": ModelConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              rope_theta=1000000.0, attention_bias=True, model_type="qwen2"),
    "tiny-qwen3": ModelConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                              rope_theta=1000000.0, qk_norm=True, tie_word_embeddings=True,
                              model_type="qwen3"),
}


def build_tiny(name: str, seed: int = 0) -> LlamaForCausalLM:
    cfg = TINY_CONFIGS[name]
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif pname.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif pname.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:   # linear layers: unit-variance outputs
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.mul_(3.0)   # logits with std ~3: ties are rare
    return model
