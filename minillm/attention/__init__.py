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
from .triton_backend import TritonPagedAttention, interpreter_on     # imports triton only when built

ATTENTION_BACKENDS = {cls.name: cls for cls in (TorchPagedAttention, CPUPagedAttention, TritonPagedAttention)}


def backend_names() -> tuple[str, ...]:
    """What `attention_backend` accepts: "auto" and every registered name."""
    return ("auto", *ATTENTION_BACKENDS)


def make_backend(name: str, device: torch.device, dtype: torch.dtype):
    """"auto": the Triton kernels on a CUDA GPU when triton imports; on CPU the in-place C
    decode kernel for float32 when it builds; else the torch reference (same tokens either
    way; the kernels are faster). A backend that cannot run here says why (`unusable_reason`)."""
    device = torch.device(device)
    if name == "auto":
        name = auto_backend(device, dtype)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {backend_names()}, got {name!r}")
    backend = ATTENTION_BACKENDS[name]
    check = getattr(backend, "unusable_reason", None)
    reason = check(device, dtype) if check else None
    if reason:
        raise RuntimeError(f"attention_backend={name!r} cannot run here: {reason}")
    return backend()


def auto_backend(device: torch.device, dtype: torch.dtype) -> str:
    """What "auto" picks (on CUDA, Triton unless it is missing or set to interpret: slow there)."""
    if device.type == "cuda" and TritonPagedAttention.unusable_reason(device, dtype) is None \
            and not interpreter_on():
        return "triton"
    fast = device.type == "cpu" and dtype == torch.float32 and kernel_available()
    return "cpu-kernel" if fast else "torch"


__all__ = ["ATTENTION_BACKENDS", "CPUPagedAttention", "NoCache", "TorchPagedAttention", "TritonPagedAttention",
           "auto_backend", "backend_names", "causal_mask", "make_backend", "masked_attention"]
