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
minillm cache and loaded with ctypes (`minillm/utils/c_kernels.py`); it is called as the op
`torch.ops.minillm.paged_decode_attention`, whose CPU kernel is C++ where that builds
(utils/native_ops.py: 4.9 vs 11.5 us a tiny call, quant/speed.py), else by ctypes. No compiler,
or neither float32 nor bfloat16 on CPU: the engine uses the torch reference, which gives the same
tokens.

A bfloat16 cache (`dtype="bfloat16"` on CPU) is read by the same loops, each block widened to
float32 as it is read (`paged_attention_bf16`: half the bytes a step, and no gather); the query
is widened and the output rounded back to bfloat16 around the call.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..utils.c_kernels import FLOAT, INT, PTR, CKernel, define_op
from .paged import TorchPagedAttention

# paged_attention(q, k_cache, v_cache, block_tables, positions: pointers; num_tokens .. max_blocks:
# six ints; scale, num_threads, out) -> nonzero when out of memory
# paged_attention_bf16: the same arguments, the caches bfloat16.
KERNEL = CKernel(Path(__file__).with_name("paged_attention.c"),
                 {"paged_attention": ([PTR] * 5 + [INT] * 6 + [FLOAT, INT, PTR], INT),
                  "paged_attention_bf16": ([PTR] * 5 + [INT] * 6 + [FLOAT, INT, PTR], INT)})
__getattr__ = KERNEL.module_getattr(__name__)     # cpu_paged.load_error: why it did not build


def load_kernel():
    """The compiled kernel as a ctypes function, or None (with the reason in `load_error`)."""
    return KERNEL.function("paged_attention")


def kernel_available() -> bool:
    return load_kernel() is not None


def run_kernel(kernel, q, k_cache, v_cache, block_tables, positions) -> torch.Tensor:
    """Call the C kernel with ctypes (the op's fallback where its C++ wrapper is not built): one
    query per row b, reading block-table row b up to positions[b]. A bfloat16 cache goes to
    paged_attention_bf16, with q widened to float32 and the output rounded back."""
    widen = k_cache.dtype == torch.bfloat16
    if widen:
        kernel = KERNEL.function("paged_attention_bf16")
    q, tables, positions = q.float().contiguous(), block_tables.contiguous(), positions.contiguous()
    out = torch.empty_like(q)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    failed = kernel(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                    positions.data_ptr(), q.shape[0], q.shape[1], num_kv_heads, head_dim, block_size,
                    tables.shape[1], head_dim ** -0.5, torch.get_num_threads(), out.data_ptr())
    if failed:
        raise MemoryError("paged attention kernel: out of memory for its score buffers")
    return out.bfloat16() if widen else out


# The kernel as a torch op, `torch.ops.minillm.paged_decode_attention(q, k_cache, v_cache,
# block_tables, positions)`, so a compiled decode step keeps it in its graph (one node per layer).
# Its CPU kernel is torch_ops.cpp's wrapper once KERNEL loads (utils/native_ops.py), else run_kernel.
define_op("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
          "Tensor positions) -> Tensor",
          lambda q, k, v, tables, positions: run_kernel(load_kernel(), q, k, v, tables, positions),
          lambda q, k, v, tables, positions: torch.empty_like(q), KERNEL, "paged_attention")


def attend(q, k_cache, v_cache, block_tables, positions) -> torch.Tensor:
    """The kernel, eager: the C++ op where it is built (a cheaper call than ctypes: quant/speed.py's
    per-call figures), else ctypes; always the op while compiling (one graph node)."""
    if KERNEL.native or torch.compiler.is_compiling():
        return torch.ops.minillm.paged_decode_attention(q, k_cache, v_cache, block_tables, positions)
    return run_kernel(load_kernel(), q, k_cache, v_cache, block_tables, positions)


class CPUPagedAttention(TorchPagedAttention):
    """The reference backend with its decode replaced by the in-place C kernel."""

    name = "cpu-kernel"

    def __init__(self):
        self.kernel = load_kernel()
        if self.kernel is None:
            raise RuntimeError(f"the CPU paged-attention kernel could not be built: {KERNEL.load_error}")

    @staticmethod
    def kernel_reads(q, k_cache, v_cache) -> bool:
        """The kernel reads raw contiguous float32 (or bfloat16: both caches and q) CPU memory:
        anything else goes the reference way."""
        return all(t.device.type == "cpu" for t in (q, k_cache, v_cache)) \
            and q.dtype == k_cache.dtype == v_cache.dtype and q.dtype in (torch.float32, torch.bfloat16) \
            and k_cache.is_contiguous() and v_cache.is_contiguous()

    @classmethod
    def unusable_reason(cls, device, dtype) -> str | None:
        if load_kernel() is None:
            return f"the CPU paged-attention kernel could not be built: {KERNEL.load_error}"
        return None

    def fixed_shape_decode(self, device, dtype):
        """The kernel as a torch op while compiling (one graph node), `attend` when eager; float32
        on CPU only."""
        if device.type != "cpu" or dtype != torch.float32:
            return None

        def cpu_kernel_decode(q, k_cache, v_cache, step):
            return attend(q, k_cache, v_cache, step.block_tables, step.positions)
        return cpu_kernel_decode

    def decode(self, q, k_cache, v_cache, block_tables, positions):
        if not self.kernel_reads(q, k_cache, v_cache):
            return super().decode(q, k_cache, v_cache, block_tables, positions)
        if k_cache.dtype == torch.bfloat16:          # ctypes: the op and its C++ wrapper are float32
            return run_kernel(self.kernel, q, k_cache, v_cache, block_tables, positions)
        return attend(q, k_cache, v_cache, block_tables, positions)
