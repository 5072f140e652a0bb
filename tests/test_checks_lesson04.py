"""Tests of the graders of lesson 04 (minillm.checks.lesson04_prefix_cache
and lesson04_copy_on_write).

The reference passes each one, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_block_hash`, `pytest -k check_prefix_cache`,
`pytest -k check_copy_on_write`.
"""
import hashlib

import pytest
from checks_support import rejects

from minillm import checks
from minillm.kv.block_manager import BlockManager, cdiv
from minillm.kv.prefix_cache import PrefixCache, block_hash


# ---------------------------------------------------------------- lesson 04: block hash

def hash_ignores_parent(parent, token_ids):
    return hashlib.sha256(repr(list(token_ids)).encode()).digest()


def hash_glues_digits(parent, token_ids):
    return hashlib.sha256((parent or b"") + "".join(map(str, token_ids)).encode()).digest()


def hash_by_identity(parent, token_ids):
    return hash((parent, id(token_ids)))


def hash_returns_none(parent, token_ids):
    return None


def hash_drops_last_token(parent, token_ids):
    return block_hash(parent, token_ids[:-1])


def test_check_block_hash_passes_reference():
    assert checks.check_block_hash(block_hash)


def test_check_block_hash_rejects_python_hash_even_of_a_tuple():
    # The lesson forbids hash(): str/bytes are salted per process, and on Python 3.11 even
    # hash(None), the first block's parent, changes from one process to the next.
    rejects(checks.check_block_hash, lambda parent, token_ids: hash((parent, tuple(token_ids))), "salted")


@pytest.mark.parametrize("bad, match", [
    (hash_ignores_parent, "include the parent"),
    (hash_glues_digits, r"\[1, 23\] and \[12, 3\]"),
    (hash_by_identity, "two equal lists"),
    (hash_returns_none, "returned None"),
    (hash_drops_last_token, r"\[1, 2, 3, 5\]"),
], ids=["ignores_parent", "glues_digits", "by_identity", "returns_none", "drops_last_token"])
def test_check_block_hash_rejects(bad, match):
    rejects(checks.check_block_hash, bad, match)


# ---------------------------------------------------------------- lesson 04: prefix cache

class CacheMatchesOutOfPrefix(PrefixCache):
    """Returns every cached block, skipping misses: a block is reused without its prefix."""
    def lookup(self, block_hashes):
        return [self.block_of[h] for h in block_hashes if h in self.block_of]


class CacheForgetDoesNothing(PrefixCache):
    def forget(self, block):
        pass


class CacheLastWriterWins(PrefixCache):
    def insert(self, h, block):
        self.forget(block)
        old = self.block_of.get(h)
        if old is not None:
            del self.hash_of[old]
        self.block_of[h] = block
        self.hash_of[block] = h


class CacheForgetRaises(PrefixCache):
    def forget(self, block):
        del self.block_of[self.hash_of.pop(block)]


class CacheHitRateMethod(PrefixCache):
    def hit_rate(self):                                      # noqa: F811 -- a method, not a property
        return self.hits / self.queries if self.queries else 0.0


class CacheHitRateCountsRecords(PrefixCache):
    """Averages per-record rates instead of tokens: 8/12 and 0/4 -> 0.33, not 0.5."""
    def __init__(self):
        super().__init__()
        self.rates = []

    def record(self, num_prompt_tokens, num_cached_tokens):
        super().record(num_prompt_tokens, num_cached_tokens)
        self.rates.append(num_cached_tokens / num_prompt_tokens)

    @property
    def hit_rate(self):
        return sum(self.rates) / len(self.rates) if self.rates else 0.0


class CacheSkeleton(PrefixCache):
    def lookup(self, block_hashes):
        raise NotImplementedError


def test_check_prefix_cache_passes_reference():
    assert checks.check_prefix_cache(PrefixCache)


def test_check_prefix_cache_accepts_an_independent_cache():
    class Mine:
        def __init__(self):
            self.entries = {}                     # hash -> block
            self.owner = {}                       # block -> hash
            self.asked = self.found = 0

        def lookup(self, block_hashes):
            out = []
            for h in block_hashes:
                if h not in self.entries:
                    return out
                out.append(self.entries[h])
            return out

        def insert(self, h, block):
            if h in self.entries or block in self.owner:
                return
            self.entries[h], self.owner[block] = block, h

        def forget(self, block):
            if block in self.owner:
                self.entries.pop(self.owner.pop(block))

        def record(self, num_prompt_tokens, num_cached_tokens):
            self.asked += num_prompt_tokens
            self.found += num_cached_tokens

        @property
        def hit_rate(self):
            return self.found / max(self.asked, 1)

    assert checks.check_prefix_cache(Mine)


