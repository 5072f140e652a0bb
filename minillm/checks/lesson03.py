"""Lesson 03's graders: `check_block_allocator` (distinct ids, reference counts, a pool
that hands out the least recently freed block first, bad calls refused without
changing anything) and `check_slot_mapping` (a position's physical slot through the
block table). Each piece then runs inside the real engine, plugged in through its seam
(`allocator_cls=`, `slot_mapping_fn=`); the allocator on a pool small enough to preempt,
since the paged engine relies on exactly these invariants.
"""
from __future__ import annotations

import torch

from .engine_runs import (AMPLE_POOL, GREEDY, PROMPTS, SMALL_POOL, compare_runs, drive, expect_no_leak,
                          make_engine, reference_run)
from .harness import Grader, expect, tiny_model, grader


ALLOWED_ERRORS = (ValueError, RuntimeError)     # what a refused allocator call may raise


def _ref_counts(allocator, blocks) -> list[int]:
    return [allocator.ref_counts[b] for b in blocks]


# ---------------------------------------------------------------- lesson 03: block allocator

def _expect_refused(g, call, doing: str, state, what: str, hint: str) -> None:
    """`call` must raise ValueError or RuntimeError and leave the allocator's state as it was."""
    g.cases += 1
    before = state()
    try:
        call()
    except NotImplementedError as e:
        raise AssertionError(f"{what} is not implemented yet (it raised NotImplementedError while {doing}): "
                             "fill in the exercise cell and run it again") from e
    except ALLOWED_ERRORS:
        pass
    except AssertionError as e:
        raise AssertionError(f"{what}: {doing} raised AssertionError ({e}); raise ValueError (or a "
                             "RuntimeError subclass) instead: `assert` disappears under python -O") from e
    except Exception as e:
        raise AssertionError(f"{what}: {doing} raised {type(e).__name__}: {e}; raise ValueError (or a "
                             f"RuntimeError subclass) with a clear message instead. {hint}") from e
    else:
        raise AssertionError(f"{what}: {doing} should raise an error (ValueError, or a RuntimeError subclass "
                             f"like NoFreeBlocksError) but returned normally. {hint}")
    expect(state() == before, f"{what}: {doing} raised, as it should, but changed the allocator first "
                              f"(num_free, ref_counts) {before} -> {state()}: check before you change anything")


