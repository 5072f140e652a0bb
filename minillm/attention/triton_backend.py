"""The Triton backend: paged attention that reads (and writes) the blocks in place, on a GPU.

Three kernels behind the same `forward(q, k_cache, v_cache, step)` as the torch reference:

  triton_write.py    the step's K/V into their slots (`write`, called before `forward`)
  triton_decode.py   a pure decode step: one query per sequence, split over the context
  triton_prefill.py  any step with a prompt chunk: causal attention per chunk, decode rows
                     of a mixed step included (a chunk of one token)

Importing this module does not import triton: the kernels' modules are imported when the
backend is built, so `import minillm` works where triton is absent (a CPU-only install),
and so TRITON_INTERPRET is read then. Triton decides at a kernel's definition whether it
compiles it for the GPU or interprets it with numpy (TRITON_INTERPRET=1): on a CPU the
kernels run only under the interpreter, correct but slow, which is how the tests check them.
"""
from __future__ import annotations

import os
import sys

import torch

from .base import AttentionBackend
from .paged import PagedStep

GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KERNEL_MODULES = [f"{__package__}.triton_{name}" for name in ("decode", "prefill", "write")]


def triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not installed ({e}); `pip install triton` (Linux, or the test extra)"
    return None


def interpreter_on() -> bool:
    """Is TRITON_INTERPRET set, as triton reads it?"""
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except ImportError:                      # triton before 3.4 has no knobs
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def kernels_interpreted() -> bool | None:
    """Were the kernels defined for the interpreter (True), compiled (False), or not yet imported (None)?"""
    decode = sys.modules.get(KERNEL_MODULES[0])
    if decode is None:
        return None
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(decode.paged_decode_kernel, InterpretedFunction)


def interpreter_ready() -> bool:
    """Can Triton kernels run under the interpreter in this process? Triton's own library
    (tl.max, tl.sum) is defined when triton is imported, so TRITON_INTERPRET=1 must have been
    set before the first `import triton`, and before minillm's kernels were imported."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return interpreter_on() and isinstance(tl.max, InterpretedFunction) and kernels_interpreted() is not False


def unusable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton backend cannot run on this device and dtype, with the fix; None if it can."""
    device = torch.device(device)
    reason = triton_import_error()
    if reason:
        return reason
    if device.type == "cuda":
        if dtype not in GPU_DTYPES:
            return f"the Triton kernels take float16, bfloat16 or float32, not {dtype}"
        return None
    if device.type != "cpu":
        return f"Triton runs on CUDA GPUs (or on CPU under its interpreter), not on {device.type}"
    if not interpreter_on():
        return ("on a CPU, Triton kernels run only under Triton's interpreter: set TRITON_INTERPRET=1 "
                "before Python starts (slow, for checking the kernels), or use attention_backend='auto'")
    if not interpreter_ready():
        return ("triton (or minillm's Triton kernels) was imported before TRITON_INTERPRET=1 was set; "
                "set it before the first `import triton` (at the top of the notebook or script)")
    if dtype not in (torch.float32, torch.float16):
        return f"under the interpreter, float32 or float16 (its bfloat16 tl.dot is wrong), not {dtype}"
    return None


class TritonPagedAttention(AttentionBackend):
    """Paged attention by Triton kernels; `write` stores the step's K/V, `forward` attends.

    capture_safe: a decode step launches with grids and splits fixed by shapes (batch,
    block-table width), never by the step's lengths, and syncs nothing with the host, so it
    can be recorded in a CUDA graph (see cuda_graphs.py)."""

    name = "triton"
    capture_safe = True

    @classmethod
    def unusable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        return unusable_reason(device, dtype)

    def fixed_shape_decode(self, device, dtype):
        """Its own forward: grids fixed by shapes, no host sync (see capture_safe)."""
        return self.forward

    def __init__(self, min_split_tokens: int | None = None):
        """min_split_tokens: the fewest context tokens one decode program handles (see
        `triton_decode.num_splits_for`); None: the kernel's default."""
        reason = triton_import_error()
        if reason:
            raise RuntimeError(f"attention_backend='triton': {reason}")
        from . import triton_decode, triton_prefill, triton_write    # here, not at import (module doc)
        # the three launchers; a lesson swaps decode_kernel for one launching the learner's kernel
        self.decode_kernel, self.prefill_kernel = triton_decode.paged_decode, triton_prefill.paged_prefill
        self.write_kernel = triton_write.write_kv
        self.min_split_tokens = min_split_tokens or triton_decode.MIN_SPLIT_TOKENS

    def write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              slots: torch.Tensor) -> None:
        """Store new K/V [N, Hkv, D] into their slots of the caches (as `paged.write_kv`)."""
        self.write_kernel(k_cache, v_cache, k, v, slots)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                step: PagedStep) -> torch.Tensor:
        if step.max_query_len == 1:                   # pure decode: the split kernel
            return self.decode_kernel(q, k_cache, v_cache, step.block_tables, step.seq_lens,
                                      min_split_tokens=self.min_split_tokens)
        return self.prefill_kernel(q, k_cache, v_cache, step.block_tables, step.query_start,
                                   step.seq_lens, step.max_query_len)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The reference's decode seam: q [B, H, D] at positions [B] (sees positions + 1 keys)."""
        return self.decode_kernel(q, k_cache, v_cache, block_tables, positions + 1,
                                  min_split_tokens=self.min_split_tokens)
