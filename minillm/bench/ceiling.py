"""How close a run comes to the machine's compute ceiling.

The ceiling is measured, not looked up: a large float32 matmul in this process, on
this device, at this moment (so background load lowers ceiling and run alike). The
work is counted, not timed: the multiply-adds a perfect engine must do for the
workload, whatever padding or recomputation a real one adds on top.

    useful FLOPs = 2 * (params of the layers) * tokens fed       projections and MLP
                 + 4 * heads * head_dim * layers * (keys each fed token attends to)
                 + 2 * hidden * vocab * tokens sampled          the output head
"""
from __future__ import annotations

import time

import torch


@torch.inference_mode()
def matmul_flops_per_second(device="cpu", n: int = 1024, seconds: float = 1.0) -> float:
    """float32 [n, n] @ [n, n] repeated for about `seconds`: the practical compute ceiling."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b                                          # warm up (threads, caches, kernels)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
    return 2 * n ** 3 * count / (time.perf_counter() - start)


def workload_flops(config, workload: list[tuple[list[int], int]]) -> float:
    """Useful FLOPs of generating `output_len` tokens after each prompt (no prefix reuse)."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    total = 0.0
    for prompt, output_len in workload:
        fed = len(prompt) + output_len - 1          # the last sampled token is never fed back
        keys = fed * (fed + 1) / 2                  # token at position p attends to p + 1 keys
        total += 2 * per_layer * c.num_hidden_layers * fed
        total += 4 * q * c.num_hidden_layers * keys
        total += 2 * c.hidden_size * c.vocab_size * output_len
    return total
