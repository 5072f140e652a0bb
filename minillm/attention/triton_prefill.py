"""Prefill / chunked-prefill attention in Triton over the paged cache (read `triton_decode.py` first).

A step's flat batch holds, per sequence, a chunk of q_len new tokens: the last q_len of its
seq_len tokens (the first seq_len - q_len are already cached; their K/V and the chunk's own,
written just before, are all in the paged cache). Query i of the chunk sits at position
cached + i and sees keys 0 .. cached + i (causal). A decode row is a chunk of length 1, so
a mixed step (prompt chunks and decode rows) is one launch of this kernel.

One program = one sequence x one KV head x one tile of BLOCK_Q query tokens. As in the decode
kernel, the GROUP query heads that share the KV head are folded into the tile's rows
(row r is token r // GROUP, head r % GROUP): each K/V tile read from the cache serves all
of them. The loop over key tiles is flash attention's: scores by `tl.dot`, the causal mask,
the online softmax (running max m, sum l, acc), and out = acc / l at the end. It stops at
the tile's last query position: keys after it are masked for every row of the tile.

No split over the context here: a chunk has many queries, so there are programs enough.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_decode import dot_precision

BLOCK_N = 32    # keys per tile


def tile_rows(dtype: torch.dtype) -> int:
    """Rows (query tokens x group heads) per program: 64, or 32 in float32, so that the
    tiles fit a T4's 64 KB of shared memory at head_dim 128 (as `triton_decode.tile_tokens`)."""
    return 128 // dtype.itemsize


@triton.jit
def paged_prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_ptr,
                         seq_lens_ptr, scale, block_size,
                         stride_qn, stride_qh, stride_on, stride_oh, stride_kb, stride_ko, stride_kh,
                         stride_vb, stride_vo, stride_vh, stride_tb,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         PRECISION: tl.constexpr):
    seq, kv_head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    cached = seq_len - q_len                                  # tokens before this chunk

    r = tl.arange(0, BLOCK_M)
    local = tile * BLOCK_Q + r // GROUP                       # the row's token within the chunk
    heads = kv_head * GROUP + r % GROUP
    q_pos = cached + local
    dims = tl.arange(0, BLOCK_D)
    row_ok = (r < BLOCK_Q * GROUP) & (local < q_len)
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + (q_start + local)[:, None] * stride_qn + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    # causal: the tile's last query sees keys up to its own position; a tile past the chunk, none
    key_end = tl.minimum(seq_len, cached + (tile + 1) * BLOCK_Q)
    key_end = tl.where(tile * BLOCK_Q < q_len, key_end, 0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, key_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < key_end
        blocks = tl.load(block_tables_ptr + seq * stride_tb + keys // block_size, mask=key_ok, other=0)
        offsets = keys % block_size
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + blocks[:, None] * stride_kb + offsets[:, None] * stride_ko
                    + kv_head * stride_kh + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + blocks[:, None] * stride_vb + offsets[:, None] * stride_vo
                    + kv_head * stride_vh + dims[None, :], mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale      # [BLOCK_M, BLOCK_N]
        s = tl.where(key_ok[None, :] & (keys[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))        # finite: every row sees key 0 in the first tile
        rescale = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    l = tl.maximum(l, 1.0)          # l >= 1 after any tile (its max scores exp(0)); a dead tile: 0 / 1
    tl.store(out_ptr + (q_start + local)[:, None] * stride_on + heads[:, None] * stride_oh + dims[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  query_start: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int) -> torch.Tensor:
    """q [N, H, D]: sequence b's chunk is q[query_start[b] : query_start[b + 1]], the last
    tokens of its seq_lens[b]; it attends causally through block_tables[b]. Returns [N, H, D].
    max_query_len (a Python int the step already knows) sizes the grid: no host sync."""
    N, H, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "each head's D values must be contiguous"
    q = q if q.stride(2) == 1 else q.contiguous()
    group = H // Hkv
    block_m = max(tile_rows(k_cache.dtype), triton.next_power_of_2(group))
    block_q = block_m // group                                # query tokens per program
    out = torch.empty_like(q)
    grid = (seq_lens.shape[0], Hkv, triton.cdiv(max_query_len, block_q))
    paged_prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start, seq_lens, D ** -0.5, block_size,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_tables.stride(0),
        GROUP=group, HEAD_DIM=D, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        BLOCK_D=triton.next_power_of_2(D), PRECISION=dot_precision(k_cache.dtype))
    return out
