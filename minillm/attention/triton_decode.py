"""Paged decode attention in Triton: one query token per sequence, K/V read in place.

The torch reference gathers every block of every sequence into a padded tensor, then
attends. This kernel instead walks each sequence's block table, the way vLLM's paged
attention does: token j of a sequence lives in the cache at

    block = block_table[j // block_size],  offset = j % block_size

so a tile of BLOCK_N tokens is loaded straight from wherever its blocks happen to be.

Who does what (the launch grid is [sequences, kv heads, splits]):

  * One program = one sequence x one KV head x one split of the context. It handles
    the whole GROUP of query heads that share that KV head (GQA): the K/V tile is read
    once and used GROUP times. Decode is bound by the bytes it reads, not by its FLOPs,
    so reading K/V once per group (not once per query head) is the saving that matters.
    The group is padded to 16 rows so that q @ k^T is a `tl.dot` a GPU's tensor cores take.
  * Online softmax: scores of one tile at a time, never the whole row. Keep per query
    head a running max m, a running sum l of exp(score - m), and acc = sum exp(score - m) v.
    When a tile raises the max to m_new, everything so far is rescaled by exp(m - m_new):

        l   <- l   * exp(m - m_new) + sum_j exp(s_j - m_new)
        acc <- acc * exp(m - m_new) + sum_j exp(s_j - m_new) v_j

    and at the end softmax(s) v = acc / l.
  * Splits (flash-decoding): with a few sequences and few KV heads there are too few
    programs to fill a GPU's ~100 multiprocessors, and each walks a long context alone.
    So the context is cut into NUM_SPLITS ranges of split_tokens, one program each; every
    program writes its partial (m, l, acc), and `combine_splits` (a few torch ops) merges
    them with the same rescaling. With one split the program finishes the job itself
    (acc / l). The number of splits comes from shapes only (the batch, the block-table
    width), never from the step's lengths, so nothing waits for the GPU (no host sync)
    and the launch can be captured once in a CUDA graph. A split that starts past its
    sequence's length runs zero tiles and writes the neutral partial (m = -inf, l = 0, acc = 0).

Scores and sums are float32 whatever the cache holds (float16, bfloat16 or float32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64            # tokens per tile at 16 bits (float32: 32, see tile_tokens); a split is whole tiles
MIN_SPLIT_TOKENS = 256  # don't split finer than this: each program should have real work
MAX_SPLITS = 16
TARGET_PROGRAMS = 256   # enough programs for two waves on a ~100-SM GPU


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
                        part_max_ptr, part_sum_ptr, part_acc_ptr, scale, block_size, split_tokens,
                        stride_qb, stride_qh, stride_ob, stride_oh, stride_kb, stride_ko, stride_kh,
                        stride_vb, stride_vo, stride_vh, stride_tb,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                        BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        PRECISION: tl.constexpr):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_tokens                              # this program's range of tokens
    end = tl.minimum(start + split_tokens, seq_len)

    g = tl.arange(0, BLOCK_G)                                 # query heads of the group (padded)
    heads = kv_head * GROUP + g
    dims = tl.arange(0, BLOCK_D)
    head_ok, dim_ok = g < GROUP, dims < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)         # running max per query head
    l = tl.zeros([BLOCK_G], tl.float32)                       # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)            # running sum of exp(s - m) * v
    for tile in range(start, end, BLOCK_N):
        tokens = tile + tl.arange(0, BLOCK_N)
        ok = tokens < end
        # the block table says where each token is: block id, then the offset in the block
        blocks = tl.load(block_tables_ptr + seq * stride_tb + tokens // block_size, mask=ok, other=0)
        offsets = tokens % block_size
        kv_mask = ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + blocks[:, None] * stride_kb + offsets[:, None] * stride_ko
                    + kv_head * stride_kh + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + blocks[:, None] * stride_vb + offsets[:, None] * stride_vo
                    + kv_head * stride_vh + dims[None, :], mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale      # [BLOCK_G, BLOCK_N]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        rescale = tl.exp(m - m_new)                            # how much the old max was off
        p = tl.exp(s - m_new[:, None])
        l = l * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    if NUM_SPLITS == 1:                                       # the whole context: finish here
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])
    else:                                                     # a partial for combine_splits
        row = (seq * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS + split
        tl.store(part_max_ptr + row, m, mask=head_ok)
        tl.store(part_sum_ptr + row, l, mask=head_ok)
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=head_ok[:, None] & dim_ok[None, :])


def combine_splits(part_max: torch.Tensor, part_sum: torch.Tensor, part_acc: torch.Tensor) -> torch.Tensor:
    """Merge the splits' partials [B, H, S] (m, l) and [B, H, S, D] (acc) into [B, H, D]:
    rescale each split to the common max, then acc / l. An empty split (m = -inf) weighs 0.
    A few torch ops on small tensors, no host sync (they are captured in a CUDA graph too)."""
    weight = torch.exp(part_max - part_max.amax(dim=2, keepdim=True))
    return (part_acc * weight[..., None]).sum(2) / (part_sum * weight).sum(2)[..., None]


def num_splits_for(batch: int, num_kv_heads: int, max_tokens: int,
                   min_split_tokens: int = MIN_SPLIT_TOKENS) -> int:
    """How many programs share one sequence's context, from shapes only (no host sync):
    enough to reach TARGET_PROGRAMS, never fewer than min_split_tokens tokens each."""
    wanted = triton.cdiv(TARGET_PROGRAMS, batch * num_kv_heads)
    return max(1, min(MAX_SPLITS, wanted, triton.cdiv(max_tokens, min_split_tokens)))


def tile_tokens(dtype: torch.dtype) -> int:
    """Tokens per K/V tile: at head_dim 128 a K and a V tile take ~40 KB of shared memory on
    the GPU, within a T4's 64 KB (64 float32 tokens would need 72 KB: the launch would fail)."""
    return BLOCK_N * 2 // dtype.itemsize


