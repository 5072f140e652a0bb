"""Write the step's K/V into the paged cache in Triton: what `paged.write_kv` does with index_copy_.

Token i's K/V [Hkv, D] go to slot slot_mapping[i], that is block slot // block_size, offset
slot % block_size of the layer's [blocks, block_size, Hkv, D] caches. A token's Hkv x D values
are one contiguous row, in k and in the cache, so one program copies a tile of BLOCK_T tokens
as BLOCK_T rows: a scatter of rows, bound by memory.
Why a kernel when index_copy_ does it: one launch for k and v together (it runs once per
layer per step) instead of two; vLLM's `reshape_and_cache` is the same idea in CUDA.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16    # tokens per program


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, num_tokens,
                    stride_k, stride_v, stride_k_slot, stride_v_slot,
                    ROW: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_ROW: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_ROW)                 # head h, dim d is column h * D + d
    token_ok = tokens < num_tokens
    mask = token_ok[:, None] & (cols[None, :] < ROW)
    slots = tl.load(slots_ptr + tokens, mask=token_ok, other=0)
    k = tl.load(k_ptr + tokens[:, None] * stride_k + cols[None, :], mask=mask)
    v = tl.load(v_ptr + tokens[:, None] * stride_v + cols[None, :], mask=mask)
    tl.store(k_cache_ptr + slots[:, None] * stride_k_slot + cols[None, :], k, mask=mask)
    tl.store(v_cache_ptr + slots[:, None] * stride_v_slot + cols[None, :], v, mask=mask)


def token_rows(t: torch.Tensor) -> torch.Tensor:
    """[N, Hkv, D] as N rows of Hkv * D contiguous values (a copy only if they are not)."""
    return t.reshape(t.shape[0], -1) if t.stride(2) == 1 and t.stride(1) == t.shape[2] else \
        t.contiguous().view(t.shape[0], -1)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store new K/V [N, Hkv, D] into their slots of the [blocks, block_size, Hkv, D] caches."""
    N, Hkv, D = k.shape
    if N == 0:
        return
    for cache in (k_cache, v_cache):       # a slot's [Hkv, D] contiguous, slots evenly strided
        assert cache.stride(3) == 1 and cache.stride(2) == D
        assert cache.stride(0) == cache.shape[1] * cache.stride(1)
    k, v = token_rows(k), token_rows(v)
    write_kv_kernel[(triton.cdiv(N, BLOCK_T),)](
        k, v, k_cache, v_cache, slots, N, k.stride(0), v.stride(0), k_cache.stride(1), v_cache.stride(1),
        ROW=Hkv * D, BLOCK_T=BLOCK_T, BLOCK_ROW=triton.next_power_of_2(Hkv * D))
