"""Attention backends: objects with `attend(layer_idx, q, k, v) -> out` that the model calls.

The paged backends are registered here by name, once: `EngineConfig` validates
`attention_backend` against this registry, and the engine builds the one it names.
A new backend (a learner's, a GPU kernel) adds one line to `ATTENTION_BACKENDS`.
"""
from __future__ import annotations

import torch

from .core import causal_mask, masked_attention
from .cpu_paged import CPUPagedAttention, kernel_available
from .no_cache import NoCache
from .paged import TorchPagedAttention

ATTENTION_BACKENDS = {cls.name: cls for cls in (TorchPagedAttention, CPUPagedAttention)}


def backend_names() -> tuple[str, ...]:
    """What `attention_backend` accepts: "auto" and every registered name."""
    return ("auto", *ATTENTION_BACKENDS)


def make_backend(name: str, device: torch.device, dtype: torch.dtype):
    """"auto": the in-place C decode kernel for float32 on CPU when it builds, else the
    torch reference (same tokens either way; the kernel is faster at decode)."""
    if name == "auto":
        fast = device.type == "cpu" and dtype == torch.float32 and kernel_available()
        name = "cpu-kernel" if fast else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {backend_names()}, got {name!r}")
    return ATTENTION_BACKENDS[name]()


__all__ = ["ATTENTION_BACKENDS", "CPUPagedAttention", "NoCache", "TorchPagedAttention", "backend_names",
           "causal_mask", "make_backend", "masked_attention"]