@grader
def check_block_allocator(cls) -> bool:
    """cls(num_blocks), like `kv.block_allocator.BlockAllocator`: allocate() -> block id,
    incref(block), free(block), the `num_free` property, `num_blocks`, `ref_counts[block]`.

    Checks ids are distinct and in range, reference counts go up and down, a block
    returns to the pool only at count 0, the free pool is least recently freed first
    (never-used blocks before recently freed ones), incref of a free cached block takes
    it out of the pool, and that an empty pool, a double free and unknown ids (-1,
    num_blocks, and True: a bool is an int to Python) raise ValueError or RuntimeError
    without changing anything. Then the
    real engine with `allocator_cls=cls` on a pool small enough to preempt, plus a
    second batch reusing cached prefixes, gives the reference's greedy tokens and
    leaks no block.
    """
    g = Grader("check_block_allocator", "your allocator")
    N = 6
    with g.case(f"constructing cls({N})"):
        a = cls(N)

    def state():
        return a.num_free, tuple(a.ref_counts[b] for b in range(N))

    with g.case("reading num_free, num_blocks and ref_counts of a new allocator"):
        num_free, counts, num_blocks = a.num_free, state()[1], a.num_blocks
    expect(isinstance(num_free, int), f"num_free should be a number, got {type(num_free).__name__}: "
                                      "make it a @property that returns how many blocks are free")
    expect(num_blocks == N, f"cls({N}).num_blocks should be {N}, got {num_blocks!r}")
    expect(num_free == N and counts == (0,) * N,
           f"a new cls({N}) should have all {N} blocks free with ref count 0; got num_free={num_free}, "
           f"ref_counts={list(counts)}")

    # hand out everything
    got = []
    for i in range(N):
        with g.case(f"calling allocate() #{i + 1} on a pool of {N}"):
            got.append(a.allocate())
        expect(isinstance(got[-1], int) and 0 <= got[-1] < N,
               f"allocate() should return a block id in 0..{N - 1}, got {got[-1]!r}")
        expect(got[-1] not in got[:-1], f"allocate() handed out block {got[-1]} twice ({got}): take it out "
                                        "of the free pool when you hand it out")
        expect(a.ref_counts[got[-1]] == 1, f"a freshly allocated block has ref count 1; block {got[-1]} has "
                                           f"{a.ref_counts[got[-1]]}")
        expect(a.num_free == N - i - 1, f"after {i + 1} allocate() calls num_free should be {N - i - 1}, "
                                        f"got {a.num_free}")
    _expect_refused(g, a.allocate, f"allocate() on an empty pool ({N} of {N} blocks in use)", state,
                    "your allocator", "Callers check num_free first; running dry is a bug to report loudly.")

    # reference counts
    x, y, z = got[2], got[0], got[4]
    with g.case(f"calling incref({x}) twice, then free({x}) twice"):
        a.incref(x)
        a.incref(x)
        after_incref = (a.ref_counts[x], a.num_free)
        a.free(x)
        a.free(x)
    expect(after_incref == (3, 0), f"after allocate and two incref({x}), block {x} should have ref count 3 and "
                                   f"num_free stay 0; got ref count {after_incref[0]}, num_free {after_incref[1]}")
    expect(a.ref_counts[x] == 1 and a.num_free == 0,
           f"block {x} still has one holder after 3 holders freed it twice: ref count should be 1 and it must "
           f"not be free yet; got ref count {a.ref_counts[x]}, num_free {a.num_free}. A block goes back to "
           "the pool only when its count reaches 0")

    # LRU: least recently freed comes out first
    with g.case(f"freeing blocks {x}, {y}, {z} (in that order)"):
        for b in (x, y, z):
            a.free(b)
    expect(a.num_free == 3 and _ref_counts(a, (x, y, z)) == [0, 0, 0],
           f"after freeing blocks {x}, {y}, {z} (each held once), num_free should be 3 and their ref counts 0; "
           f"got num_free={a.num_free}, ref counts {_ref_counts(a, (x, y, z))}. free() must put a block whose "
           "count reaches 0 back in the free pool")
    _expect_refused(g, lambda: a.free(y), f"free({y}) of a block that is already free (a double free)", state,
                    "your allocator", "A double free is a bookkeeping bug elsewhere: refuse it.")
    with g.case("allocating the 3 free blocks again"):
        again = [a.allocate() for _ in range(3)]
    expect(again == [x, y, z],
           f"the blocks were freed in the order {[x, y, z]} but allocate() returned {again}: the free pool is "
           "least recently freed first (a queue, not a stack), so a freed block stays cached as long as "
           "possible. E.g. a collections.OrderedDict or deque: append on free, take from the front on allocate")

    # a freed block goes behind blocks that were never used
    with g.case(f"constructing cls({N}) and allocating 4 blocks"):
        a = cls(N)
        first4 = [a.allocate() for _ in range(4)]
        unused = set(range(N)) - set(first4)
    with g.case(f"freeing blocks {first4[2]} then {first4[0]}, then allocating 4 blocks"):
        a.free(first4[2])
        a.free(first4[0])
        order = [a.allocate() for _ in range(4)]
    expect(set(order[:2]) == unused and order[2:] == [first4[2], first4[0]],
           f"with blocks {sorted(unused)} never used and blocks {first4[2]}, {first4[0]} just freed (in that "
           f"order), allocate() should return {sorted(unused)} first (any order) and then {first4[2]}, "
           f"{first4[0]}; got {order}. A freed block goes to the BACK of the free pool")

    # incref of a free (cached) block takes it out of the pool
    with g.case(f"constructing cls({N}), allocating 3 blocks and freeing them"):
        a = cls(N)
        held = [a.allocate() for _ in range(3)]
        for b in held:
            a.free(b)
    reused = held[1]
    with g.case(f"calling incref({reused}) on a free block (ref count 0: a cached prefix being reused)"):
        a.incref(reused)
    expect(a.ref_counts[reused] == 1 and a.num_free == N - 1,
           f"incref({reused}) of a free block should make its ref count 1 and take it out of the free pool "
           f"(num_free {N} -> {N - 1}); got ref count {a.ref_counts[reused]}, num_free {a.num_free}. The "
           "prefix cache reuses freed blocks that still hold a prompt's KV this way")
    with g.case(f"allocating the other {N - 1} blocks"):
        rest = [a.allocate() for _ in range(N - 1)]
    expect(reused not in rest, f"allocate() handed out block {reused}, which incref() had taken back from the "
                               f"free pool (allocations: {rest}): remove it from the pool in incref()")

    # unknown ids
    for bad in (-1, N):
        _expect_refused(g, lambda: a.free(bad), f"free({bad}) on cls({N}) (ids are 0..{N - 1})", state,
                        "your allocator", "Check the id first: with a Python list, ref_counts[-1] silently "
                        "means the last block.")
        _expect_refused(g, lambda: a.incref(bad), f"incref({bad}) on cls({N}) (ids are 0..{N - 1})", state,
                        "your allocator", "Check the id first: with a Python list, ref_counts[-1] silently "
                        "means the last block.")
    # a bool is an int to Python (True == 1 and hashes like 1), never a block id
    for name, call in (("free", a.free), ("incref", a.incref)):
        _expect_refused(g, lambda: call(True), f"{name}(True) on cls({N}) (a bool, not a block id)", state,
                        "your allocator", "bool is a subclass of int: isinstance(True, int) holds, and "
                        "ref_counts[True] (or True in a dict of ids) is block 1. Refuse it with "
                        "isinstance(block, bool) in _check, before the range test.")

    # the real engine
    model, tokenizer = tiny_model()
    long_ids = tokenizer.encode(PROMPTS[2])
    second = [long_ids[:12] + tokenizer.encode(" a cat"), long_ids[:8] + tokenizer.encode(" Paris")]
    hint_stuck = "are blocks returned to the pool when their count reaches 0?"
    engine = make_engine(g, "allocator_cls=cls, num_kv_blocks=8, block_size=4", allocator_cls=cls, **SMALL_POOL)
    ours = drive(g, engine, PROMPTS, GREEDY, "allocator_cls=cls, 8 blocks: 5 prompts", hint_stuck)
    ours += drive(g, engine, second, GREEDY, "allocator_cls=cls, 8 blocks: 2 prompts sharing a prefix "
                                              "with the first batch", hint_stuck)
    reference = reference_run(PROMPTS, GREEDY, **AMPLE_POOL) + reference_run(second, GREEDY, **AMPLE_POOL)
    compare_runs(PROMPTS + second, ours, reference, "allocator_cls=cls, 8 blocks",
                 "the unit cases pass, so look at what the block manager relies on: a block handed out "
                 "must not be held by anyone else, and incref of a free block must take it out of the pool")
    expect_no_leak(engine, "allocator_cls=cls", "free() must return a block to the pool at count 0")
    return g.passed()


