"""Lesson 03: the block allocator. Reference counts, the free pool, LRU reuse, clear errors."""
import pytest

from minillm.kv.block_allocator import BlockAllocator, NoFreeBlocksError


def snapshot(a: BlockAllocator):
    """Everything observable about an allocator: counts and the free pool in order."""
    return list(a.ref_counts), list(a.free_blocks), a.num_free


def test_fresh_pool_is_all_free_in_id_order():
    a = BlockAllocator(5)
    assert a.num_blocks == 5 and a.num_free == 5
    assert a.ref_counts == [0] * 5
    assert [a.allocate() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert a.num_free == 0 and a.ref_counts == [1] * 5


@pytest.mark.parametrize("bad", [0, -3])
def test_pool_needs_at_least_one_block(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(bad)


def test_allocate_free_and_ref_counts():
    a = BlockAllocator(4)
    b = a.allocate()
    assert a.ref_counts[b] == 1 and a.num_free == 3 and b not in a.free_blocks
    a.incref(b)
    a.incref(b)
    assert a.ref_counts[b] == 3 and a.num_free == 3
    a.free(b)
    a.free(b)
    assert a.ref_counts[b] == 1 and a.num_free == 3 and b not in a.free_blocks   # still held once
    a.free(b)
    assert a.ref_counts[b] == 0 and a.num_free == 4 and b in a.free_blocks
    assert sum(a.ref_counts) == 0


def test_double_free_raises_and_changes_nothing():
    a = BlockAllocator(4)
    x, y = a.allocate(), a.allocate()
    a.free(x)
    before = snapshot(a)
    with pytest.raises(ValueError, match=rf"double free of block {x}"):
        a.free(x)
    assert snapshot(a) == before
    never = 3                         # never handed out at all
    with pytest.raises(ValueError, match="double free"):
        a.free(never)
    assert snapshot(a) == before
    assert a.ref_counts[y] == 1


@pytest.mark.parametrize("bad", [-1, -4, 4, 100, "1", 1.0, None, 2.5])
def test_unknown_block_is_refused_by_free_and_incref(bad):
    a = BlockAllocator(4)
    held = a.allocate()
    a.incref(held)
    before = snapshot(a)
    with pytest.raises(ValueError, match="unknown block"):
        a.free(bad)
    assert snapshot(a) == before
    with pytest.raises(ValueError, match="unknown block"):
        a.incref(bad)
    assert snapshot(a) == before
    # a negative id must not wrap around to the last block (Python list indexing)
    assert a.ref_counts[-1] == 0 and a.ref_counts[held] == 2


def test_allocate_from_empty_pool_raises_and_changes_nothing():
    a = BlockAllocator(3)
    got = [a.allocate() for _ in range(3)]
    before = snapshot(a)
    with pytest.raises(NoFreeBlocksError, match="3 KV blocks"):
        a.allocate()
    assert snapshot(a) == before
    assert issubclass(NoFreeBlocksError, RuntimeError)
    a.free(got[1])                      # after a free, allocation works again
    assert a.allocate() == got[1]


def test_freed_blocks_come_back_least_recently_freed_first():
    a = BlockAllocator(6)
    blocks = [a.allocate() for _ in range(6)]
    for b in (4, 1, 5, 0):
        a.free(blocks[b])
    assert list(a.free_blocks) == [4, 1, 5, 0]
    assert [a.allocate() for _ in range(4)] == [4, 1, 5, 0]


def test_lru_order_uses_the_time_of_the_last_free():
    """A block freed, reused and freed again goes to the back: it was used recently."""
    a = BlockAllocator(3)
    x, y, z = (a.allocate() for _ in range(3))
    a.free(x)
    a.free(y)
    a.free(z)
    a.incref(x)              # x is reused (a prefix-cache hit) ...
    a.free(x)                # ... and freed again: now the most recently used
    assert list(a.free_blocks) == [y, z, x]
    assert [a.allocate() for _ in range(3)] == [y, z, x]


def test_free_of_a_shared_block_only_returns_it_at_zero():
    a = BlockAllocator(3)
    x = a.allocate()
    y = a.allocate()
    a.incref(x)
    a.free(y)          # y goes to the pool now ...
    a.free(x)          # ... x not yet (count 2 -> 1)
    assert list(a.free_blocks) == [2, y]
    a.free(x)
    assert list(a.free_blocks) == [2, y, x]


def test_incref_of_a_free_cached_block_takes_it_out_of_the_pool():
    a = BlockAllocator(4)
    blocks = [a.allocate() for _ in range(4)]
    for b in blocks:
        a.free(b)
    assert a.num_free == 4
    a.incref(2)                          # reuse a cached block whose count was 0
    assert a.ref_counts[2] == 1 and a.num_free == 3
    assert list(a.free_blocks) == [0, 1, 3]
    assert [a.allocate() for _ in range(3)] == [0, 1, 3]    # never handed out twice
    with pytest.raises(NoFreeBlocksError):
        a.allocate()
    a.incref(2)
    assert a.ref_counts == [1, 1, 2, 1]
