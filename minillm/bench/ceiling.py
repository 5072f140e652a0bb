"""How close a run comes to the machine's ceilings: compute, and memory bandwidth.

A ceiling is measured, not looked up: a large float32 matmul (or a large tensor's
sum, for bandwidth) in this process, on this device, at this moment (so background
load lowers ceiling and run alike). The
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
def matmul_flops_per_second(device="cpu", n: int = 1024, seconds: float = 1.0,
                            dtype: torch.dtype = torch.float32) -> float:
    """[n, n] @ [n, n] in `dtype` repeated for about `seconds`: the practical compute ceiling
    (on a GPU take n >= 4096 and the model's dtype: bf16 runs on tensor cores)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b                                          # warm up (threads, caches, kernels)
    _synchronize(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
        if count % 8 == 0:
            _synchronize(device)                   # a GPU queues work: time what it did, not what was asked
    _synchronize(device)
    return 2 * n ** 3 * count / (time.perf_counter() - start)


@torch.inference_mode()
def read_bandwidth_bytes_per_second(device="cpu", nbytes: int | None = None, seconds: float = 0.5) -> float:
    """Sum a tensor far larger than the caches (256 MiB on CPU, 1 GiB on a GPU, whose L2
    holds ~50 MB) for about `seconds`: the bytes per second a decode step can hope to read.
    A sum reads each byte once and writes nothing, like a matmul streaming its weights.
    The fastest pass counts: a ceiling is what the machine can do, and load only slows a pass."""
    device = torch.device(device)
    nbytes = nbytes or (2 ** 30 if device.type == "cuda" else 2 ** 28)
    x = torch.ones(nbytes // 4, device=device)
    x.sum()                                        # warm up: pages touched, kernels loaded
    _synchronize(device)
    fastest, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        begin = time.perf_counter()
        x.sum()
        _synchronize(device)
        fastest = min(fastest, time.perf_counter() - begin)
    return x.numel() * 4 / fastest


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def workload_flops(config, workload: list[tuple[list[int], int]]) -> float:
    """Useful FLOPs of generating `output_len` tokens after each prompt (no prefix reuse)."""
    c = config
    q = c.num_attention_heads * c.head_dim
    per_layer = layer_matmul_params(c)
    total = 0.0
    for prompt, output_len in workload:
        fed = len(prompt) + output_len - 1          # the last sampled token is never fed back
        keys = fed * (fed + 1) / 2                  # token at position p attends to p + 1 keys
        total += 2 * per_layer * c.num_hidden_layers * fed
        total += 4 * q * c.num_hidden_layers * keys
        total += 2 * c.hidden_size * c.vocab_size * output_len
    return total


def layer_matmul_params(c) -> int:
    """Weights one decoder layer multiplies each token by: q, k, v, o and the 3 MLP matrices."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
