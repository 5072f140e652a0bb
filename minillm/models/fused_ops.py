"""fused_ops.c from Python: RMSNorm, residual add + RMSNorm, and RoPE + K/V write, one call each.

Why: at decode a layer's elementwise work is tiny and its cost is the torch ops' dispatch
(RMSNorm alone is 7 ops, RoPE on q and k with the K/V write 16, SiLU * up with the split 5). `fused_layer.py` calls
these in CPU float32 steps; anywhere else (CUDA, other dtypes, no C compiler) it runs the torch ops.
Inside torch.compile the norms and SiLU * up stay these ops too (`in_graph`): inductor's loops for
them cost more than the C calls (a compiled w4a8 batch-1 step 8.6 -> 7.9 ms on a 2-core Xeon,
`python -m minillm.bench.step_profile --quantization w4a8 --compile --max-num-seqs 1`); RoPE + the
K/V write, which writes into the caches, is left to inductor (a mutating op in a graph is
functionalized, at the risk of a copy of the cache).

Each is a torch op, `torch.ops.minillm.rms_norm` etc., whose CPU kernel is utils/torch_ops.cpp's
C++ wrapper where it built (a cheaper call than ctypes), else the ctypes call below. The
wrappers return None when the kernel cannot take the inputs, and the caller then takes the
torch road, so a failed build never changes what the model computes.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..utils.c_kernels import FLOAT, INT, PTR, CKernel, define_op

KERNEL = CKernel(Path(__file__).with_name("fused_ops.c"), {
    "rms_norm": ([PTR, PTR, INT, INT, FLOAT, INT, PTR], None),
    "add_rms_norm": ([PTR, PTR, PTR, INT, INT, FLOAT, INT, PTR, PTR], None),
    "rope_write_kv": ([PTR] * 6 + [ctypes.c_int64] + [INT] * 5 + [PTR], INT),
    "silu_mul": ([PTR, INT, INT, INT, PTR], None),
})
__getattr__ = KERNEL.module_getattr(__name__)     # fused_ops.load_error: why it did not build


def rms_norm_ctypes(x, weight, eps):
    out, d = torch.empty_like(x), x.shape[-1]
    KERNEL.load().rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // d, d, eps, torch.get_num_threads(),
                           out.data_ptr())
    return out


def add_rms_norm_ctypes(x, delta, weight, eps):
    total, out, d = torch.empty_like(x), torch.empty_like(x), x.shape[-1]
    KERNEL.load().add_rms_norm(x.data_ptr(), delta.data_ptr(), weight.data_ptr(), x.numel() // d, d, eps,
                               torch.get_num_threads(), total.data_ptr(), out.data_ptr())
    return total, out


def rope_write_kv_ctypes(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads):
    n, head_dim = qkv.shape[0], k_cache.shape[-1]
    q = qkv.new_empty(n, num_heads, head_dim)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if KERNEL.load().rope_write_kv(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
                                   v_cache.data_ptr(), slots.data_ptr(), num_slots, n, num_heads, num_kv_heads,
                                   head_dim, torch.get_num_threads(), q.data_ptr()):
        raise IndexError(f"rope_write_kv: a slot is outside the cache's {num_slots} slots")
    return q


def silu_mul_ctypes(gate_up):
    n, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(n, width)
    KERNEL.load().silu_mul(gate_up.data_ptr(), n, width, torch.get_num_threads(), out.data_ptr())
    return out


define_op("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", rms_norm_ctypes,
          lambda x, weight, eps: torch.empty_like(x), KERNEL, "rms_norm")
define_op("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)", add_rms_norm_ctypes,
          lambda x, delta, weight, eps: (torch.empty_like(x), torch.empty_like(x)), KERNEL, "add_rms_norm")
define_op("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, "
          "int num_heads, int num_kv_heads) -> Tensor", rope_write_kv_ctypes,
          lambda qkv, cos, sin, k, v, slots, h, kv: qkv.new_empty(qkv.shape[0], h, k.shape[-1]),
          KERNEL, "rope_write_kv")
define_op("silu_mul(Tensor gate_up) -> Tensor", silu_mul_ctypes,
          lambda gate_up: gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2), KERNEL, "silu_mul")


def native(x: torch.Tensor, in_graph: bool = False) -> bool:
    """The common case, checked cheaply: the C++ ops are built and x is contiguous float32 on the CPU,
    eagerly (or inside torch.compile, `in_graph`). The C++ wrapper checks every other tensor itself
    (a clear ValueError, never a bad read)."""
    return (KERNEL.native and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and (in_graph or not torch.compiler.is_compiling()))


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels read contiguous float32 CPU memory, eagerly (torch.compile fuses on its own)."""
    return (not torch.compiler.is_compiling() and KERNEL.load() is not None
            and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm of x [..., D] by weight [D], or None (module doc)."""
    if native(x, in_graph=True):
        return torch.ops.minillm.rms_norm(x, weight, eps)
    if not usable(x, weight):
        return None
    return (torch.ops.minillm.rms_norm if KERNEL.native else rms_norm_ctypes)(x, weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(x + delta, RMSNorm(x + delta)) in one pass, or None (module doc)."""
    if native(x, in_graph=True):
        return torch.ops.minillm.add_rms_norm(x, delta, weight, eps)
    if not usable(x, delta, weight) or x.shape != delta.shape:
        return None
    return (torch.ops.minillm.add_rms_norm if KERNEL.native else add_rms_norm_ctypes)(x, delta, weight, eps)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slots: torch.Tensor, num_heads: int, num_kv_heads: int):
    """Rotated q [N, H, Dh] from the fused projection's qkv [N, (H + 2 Hkv) Dh], with rotated k
    and v written to their slots of the [blocks, block_size, Hkv, Dh] caches; or None."""
    if native(qkv):
        return torch.ops.minillm.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads)
    head_dim = k_cache.shape[-1]
    if not (usable(qkv, cos, sin, k_cache, v_cache) and slots.dtype == torch.long and slots.is_contiguous()
            and k_cache.shape == v_cache.shape and k_cache.shape[-2] == num_kv_heads
            and cos.numel() == sin.numel() == qkv.shape[0] * head_dim      # [N, Dh] or RotaryEmbedding's [N, 1, Dh]
            and qkv.shape[-1] == (num_heads + 2 * num_kv_heads) * head_dim):
        return None
    op = torch.ops.minillm.rope_write_kv if KERNEL.native else rope_write_kv_ctypes
    return op(qkv, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up from the fused projection's gate_up [N, 2 I] = gate | up, or None (module doc)."""
    if native(gate_up, in_graph=True):
        return torch.ops.minillm.silu_mul(gate_up)
    if not usable(gate_up) or gate_up.dim() != 2:
        return None
    return (torch.ops.minillm.silu_mul if KERNEL.native else silu_mul_ctypes)(gate_up)
