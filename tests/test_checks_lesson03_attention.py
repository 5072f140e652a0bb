"""Tests of lesson 03's paged-attention grader (minillm.checks.lesson03_attention).

The reference passes, an independent correct version passes, and the mistakes learners make
(blocks read in pool order, no causal mask, one key short, a query blind to its own key, a mask by
row instead of position,
only the first sequence of a flat batch) are each rejected with the hint that names them.
Addressable: `pytest -k check_paged_attention`.
"""
import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.attention.core import causal_mask, masked_attention
from minillm.attention.paged import TorchPagedAttention
from minillm.attention.per_sequence import paged_attention
from minillm.checks.lesson03_attention import check_paged_attention


def attention_with(q, k_cache, v_cache, step, num_keys, blocks_of, mask_positions, sequences=None):
    """paged_attention with each piece replaceable, to plant one mistake at a time."""
    block_size = k_cache.shape[1]
    out = torch.zeros_like(q)
    for b in range(len(step.query_starts) - 1) if sequences is None else sequences:
        s, e = step.query_starts[b], step.query_starts[b + 1]
        n = num_keys(int(step.seq_lens[b]))
        blocks = blocks_of(step, b, -(-n // block_size))
        keys, values = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]
        mask = mask_positions(step, s, e, n)
        out[s:e] = masked_attention(q[None, s:e], keys[None], values[None], mask)[0]
    return out


def own_blocks(step, b, k):
    return step.block_tables[b, :k]


def by_position(step, s, e, n):
    return causal_mask(step.positions[None, s:e], n)


def pool_order(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n, lambda step, b, k: torch.arange(k), by_position)


def no_mask(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n, own_blocks,
                          lambda step, s, e, n: torch.ones(1, e - s, n, dtype=torch.bool))


def one_key_short(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n - 1, own_blocks, by_position)


def strict_mask(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n, own_blocks,
                          lambda step, s, e, n: causal_mask(step.positions[None, s:e] - 1, n))


def mask_by_row(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n, own_blocks,
                          lambda step, s, e, n: causal_mask(torch.arange(e - s)[None], n))


def first_sequence_only(q, k, v, step):
    return attention_with(q, k, v, step, lambda n: n, own_blocks, by_position, sequences=[0])


def in_place(q, k, v, step):
    out = paged_attention(q, k, v, step)
    k.zero_()
    return out


def flattened(q, k, v, step):
    return paged_attention(q, k, v, step).flatten(1)


def skeleton(q, k, v, step):
    raise NotImplementedError("YOUR CODE HERE")


def test_reference_and_an_independent_version_pass():
    assert check_paged_attention(paged_attention)
    assert check_paged_attention(lambda q, k, v, step: TorchPagedAttention().forward(q, k, v, step))


def test_exported_with_the_lesson_graders():
    assert checks.check_paged_attention is check_paged_attention


@pytest.mark.parametrize("bad, match", [
    (pool_order, "pool order|block_tables\\[b\\]"),
    (no_mask, "mask with causal_mask"),
    (one_key_short, "one key short"),
    (strict_mask, "each query misses its own key"),
    (mask_by_row, "instead of using their positions"),
    (first_sequence_only, r"sequence 1, position"),
    (in_place, "changed q or the caches"),
    (flattened, "expected a tensor of q's shape"),
    (skeleton, "not implemented yet"),
], ids=lambda x: getattr(x, "__name__", ""))
def test_check_paged_attention_rejects(bad, match):
    rejects(check_paged_attention, bad, match)


def test_a_failed_check_leaves_no_backend_registered():
    from minillm.utils.registry import ATTENTION_BACKENDS

    def wrong_in_the_engine(q, k, v, step):
        out = paged_attention(q, k, v, step)
        return out * 0.5 if k.shape[-1] == 16 else out       # head_dim 16: the engine's tiny model only
    names = ATTENTION_BACKENDS.names()
    rejects(check_paged_attention, wrong_in_the_engine, "LLMEngine\\(attention_backend=yours")
    assert ATTENTION_BACKENDS.names() == names
