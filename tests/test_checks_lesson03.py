"""Tests of the graders of lesson 03 (minillm.checks.lesson03).

The reference passes each one, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_block_allocator`,
`pytest -k check_slot_mapping`.
"""
from collections import deque

import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.attention.paged import slot_mapping
from minillm.kv.block_allocator import BlockAllocator, NoFreeBlocksError


# ---------------------------------------------------------------- lesson 03: block allocator

class LeakyAllocator(BlockAllocator):
    """Counts down on free but never puts the block back in the pool."""
    def free(self, block):
        self._check(block)
        if self.ref_counts[block] == 0:
            raise ValueError("double free")
        self.ref_counts[block] -= 1


class StackAllocator(BlockAllocator):
    """Hands out the most recently freed block first (a stack, not a queue)."""
    def allocate(self):
        if not self.free_blocks:
            raise NoFreeBlocksError("empty")
        block, _ = self.free_blocks.popitem(last=True)
        self.ref_counts[block] = 1
        return block


class NoDoubleFreeCheck(BlockAllocator):
    def free(self, block):
        self._check(block)
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None


class AcceptsNegativeIds(BlockAllocator):
    def _check(self, block):
        if block >= self.num_blocks:
            raise ValueError(f"unknown block {block}")


class IncrefKeepsBlockInPool(BlockAllocator):
    def incref(self, block):
        self._check(block)
        self.ref_counts[block] += 1


class NumFreeMethod(BlockAllocator):
    def num_free(self):                                      # noqa: F811 -- a method, not a property
        return len(self.free_blocks)


class AssertsOnDoubleFree(BlockAllocator):
    def free(self, block):
        self._check(block)
        assert self.ref_counts[block] > 0, "double free"
        super().free(block)


class IndexErrorOnUnknownId(BlockAllocator):
    def _check(self, block):
        if block < 0:
            raise ValueError("negative")                    # but num_blocks itself -> IndexError from the list


class AcceptsBoolIds(BlockAllocator):
    """Checks the type and the range, but True is an int to Python: free(True) frees block 1."""
    def _check(self, block):
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}")


class AllocatorSkeleton(BlockAllocator):
    def allocate(self):
        raise NotImplementedError


def test_check_block_allocator_passes_reference(capsys):
    assert checks.check_block_allocator(BlockAllocator)
    assert "✅ check_block_allocator passed" in capsys.readouterr().out


def test_check_block_allocator_accepts_an_independent_allocator():
    class PoolEmpty(RuntimeError):
        pass

    class Mine:                                  # a deque and a dict, no inheritance
        def __init__(self, num_blocks):
            self.num_blocks = num_blocks
            self.ref_counts = {b: 0 for b in range(num_blocks)}
            self.pool = deque(range(num_blocks))

        @property
        def num_free(self):
            return len(self.pool)

        def _known(self, block):
            if isinstance(block, bool) or block not in self.ref_counts:    # True in {1: ...} is True
                raise ValueError(f"no block {block}")

        def allocate(self):
            if not self.pool:
                raise PoolEmpty("no free block")
            b = self.pool.popleft()
            self.ref_counts[b] = 1
            return b

        def incref(self, block):
            self._known(block)
            if self.ref_counts[block] == 0:
                self.pool.remove(block)
            self.ref_counts[block] += 1

        def free(self, block):
            self._known(block)
            if self.ref_counts[block] == 0:
                raise ValueError("double free")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.pool.append(block)

    assert checks.check_block_allocator(Mine)


@pytest.mark.parametrize("bad, match", [
    (LeakyAllocator, "put a block whose count reaches 0 back"),
    (StackAllocator, "least recently freed first"),
    (NoDoubleFreeCheck, "double free"),
    (AcceptsNegativeIds, r"free\(-1\)"),
    (IncrefKeepsBlockInPool, "take it out of the free pool"),
    (NumFreeMethod, "@property"),
    (AssertsOnDoubleFree, "assert"),
    (IndexErrorOnUnknownId, "raised IndexError"),
    (AcceptsBoolIds, r"free\(True\).*returned normally.*isinstance\(block, bool\)"),
    (AllocatorSkeleton, "not implemented"),
], ids=["leaks_on_free", "stack_not_queue", "no_double_free_check", "accepts_negative_ids",
        "incref_keeps_block_in_pool", "num_free_method", "asserts", "index_error", "accepts_bool_ids", "skeleton"])
def test_check_block_allocator_rejects(bad, match):
    rejects(checks.check_block_allocator, bad, match)


# ---------------------------------------------------------------- lesson 03: slot mapping

def slots_off_by_one(block_table, positions, block_size):
    return [s + 1 for s in slot_mapping(block_table, positions, block_size)]


def slots_ignore_table(block_table, positions, block_size):
    return [(p // block_size) * block_size + p % block_size for p in positions]


def slots_block_id_plus_offset(block_table, positions, block_size):
    return [block_table[p // block_size] + p % block_size for p in positions]


def slots_table_index_by_offset(block_table, positions, block_size):
    return [block_table[min(p % block_size, len(block_table) - 1)] * block_size + p // block_size
            for p in positions]


def slots_swapped_in_long_prompts(block_table, positions, block_size):
    """Right on every unit case (at most 12 positions), wrong for a longer prompt: only the engine run sees it."""
    slots = slot_mapping(block_table, positions, block_size)
    return slots if len(slots) <= 12 else slots[1:2] + slots[:1] + slots[2:]


def slots_skeleton(block_table, positions, block_size):
    raise NotImplementedError


def test_check_slot_mapping_passes_reference():
    assert checks.check_slot_mapping(slot_mapping)


def test_check_slot_mapping_accepts_a_tensor_version():
    def vectorised(block_table, positions, block_size):
        pos = torch.tensor(positions, dtype=torch.long)
        table = torch.tensor(block_table, dtype=torch.long)
        return table[pos // block_size] * block_size + pos % block_size
    assert checks.check_slot_mapping(vectorised)


@pytest.mark.parametrize("bad, match", [
    (slots_off_by_one, "off by one"),
    (slots_ignore_table, "positions themselves"),
    (slots_block_id_plus_offset, r"slot 7 \* 4 \+ 0 = 28, yours 7"),
    (slots_table_index_by_offset, r"p // block_size"),
    (slots_swapped_in_long_prompts, r"LLMEngine\(slot_mapping_fn=fn\) generated"),
    (slots_skeleton, "not implemented"),
], ids=["off_by_one", "ignores_table", "block_id_plus_offset", "table_index_by_offset", "wrong_in_the_engine",
        "skeleton"])
def test_check_slot_mapping_rejects(bad, match):
    rejects(checks.check_slot_mapping, bad, match)
