"""Tests of the grader of lesson 02 (minillm.checks.lesson02).

The reference passes it, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_contiguous_cache`.
"""
import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.attention.core import causal_mask, masked_attention
from minillm.kv.contiguous import ContiguousKVCache


# ---------------------------------------------------------------- lesson 02: contiguous KV cache

class _PlantedCache(ContiguousKVCache):
    """The reference attend with one knob per classic mistake."""
    shift, causal, use_row_ids, store_v, read_rows = 0, True, True, True, True

    def attend(self, layer_idx, q, k, v):
        B, T = self.positions.shape
        rows = (self.rows if self.use_row_ids else torch.arange(B))[:, None]
        self.k[layer_idx][rows, self.positions + self.shift] = k.view(B, T, *k.shape[1:])
        if self.store_v:
            self.v[layer_idx][rows, self.positions + self.shift] = v.view(B, T, *v.shape[1:])
        num_keys = int(self.positions.max()) + 1
        read = self.rows if self.read_rows else torch.arange(B)
        keys, values = self.k[layer_idx][read, :num_keys], self.v[layer_idx][read, :num_keys]
        mask = causal_mask(self.positions, num_keys)
        if not self.causal:
            mask = torch.ones_like(mask)
        out = masked_attention(q.view(B, T, *q.shape[1:]), keys, values, mask)
        return out.reshape(B * T, *q.shape[1:])


class CacheWritesAtPositionPlusOne(_PlantedCache):
    shift = 1


class CacheWithoutCausalMask(_PlantedCache):
    causal = False


class CacheMixesRows(_PlantedCache):
    use_row_ids = False


class CacheReadsWrongRows(_PlantedCache):
    read_rows = False


class CacheStoresOnlyK(_PlantedCache):
    store_v = False


class CacheSkeleton(ContiguousKVCache):
    def attend(self, layer_idx, q, k, v):
        raise NotImplementedError


def test_check_contiguous_cache_passes_reference():
    assert checks.check_contiguous_cache(ContiguousKVCache)


def test_check_contiguous_cache_passes_an_independent_class():
    class Mine:                                # no inheritance: duck typing is enough
        def __init__(self, num_layers, max_batch_size, max_len, num_kv_heads, head_dim, dtype, device):
            self.inner = ContiguousKVCache(num_layers, max_batch_size, max_len, num_kv_heads, head_dim,
                                           dtype, device)
            self.k, self.v = self.inner.k, self.inner.v

        @classmethod
        def for_model(cls, model, max_batch_size, max_len):
            c = model.config
            return cls(c.num_hidden_layers, max_batch_size, max_len, c.num_key_value_heads, c.head_dim,
                       model.dtype, model.device)

        def set_step(self, rows, start, num_tokens):
            self.inner.set_step(rows, start, num_tokens)
            self.positions = self.inner.positions

        def attend(self, layer_idx, q, k, v):
            return self.inner.attend(layer_idx, q, k, v)

    assert checks.check_contiguous_cache(Mine)


def test_check_contiguous_cache_passes_a_from_scratch_class():
    class Handwritten:                          # explicit softmax, one row at a time
        def __init__(self, num_layers, max_batch_size, max_len, num_kv_heads, head_dim, dtype, device):
            shape = (max_batch_size, max_len, num_kv_heads, head_dim)
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

        @classmethod
        def for_model(cls, model, max_batch_size, max_len):
            c = model.config
            return cls(c.num_hidden_layers, max_batch_size, max_len, c.num_key_value_heads, c.head_dim,
                       model.dtype, model.device)

        def set_step(self, rows, start, num_tokens):
            self.steps = [(r, s) for r, s in zip(rows, start)]
            self.T = num_tokens
            self.positions = torch.tensor([[s + t for t in range(num_tokens)] for s in start])

        def attend(self, layer_idx, q, k, v):
            out = torch.empty_like(q)
            groups = q.shape[1] // k.shape[1]
            for b, (row, s) in enumerate(self.steps):
                for t in range(self.T):
                    self.k[layer_idx][row, s + t] = k[b * self.T + t]
                    self.v[layer_idx][row, s + t] = v[b * self.T + t]
                for t in range(self.T):
                    keys = self.k[layer_idx][row, :s + t + 1].repeat_interleave(groups, dim=1)
                    values = self.v[layer_idx][row, :s + t + 1].repeat_interleave(groups, dim=1)
                    scores = torch.einsum("hd,lhd->hl", q[b * self.T + t], keys) / q.shape[-1] ** 0.5
                    out[b * self.T + t] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
            return out

    assert checks.check_contiguous_cache(Handwritten)


@pytest.mark.parametrize("bad, match", [
    (CacheWritesAtPositionPlusOne, r"sits at \(row, position\) \[\(1, 1\)\]"),
    (CacheWithoutCausalMask, "causal mask"),
    (CacheMixesRows, r"rows\[b\]"),
    (CacheReadsWrongRows, "differs from the reference"),
    (CacheStoresOnlyK, "store v as well"),
    (CacheSkeleton, "not implemented"),
], ids=["writes_at_position_plus_one", "without_causal_mask", "mixes_rows", "reads_wrong_rows",
        "stores_only_k", "skeleton"])
def test_check_contiguous_cache_rejects(bad, match):
    rejects(checks.check_contiguous_cache, bad, match)
