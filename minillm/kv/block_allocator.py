"""Lesson 03: a fixed pool of KV blocks, handed out and taken back by reference count.

The KV memory is cut into `num_blocks` blocks of `block_size` token slots each. A
sequence holds a list of block ids (its block table), so it grows one block at a
time and wastes at most one partly filled block, instead of reserving its maximum
length up front (lesson 02).

A block may be referenced by several sequences at once (a shared prefix, lesson
04), so it carries a reference count and returns to the free pool only when the
count reaches zero. The free pool is kept in the order blocks were freed: taking
from the front evicts the least recently used cached block first (lesson 04).
"""
from __future__ import annotations

from collections import OrderedDict


class NoFreeBlocksError(RuntimeError):
    """Raised when a block is requested from an empty pool; callers check first."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_blocks: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def allocate(self) -> int:
        """Take the least recently freed block; its reference count becomes 1."""
        if not self.free_blocks:
            raise NoFreeBlocksError(f"all {self.num_blocks} KV blocks are in use")
        block, _ = self.free_blocks.popitem(last=False)
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more holder of `block`. A free block (count 0, still holding cached KV)
        leaves the free pool: it is being reused."""
        self._check(block)
        if self.ref_counts[block] == 0:
            del self.free_blocks[block]
        self.ref_counts[block] += 1

    def free(self, block: int) -> None:
        """One holder fewer; at zero the block goes to the back of the free pool."""
        self._check(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"double free of block {block}: it is not allocated")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None

    def _check(self, block: int) -> None:
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}: ids run from 0 to {self.num_blocks - 1}")
