"""A faster CPU backend: decode attention by a small C kernel that reads blocks in place.

Why: the torch reference gathers every sequence's blocks into a padded tensor before
attending. At decode, with a few dozen sequences of a few hundred tokens, that copy
and the padded attention after it took more time than all the model's matmuls
(measured: 40 sequences of ~300 tokens, SmolLM2 shapes, 2 cores: 5.7 ms per layer
gathered, 2.2 ms in place). `paged_attention.c` walks each query's block table
instead, the way a GPU paged-attention kernel does; read it next to this file.

Prefill chunks still go through the reference (gather + SDPA): there the work is
matmul-shaped and SDPA's blocked kernel beats a per-query loop.

The C file is compiled once with the system C compiler (`cc`, or $CC) into the
minillm cache and loaded with ctypes (`minillm/native.py`). No compiler, or not float32 on CPU: the
engine uses the torch reference, which gives the same tokens.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ..native import build
from .paged import TorchPagedAttention

SOURCE = Path(__file__).with_name("paged_attention.c")


@functools.cache
def load_kernel():
    """The compiled kernel as a ctypes function, or None (with the reason in `load_error`)."""
    global load_error
    lib, load_error = build(SOURCE)
    if lib is None:
        return None
    fn = lib.paged_attention
    P, I = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [P, P, P, P, P, P, I, I, I, I, I, I, ctypes.c_float, I, P]
    fn.restype = I
    return fn


load_error = ""


def kernel_available() -> bool:
    return load_kernel() is not None


class CPUPagedAttention(TorchPagedAttention):
    """The reference backend with its decode replaced by the in-place C kernel."""

    name = "cpu-kernel"

    def __init__(self):
        self.kernel = load_kernel()
        if self.kernel is None:
            raise RuntimeError(f"the CPU paged-attention kernel could not be built: {load_error}")
        self.row_ids = torch.arange(0)             # 0..B-1, grown on demand, shared by all layers

    def _rows(self, n: int) -> torch.Tensor:
        """Query b reads block-table row b; build that index once, not once per layer."""
        if self.row_ids.numel() < n:
            self.row_ids = torch.arange(max(n, 2 * self.row_ids.numel()), dtype=torch.long)
        return self.row_ids[:n]

    def decode(self, q, k_cache, v_cache, block_tables, positions):
        plain = all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                    for t in (k_cache, v_cache)) and q.device.type == "cpu" and q.dtype == torch.float32
        if not plain:                      # the kernel reads raw float32 memory: anything else goes the reference way
            return super().decode(q, k_cache, v_cache, block_tables, positions)
        q = q.contiguous()
        tables = block_tables.contiguous()
        positions = positions.contiguous()
        token_seq = self._rows(q.shape[0])
        out = torch.empty_like(q)
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        failed = self.kernel(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                             token_seq.data_ptr(), positions.data_ptr(), q.shape[0], q.shape[1],
                             num_kv_heads, head_dim, block_size, tables.shape[1], head_dim ** -0.5,
                             torch.get_num_threads(), out.data_ptr())
        if failed:
            raise MemoryError("paged attention kernel: out of memory for its score buffers")
        return out