# ---------------------------------------------------------------- lesson 03: slot mapping

@grader
def check_slot_mapping(fn) -> bool:
    """fn(block_table, positions, block_size) -> slots, like `attention.paged.slot_mapping`:
    position p lives in slot block_table[p // block_size] * block_size + p % block_size.

    Cases: a whole prompt in one block, positions spanning several blocks of a table
    whose ids are not contiguous (nor sorted, block 0 included), a decode step (one
    position in the middle of a table), a chunk starting mid-block, block_size 1 and
    16, and no positions at all. A list or a 1-D tensor of ints is accepted. Then the real
    engine with `slot_mapping_fn=fn` gives the reference's greedy tokens.
    """
    from ..attention.paged import slot_mapping

    g = Grader("check_slot_mapping", "slot_mapping")
    cases = [
        ([7], [0, 1, 2], 4, "a 3-token prompt in block 7"),
        ([3, 0, 5], list(range(12)), 4, "12 positions over blocks [3, 0, 5]"),
        ([2, 6], [5], 4, "one decode position 5 with table [2, 6]"),
        ([1, 8, 3], [6, 7, 8, 9], 4, "a chunk at positions 6..9 starting mid-block, table [1, 8, 3]"),
        ([4, 2, 9], [0, 1, 2], 1, "block_size 1, table [4, 2, 9]"),
        ([11, 2], [14, 15, 16, 17], 16, "block_size 16, positions 14..17 across blocks [11, 2]"),
        ([5], [], 4, "no positions"),
    ]
    for table, positions, bs, label in cases:
        with g.case(f"computing slot_mapping({table}, {positions}, {bs}) ({label})"):
            out = fn(list(table), list(positions), bs)
            out = [int(s) for s in (out.tolist() if isinstance(out, torch.Tensor) else out)]
        expected = slot_mapping(table, positions, bs)
        expect(len(out) == len(expected), f"slot_mapping({table}, {positions}, {bs}) returned {len(out)} slots, "
                                          f"expected one per position ({len(expected)}). Case: {label}")
        if out == expected:
            continue
        i = next(j for j, (a, b) in enumerate(zip(out, expected)) if a != b)
        p = positions[i]
        if all(o == e + 1 for o, e in zip(out, expected)) or all(o == e - 1 for o, e in zip(out, expected)):
            mistake = "every slot is off by one; positions count from 0, and so do offsets in a block. "
        elif out == list(positions):
            mistake = "you returned the positions themselves: look the block up in the block table. "
        else:
            mistake = ""
        raise AssertionError(
            f"slot_mapping({table}, {positions}, block_size={bs}) returned {out}, expected {expected}. "
            f"{mistake}Position {p} is in the table's entry {p // bs} (p // block_size), i.e. block "
            f"{table[p // bs]}, at offset {p % bs} (p % block_size): slot {table[p // bs]} * {bs} + {p % bs} = "
            f"{expected[i]}, yours {out[i]}. Case: {label}")
    label = "slot_mapping_fn=fn"
    engine = make_engine(g, label, slot_mapping_fn=fn, **AMPLE_POOL)
    ours = drive(g, engine, PROMPTS, GREEDY, label, "the slot mapping does not decide who runs: report this")
    compare_runs(PROMPTS, ours, reference_run(PROMPTS, GREEDY, **AMPLE_POOL), label,
                 "the unit cases pass, so look at what the engine relies on: one slot per position, in order")
    return g.passed()
