"""Lessons 03 and 08: attention over the KV memory.

    base.py            AttentionBackend: the seam a paged-attention backend implements
    core.py            masked attention and the causal mask: the maths, once
    no_cache.py        lesson 01's KV "cache": none
    paged.py           PagedStep (a step's layout) and the torch reference backend
    cpu_paged.py       decode by a C kernel reading blocks in place (CPU)
    triton_*.py        Triton kernels: decode, prefill, KV write (GPU; CPU under the interpreter)

The backends are registered by name in `minillm.utils.registry.ATTENTION_BACKENDS`:
`EngineConfig` validates `attention_backend` there, and the engine builds the one it names.
A new backend (a learner's, a GPU kernel) registers with `@ATTENTION_BACKENDS.register()`.
"""
from __future__ import annotations

import torch

from .core import causal_mask, masked_attention
from .cpu_paged import CPUPagedAttention, kernel_available
from .no_cache import NoCache
from .paged import TorchPagedAttention
from .triton_backend import TritonPagedAttention, interpreter_on     # imports triton only when built

from ..utils.registry import ATTENTION_BACKENDS
from .base import AttentionBackend


def backend_names() -> tuple[str, ...]:
    """What `attention_backend` accepts: "auto" and every registered name."""
    return ("auto", *ATTENTION_BACKENDS.names())


def make_backend(name: str, device: torch.device, dtype: torch.dtype):
    """"auto": the Triton kernels on a CUDA GPU when triton imports; on CPU the in-place C
    decode kernel for float32 and bfloat16 when it builds; else the torch reference (same tokens either
    way; the kernels are faster). A backend that cannot run here says why (`unusable_reason`)."""
    device = torch.device(device)
    if name == "auto":
        name = auto_backend(device, dtype)
    backend = ATTENTION_BACKENDS.get(name)        # a ValueError listing the known names
    reason = backend.unusable_reason(device, dtype)
    if reason:
        raise RuntimeError(f"attention_backend={name!r} cannot run here: {reason}")
    return backend()


def auto_backend(device: torch.device, dtype: torch.dtype) -> str:
    """What "auto" picks (on CUDA, Triton unless it is missing or set to interpret: slow there)."""
    if device.type == "cuda" and TritonPagedAttention.unusable_reason(device, dtype) is None \
            and not interpreter_on():
        return "triton"
    fast = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and kernel_available()
    return "cpu-kernel" if fast else "torch"


__all__ = ["ATTENTION_BACKENDS", "AttentionBackend", "CPUPagedAttention", "NoCache", "TorchPagedAttention", "TritonPagedAttention",
           "auto_backend", "backend_names", "causal_mask", "make_backend", "masked_attention"]