@pytest.mark.parametrize("bad, match", [
    (CacheMatchesOutOfPrefix, "stop at the first miss"),
    (CacheForgetDoesNothing, "must drop that block's hash"),
    (CacheLastWriterWins, "first-writer-wins"),
    (CacheForgetRaises, r"KeyError(.|\n)*ignore blocks that name no prefix"),
    (CacheHitRateMethod, "@property"),
    (CacheHitRateCountsRecords, "8 / 16 = 0.5"),
    (CacheSkeleton, "not implemented"),
], ids=["matches_out_of_prefix", "forget_does_nothing", "last_writer_wins", "forget_raises",
        "hit_rate_method", "hit_rate_per_record", "skeleton"])
def test_check_prefix_cache_rejects(bad, match):
    rejects(checks.check_prefix_cache, bad, match)


# ---------------------------------------------------------------- lesson 04: copy-on-write

class _PlantedCoW(BlockManager):
    """The reference append_slots with one knob per classic mistake."""
    copy, free_shared, reversed_pair, copy_all_shared, fresh_block_via_allocator, queue = (
        True, True, False, False, False, True)

    def append_slots(self, seq, num_new_tokens=1):
        end = seq.num_computed_tokens + num_new_tokens
        first = 0 if self.copy_all_shared else seq.num_computed_tokens // self.block_size
        for i in range(first, min(len(seq.block_table), cdiv(end, self.block_size))):
            block = seq.block_table[i]
            if self.copy and self.allocator.ref_counts[block] > 1:
                new = self.allocator.allocate() if self.fresh_block_via_allocator else self._new_block()
                if self.queue:
                    self.ops.copies.append((new, block) if self.reversed_pair else (block, new))
                if self.free_shared:
                    self.allocator.free(block)
                seq.block_table[i] = new
        while len(seq.block_table) < cdiv(end, self.block_size):
            seq.block_table.append(self._new_block())


class CoWWritesIntoSharedBlock(_PlantedCoW):
    copy = False


class CoWKeepsSharedReference(_PlantedCoW):
    free_shared = False


class CoWReversedPair(_PlantedCoW):
    reversed_pair = True


class CoWCopiesEverySharedBlock(_PlantedCoW):
    copy_all_shared = True


class CoWTakesStaleCachedBlock(_PlantedCoW):
    fresh_block_via_allocator = True


class CoWForgetsToQueueCopy(_PlantedCoW):
    queue = False


class CoWOnlyForTheFirstSample(_PlantedCoW):
    """Right for sample 0 (every unit case), but samples 1..n-1 write into the shared block:
    only the engine run, with real siblings, can see it."""
    def append_slots(self, seq, num_new_tokens=1):
        self.copy = seq.index == 0
        super().append_slots(seq, num_new_tokens)


class CoWSkeleton(BlockManager):
    def append_slots(self, seq, num_new_tokens=1):
        raise NotImplementedError


def test_check_copy_on_write_passes_reference():
    assert checks.check_copy_on_write(BlockManager)


def test_check_copy_on_write_accepts_an_independent_append_slots():
    class Mine(BlockManager):
        def append_slots(self, seq, num_new_tokens=1):
            bs = self.block_size
            positions = range(seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens)
            for i in sorted({p // bs for p in positions}):
                if i == len(seq.block_table):
                    seq.block_table.append(self._new_block())
                elif self.allocator.ref_counts[seq.block_table[i]] > 1:
                    shared, private = seq.block_table[i], self._new_block()
                    self.allocator.free(shared)
                    self.ops.copies.append((shared, private))
                    seq.block_table[i] = private
    assert checks.check_copy_on_write(Mine)


@pytest.mark.parametrize("bad, match", [
    (CoWWritesIntoSharedBlock, "writes into block"),
    (CoWKeepsSharedReference, r"self.allocator.free\(shared_block\)"),
    (CoWReversedPair, r"\(src, dst\)"),
    (CoWCopiesEverySharedBlock, "not written by this step"),
    (CoWTakesStaleCachedBlock, "_new_block"),
    (CoWForgetsToQueueCopy, "did not queue the copy"),
    (CoWOnlyForTheFirstSample, r"LLMEngine\(block_manager_cls=cls, n=4 seeded sampling\) generated"),
    (CoWSkeleton, "not implemented"),
], ids=["writes_into_shared_block", "keeps_shared_reference", "reversed_pair", "copies_every_shared_block",
        "takes_stale_cached_block", "forgets_to_queue_copy", "only_for_the_first_sample", "skeleton"])
def test_check_copy_on_write_rejects(bad, match):
    rejects(checks.check_copy_on_write, bad, match)