def dot_precision(dtype: torch.dtype) -> str:
    """float32 caches multiply in full float32 ("ieee"): a GPU's default tf32 keeps 10
    mantissa bits and would flip greedy tokens against the float32 reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, num_splits: int | None = None,
                 min_split_tokens: int = MIN_SPLIT_TOKENS) -> torch.Tensor:
    """q [B, H, D], one token per sequence; sequence b attends to its first seq_lens[b]
    tokens through block_tables[b]. Caches [blocks, block_size, Hkv, D]. Returns [B, H, D].
    num_splits: fixed by the caller, or chosen from the shapes (`num_splits_for`)."""
    B, H, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "each head's D values must be contiguous"
    q = q if q.stride(2) == 1 else q.contiguous()
    max_tokens = block_tables.shape[1] * block_size          # the widest context the table can name
    num_splits = num_splits or num_splits_for(B, Hkv, max_tokens, min_split_tokens)
    split_tokens = triton.cdiv(triton.cdiv(max_tokens, num_splits), BLOCK_N) * BLOCK_N   # whole tiles
    out = torch.empty_like(q)
    part_max = part_sum = part_acc = out                     # not read when there is one split
    if num_splits > 1:
        part_max = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(B, H, num_splits, D, dtype=torch.float32, device=q.device)
    group = H // Hkv
    paged_decode_kernel[(B, Hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_max, part_sum, part_acc,
        D ** -0.5, block_size, split_tokens, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        GROUP=group, HEAD_DIM=D, NUM_SPLITS=num_splits, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=tile_tokens(k_cache.dtype), BLOCK_D=triton.next_power_of_2(D),
        PRECISION=dot_precision(k_cache.dtype))
    if num_splits > 1:
        out = combine_splits(part_max, part_sum, part_acc).to(q.dtype)
    return out
