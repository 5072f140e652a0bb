"""Graders for lessons 03-06: paged KV blocks, prefix sharing, continuous batching, preemption.

Same contract as `minillm.checks` (and importable from there): each `check_*` takes your
function or class, with exactly the signature of the reference it replaces, runs it on
small deterministic cases, then plugs it into the real engine on the tiny random Llama.
It prints "✅ ... passed" and returns True, or raises AssertionError with a hint.

    from minillm.checks import check_block_allocator
    check_block_allocator(MyBlockAllocator)

| lesson | grader                 | your piece has the signature of                          |
|--------|------------------------|----------------------------------------------------------|
| 03     | check_block_allocator  | minillm.kv.block_allocator.BlockAllocator                |
| 03     | check_slot_mapping     | minillm.attention.paged.slot_mapping                     |
| 04     | check_block_hash       | minillm.kv.prefix_cache.block_hash                       |
| 04     | check_prefix_cache     | minillm.kv.prefix_cache.PrefixCache                      |
| 04     | check_copy_on_write    | a BlockManager subclass overriding append_slots          |
| 05     | check_scheduler        | a Scheduler subclass overriding schedule                 |
| 06     | check_preemption       | a Scheduler subclass overriding pick_victim / _preempt   |
| 06     | check_swap             | a BlockManager subclass overriding swap_out / swap_in    |

Engine runs go through `engine.step()` with a step limit, so a scheduler that never
schedules fails with a message instead of hanging the notebook.
"""
from __future__ import annotations

import itertools

import torch

from .checks import _expect, _Grader, _greedy_tie, _tiny_model
from .sampling import SamplingParams

__all__ = ["check_block_allocator", "check_slot_mapping", "check_block_hash", "check_prefix_cache",
           "check_copy_on_write", "check_scheduler", "check_preemption", "check_swap"]

ALLOWED_ERRORS = (ValueError, RuntimeError)     # what a refused allocator call may raise


# ---------------------------------------------------------------- shared helpers

# Prompts of 1, 5, 15, 4 and 7 tokens: with block_size 4 and 8 blocks, running them
# together for 8 tokens each forces preemption (the pool holds 32 slots).
_PROMPTS = ["Hi", "The capital of France is", "Once upon a time, in a small village by the sea, there lived",
            "List three colors:", "def f(x):\n    return"]
_GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
_SMALL_POOL = dict(num_kv_blocks=8, block_size=4, max_num_seqs=4)
_AMPLE_POOL = dict(num_kv_blocks=64, block_size=4)
_request_ids = itertools.count()


def _engine(g, label: str, **kwargs):
    from .engine import LLMEngine
    model, tokenizer = _tiny_model()
    with g.case(f"constructing LLMEngine({label})"):
        return LLMEngine(model, tokenizer, **kwargs)


def _drive(g, engine, prompts, params, label: str, stuck_hint: str, max_steps: int = 400):
    """Run prompts to the end with engine.step(); fail (not hang) if they never finish."""
    ids, final = [], {}
    with g.case(f"running LLMEngine({label})"):
        for p in prompts:
            ids.append(f"check-{next(_request_ids)}")
            engine.add_request(ids[-1], p, params)
        for _ in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out
    if engine.has_unfinished_requests():
        s, bm = engine.scheduler, engine.block_manager
        raise AssertionError(
            f"LLMEngine({label}) did not finish {len(prompts)} short requests in {max_steps} steps "
            f"({len(s.waiting)} waiting, {len(s.running)} running, {len(s.swapped)} swapped, "
            f"{bm.num_free_blocks} of {bm.allocator.num_blocks} blocks free): {stuck_hint}")
    return [final[r] for r in ids]


_REFERENCE_RUNS: dict = {}


def _reference_run(prompts, params, **options):
    """The reference engine's outputs for the same prompts (no learner class involved),
    computed once per session: they are deterministic and several graders share them."""
    key = (repr(prompts), repr(params), repr(sorted(options.items())))
    if key not in _REFERENCE_RUNS:
        g = _Grader("reference", "the reference engine")
        _REFERENCE_RUNS[key] = _drive(g, _engine(g, "reference", **options), prompts, params, "reference",
                                      "reference bug")
    return _REFERENCE_RUNS[key]


def _compare_runs(prompts, ours, reference, label: str, hint: str, greedy: bool = True) -> None:
    """Same tokens as the reference run; for greedy decoding a float-rounding tie at the first
    difference is accepted (the course's rule, see DESIGN.md)."""
    model, _ = _tiny_model()
    for prompt, a, b in zip(prompts, ours, reference):
        _expect(len(a.outputs) == len(b.outputs), f"LLMEngine({label}) returned {len(a.outputs)} samples for "
                                                  f"{_short(prompt)}, expected {len(b.outputs)}")
        for ca, cb in zip(a.outputs, b.outputs):
            mine, ref = list(ca.token_ids), list(cb.token_ids)
            if mine == ref:
                continue
            if greedy and _greedy_tie(model, list(b.prompt_token_ids), mine, ref):
                continue
            which = f" (sample {ca.index})" if len(a.outputs) > 1 else ""
            raise AssertionError(f"LLMEngine({label}) generated {mine} for {_short(prompt)}{which}; the reference "
                                 f"gives {ref}: {hint}")


def _short(prompt) -> str:
    if isinstance(prompt, str):
        return repr(prompt if len(prompt) < 40 else prompt[:37] + "...")
    return f"a {len(prompt)}-token prompt"


def _expect_no_leak(engine, label: str, hint: str) -> None:
    bm = engine.block_manager
    for name, a in (("device", bm.allocator), ("CPU", bm.cpu_allocator)):
        if a is None:
            continue
        held = [b for b in range(a.num_blocks) if a.ref_counts[b] != 0]
        _expect(not held and a.num_free == a.num_blocks,
                f"after LLMEngine({label}) finished every request, {name} blocks are leaked: num_free is "
                f"{a.num_free} of {a.num_blocks}, ref counts not 0 at blocks {held[:8]}: {hint}")


def _ref_counts(allocator, blocks) -> list[int]:
    return [allocator.ref_counts[b] for b in blocks]


class _Seqs:
    """Deterministic Sequences for driving a BlockManager or a Scheduler without a model."""

    def __init__(self):
        self.ids = itertools.count()

    def new(self, prompt, max_tokens: int = 16, priority: int = 0, arrival: float | None = None, output=()):
        from .sequence import Sequence
        i = next(self.ids)
        return Sequence(i, f"r{i}", list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens),
                        output_token_ids=list(output), priority=priority,
                        arrival=float(i) if arrival is None else arrival)


def _computed(bm, seq, outputs=()) -> None:
    """Allocate `seq` and run it like the engine would: its prompt computed, then one decode
    step per output token but the last (which waits for the next step, as in a running decode)."""
    bm.allocate(seq)
    bm.append_slots(seq, seq.num_uncomputed_tokens)
    bm.mark_computed(seq, seq.num_uncomputed_tokens)
    for i, t in enumerate(outputs):
        seq.output_token_ids.append(t)
        if i < len(outputs) - 1:
            bm.append_slots(seq, 1)
            bm.mark_computed(seq, 1)
    bm.take_ops()


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
    _expect(state() == before, f"{what}: {doing} raised, as it should, but changed the allocator first "
                               f"(num_free, ref_counts) {before} -> {state()}: check before you change anything")


def check_block_allocator(cls) -> bool:
    """cls(num_blocks), like `kv.block_allocator.BlockAllocator`: allocate() -> block id,
    incref(block), free(block), the `num_free` property, `num_blocks`, `ref_counts[block]`.

    Checks ids are distinct and in range, reference counts go up and down, a block
    returns to the pool only at count 0, the free pool is least recently freed first
    (never-used blocks before recently freed ones), incref of a free cached block takes
    it out of the pool, and that an empty pool, a double free and unknown ids (-1,
    num_blocks) raise ValueError or RuntimeError without changing anything. Then the
    real engine with `allocator_cls=cls` on a pool small enough to preempt, plus a
    second batch reusing cached prefixes, gives the reference's greedy tokens and
    leaks no block.
    """
    g = _Grader("check_block_allocator", "your allocator")
    N = 6
    with g.case(f"constructing cls({N})"):
        a = cls(N)

    def state():
        return a.num_free, tuple(a.ref_counts[b] for b in range(N))

    with g.case("reading num_free, num_blocks and ref_counts of a new allocator"):
        num_free, counts, num_blocks = a.num_free, state()[1], a.num_blocks
    _expect(isinstance(num_free, int), f"num_free should be a number, got {type(num_free).__name__}: "
                                       "make it a @property that returns how many blocks are free")
    _expect(num_blocks == N, f"cls({N}).num_blocks should be {N}, got {num_blocks!r}")
    _expect(num_free == N and counts == (0,) * N,
            f"a new cls({N}) should have all {N} blocks free with ref count 0; got num_free={num_free}, "
            f"ref_counts={list(counts)}")

    # hand out everything
    got = []
    for i in range(N):
        with g.case(f"calling allocate() #{i + 1} on a pool of {N}"):
            got.append(a.allocate())
        _expect(isinstance(got[-1], int) and 0 <= got[-1] < N,
                f"allocate() should return a block id in 0..{N - 1}, got {got[-1]!r}")
        _expect(got[-1] not in got[:-1], f"allocate() handed out block {got[-1]} twice ({got}): take it out "
                                         "of the free pool when you hand it out")
        _expect(a.ref_counts[got[-1]] == 1, f"a freshly allocated block has ref count 1; block {got[-1]} has "
                                            f"{a.ref_counts[got[-1]]}")
        _expect(a.num_free == N - i - 1, f"after {i + 1} allocate() calls num_free should be {N - i - 1}, "
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
    _expect(after_incref == (3, 0), f"after allocate and two incref({x}), block {x} should have ref count 3 and "
                                    f"num_free stay 0; got ref count {after_incref[0]}, num_free {after_incref[1]}")
    _expect(a.ref_counts[x] == 1 and a.num_free == 0,
            f"block {x} still has one holder after 3 holders freed it twice: ref count should be 1 and it must "
            f"not be free yet; got ref count {a.ref_counts[x]}, num_free {a.num_free}. A block goes back to "
            "the pool only when its count reaches 0")

    # LRU: least recently freed comes out first
    with g.case(f"freeing blocks {x}, {y}, {z} (in that order)"):
        for b in (x, y, z):
            a.free(b)
    _expect(a.num_free == 3 and _ref_counts(a, (x, y, z)) == [0, 0, 0],
            f"after freeing blocks {x}, {y}, {z} (each held once), num_free should be 3 and their ref counts 0; "
            f"got num_free={a.num_free}, ref counts {_ref_counts(a, (x, y, z))}. free() must put a block whose "
            "count reaches 0 back in the free pool")
    _expect_refused(g, lambda: a.free(y), f"free({y}) of a block that is already free (a double free)", state,
                    "your allocator", "A double free is a bookkeeping bug elsewhere: refuse it.")
    with g.case("allocating the 3 free blocks again"):
        again = [a.allocate() for _ in range(3)]
    _expect(again == [x, y, z],
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
    _expect(set(order[:2]) == unused and order[2:] == [first4[2], first4[0]],
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
    _expect(a.ref_counts[reused] == 1 and a.num_free == N - 1,
            f"incref({reused}) of a free block should make its ref count 1 and take it out of the free pool "
            f"(num_free {N} -> {N - 1}); got ref count {a.ref_counts[reused]}, num_free {a.num_free}. The "
            "prefix cache reuses freed blocks that still hold a prompt's KV this way")
    with g.case(f"allocating the other {N - 1} blocks"):
        rest = [a.allocate() for _ in range(N - 1)]
    _expect(reused not in rest, f"allocate() handed out block {reused}, which incref() had taken back from the "
                                f"free pool (allocations: {rest}): remove it from the pool in incref()")

    # unknown ids
    for bad in (-1, N):
        _expect_refused(g, lambda: a.free(bad), f"free({bad}) on cls({N}) (ids are 0..{N - 1})", state,
                        "your allocator", "Check the id first: with a Python list, ref_counts[-1] silently "
                        "means the last block.")
        _expect_refused(g, lambda: a.incref(bad), f"incref({bad}) on cls({N}) (ids are 0..{N - 1})", state,
                        "your allocator", "Check the id first: with a Python list, ref_counts[-1] silently "
                        "means the last block.")

    # the real engine
    model, tokenizer = _tiny_model()
    long_ids = tokenizer.encode(_PROMPTS[2])
    second = [long_ids[:12] + tokenizer.encode(" a cat"), long_ids[:8] + tokenizer.encode(" Paris")]
    hint_stuck = "are blocks returned to the pool when their count reaches 0?"
    engine = _engine(g, "allocator_cls=cls, num_kv_blocks=8, block_size=4", allocator_cls=cls, **_SMALL_POOL)
    ours = _drive(g, engine, _PROMPTS, _GREEDY, "allocator_cls=cls, 8 blocks: 5 prompts", hint_stuck)
    ours += _drive(g, engine, second, _GREEDY, "allocator_cls=cls, 8 blocks: 2 prompts sharing a prefix "
                                              "with the first batch", hint_stuck)
    reference = _reference_run(_PROMPTS, _GREEDY, **_AMPLE_POOL) + _reference_run(second, _GREEDY, **_AMPLE_POOL)
    _compare_runs(_PROMPTS + second, ours, reference, "allocator_cls=cls, 8 blocks",
                  "the unit cases pass, so look at what the block manager relies on: a block handed out "
                  "must not be held by anyone else, and incref of a free block must take it out of the pool")
    _expect_no_leak(engine, "allocator_cls=cls", "free() must return a block to the pool at count 0")
    return g.passed()


# ---------------------------------------------------------------- lesson 03: slot mapping

def check_slot_mapping(fn) -> bool:
    """fn(block_table, positions, block_size) -> slots, like `attention.paged.slot_mapping`:
    position p lives in slot block_table[p // block_size] * block_size + p % block_size.

    Cases: a whole prompt in one block, positions spanning several blocks of a table
    whose ids are not contiguous (nor sorted, block 0 included), a decode step (one
    position in the middle of a table), a chunk starting mid-block, block_size 1 and
    16, and no positions at all. A list or a 1-D tensor of ints is accepted.
    """
    from .attention.paged import slot_mapping

    g = _Grader("check_slot_mapping", "slot_mapping")
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
        _expect(len(out) == len(expected), f"slot_mapping({table}, {positions}, {bs}) returned {len(out)} slots, "
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
    return g.passed()


# ---------------------------------------------------------------- lesson 04: block hash

def check_block_hash(fn) -> bool:
    """fn(parent, token_ids) -> hash, like `kv.prefix_cache.block_hash` (parent is None for a
    prompt's first block, else the previous block's hash).

    Checks the hash is hashable and deterministic (equal lists, fresh objects, same
    hash), depends on every token and their order, on where the numbers split
    ([1, 23] vs [12, 3]), and on the parent: the same tokens after a different prefix
    (or as a first block) hash differently, so two prompts that share block 1 but not
    block 0 share no hash.
    """
    g = _Grader("check_block_hash", "block_hash")

    def chain(blocks):
        hashes, parent = [], None
        for block in blocks:
            with g.case(f"hashing block {block} after parent {'None' if parent is None else 'hash'}"):
                parent = fn(parent, list(block))
            hashes.append(parent)
        return hashes

    first = chain([[1, 2, 3, 4]])[0]
    with g.case("using the hash as a dict key"):
        {first: 0}
    _expect(first is not None, "block_hash returned None: return a hash (bytes from hashlib, or an int)")
    _expect(chain([[1, 2, 3, 4]])[0] == first,
            "block_hash(None, [1, 2, 3, 4]) gave different hashes for two equal lists: hash the token "
            "values, never id() or a random salt")
    distinct = {
        "[1, 2, 3, 4] and [1, 2, 3, 5]": ([1, 2, 3, 4], [1, 2, 3, 5]),
        "[1, 2, 3, 4] and [2, 1, 3, 4] (the order matters)": ([1, 2, 3, 4], [2, 1, 3, 4]),
        "[1, 23] and [12, 3] (don't glue the digits into one string)": ([1, 23], [12, 3]),
    }
    for label, (u, v) in distinct.items():
        hu, hv = chain([u])[0], chain([v])[0]
        _expect(hu != hv, f"block_hash(None, ...) gave the same hash for {label}: hash every token id, in order")
    a = chain([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = chain([[9, 9, 9, 9], [5, 6, 7, 8]])
    _expect(a[1] != b[1],
            "two prompts that share block 1 ([5, 6, 7, 8]) but not block 0 got the same hash for block 1: the "
            "hash must include the parent (the previous block's hash), so equal hashes mean equal whole "
            "prefixes; block 1's keys were computed attending to block 0")
    lone = chain([[5, 6, 7, 8]])[0]
    _expect(lone != a[1], "block_hash(None, [5, 6, 7, 8]) equals the hash of the same tokens as block 1 after "
                          "[1, 2, 3, 4]: a first block (parent None) and a later block must differ")
    return g.passed()


# ---------------------------------------------------------------- lesson 04: prefix cache

def check_prefix_cache(cls) -> bool:
    """cls(), like `kv.prefix_cache.PrefixCache`: lookup(block_hashes) -> block ids,
    insert(hash, block), forget(block), record(num_prompt_tokens, num_cached_tokens),
    and the `hit_rate` property.

    Checks lookup returns the longest cached run from the first hash (stopping at the
    first miss, so no block is used out of its prefix: prompts sharing block 1 but not
    block 0 get no hit), insert is first-writer-wins, forget drops a block's hash (and
    ignores blocks it never saw), and hit_rate = hits / queried tokens (0.0 before any).
    Then the engine with `prefix_cache_cls=cls` serves a second request with a shared
    prefix from the cache (num_cached_tokens as the reference's) with reference-identical
    greedy tokens, also on a small pool where cached blocks get evicted.
    """
    from .kv.prefix_cache import block_hash

    g = _Grader("check_prefix_cache", "your prefix cache")

    def chain(blocks):
        hashes, parent = [], None
        for block in blocks:
            parent = block_hash(parent, block)
            hashes.append(parent)
        return hashes

    A = chain([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    B = chain([[1, 2, 3, 4], [0, 0, 0, 0], [9, 10, 11, 12]])      # shares block 0 only
    C = chain([[4, 3, 2, 1], [5, 6, 7, 8]])                       # shares block 1's tokens, not block 0
    with g.case("constructing cls()"):
        c = cls()

    def lookup(hashes, label):
        with g.case(f"calling lookup({label})"):
            return [int(b) for b in c.lookup(list(hashes))]

    _expect(lookup(A, "3 hashes on an empty cache") == [], "lookup on an empty cache should return []")
    with g.case("inserting prompt A's 3 block hashes as blocks 5, 2, 7"):
        for h, b in zip(A, (5, 2, 7)):
            c.insert(h, b)
    for n in (3, 2, 0):
        got = lookup(A[:n], f"A's first {n} hashes")
        _expect(got == [5, 2, 7][:n], f"after inserting A's hashes as blocks [5, 2, 7], lookup of A's first {n} "
                                      f"hashes should return {[5, 2, 7][:n]}, got {got}")
    got = lookup(B, "B's hashes (B shares only block 0 with A)")
    _expect(got == [5], f"lookup of a prompt sharing only block 0 with A should return [5], got {got}: stop at "
                        "the first hash that is not cached")
    got = lookup(C, "C's hashes (C shares block 1's tokens with A, but not block 0)")
    _expect(got == [], f"lookup of a prompt that shares block 1's tokens but not block 0 with A returned {got}: "
                       "a block is reused only after its whole prefix; stop at the first miss")
    with g.case("inserting A's first hash again as block 9"):
        c.insert(A[0], 9)
    got = lookup(A, "A's hashes")
    _expect(got == [5, 2, 7], f"insert is first-writer-wins: A's first block is already cached as block 5, so "
                              f"insert(hash, 9) must not replace it; lookup(A) should stay [5, 2, 7], got {got}")
    with g.case("calling forget(2) (block 2 is being reused for other tokens)"):
        c.forget(2)
    got = lookup(A, "A's hashes after forget(2)")
    _expect(got == [5], f"after forget(2), lookup(A) should return [5], got {got}. "
                        + ("forget(block) must drop that block's hash. " if 2 in got else "")
                        + ("lookup must stop at the first miss: block 7 is only valid after block 2's prefix"
                           if 7 in got else ""))
    with g.case("calling forget(11) for a block the cache never saw, and forget(2) again (the block manager "
                "calls forget on every block it hands out: ignore blocks that name no prefix)"):
        c.forget(11)
        c.forget(2)
    with g.case("inserting A's second hash as block 3, and a new hash as block 2"):
        c.insert(A[1], 3)
        other = block_hash(None, [42, 42, 42, 42])
        c.insert(other, 2)
    got = lookup(A, "A's hashes")
    _expect(got == [5, 3, 7], f"after re-inserting A's second block as block 3, lookup(A) should be [5, 3, 7], "
                              f"got {got}")
    got = lookup([other], "the new hash")
    _expect(got == [2], f"a forgotten block can name a new prefix: after insert(new hash, 2), lookup should "
                        f"return [2], got {got}")

    with g.case("reading hit_rate of a new cache, then record(12, 8) and record(4, 0)"):
        c2 = cls()
        empty = c2.hit_rate
        c2.record(12, 8)
        c2.record(4, 0)
        rate = c2.hit_rate
    _expect(isinstance(empty, (int, float)) and empty == 0.0,
            f"hit_rate before any record() should be 0.0, got {empty!r}"
            + (": make hit_rate a @property" if callable(empty) else ""))
    _expect(isinstance(rate, (int, float)) and abs(rate - 0.5) < 1e-9,
            f"after record(12, 8) and record(4, 0), hit_rate should be 8 / 16 = 0.5, got {rate!r}: "
            "cached tokens over prompt tokens, summed over all records")

    # the real engine
    model, tokenizer = _tiny_model()
    long_ids = tokenizer.encode(_PROMPTS[2])                     # 15 tokens: 3 full blocks of 4
    shared = [long_ids, long_ids[:12] + tokenizer.encode(" a cat"), long_ids[:8] + [400, 401, 402]]
    stuck = "lookup, insert and forget only map hashes to block ids; the allocator owns the blocks"
    engine = _engine(g, "prefix_cache_cls=cls", prefix_cache_cls=cls, num_kv_blocks=32, block_size=4)
    first = _drive(g, engine, shared[:1], _GREEDY, "prefix_cache_cls=cls: the first prompt", stuck)
    rest = _drive(g, engine, shared[1:], _GREEDY, "prefix_cache_cls=cls: two prompts sharing its prefix", stuck)
    for prompt, out in zip(shared[1:], rest):
        common = next(i for i, (x, y) in enumerate(zip(prompt + [-1], long_ids + [-2])) if x != y)
        expected = min(common, len(prompt) - 1) // 4 * 4          # whole blocks, one token left to compute
        _expect(out.num_cached_tokens == expected,
                f"LLMEngine(prefix_cache_cls=cls): a prompt sharing its first {expected} tokens (whole blocks) "
                f"with an earlier one should find them cached; num_cached_tokens is {out.num_cached_tokens}. "
                "Does lookup find the hashes insert stored, in order?")
    _compare_runs(shared, first + rest, _reference_run(shared, _GREEDY, **_AMPLE_POOL), "prefix_cache_cls=cls",
                  "a cached block must hold exactly the prefix its hash names")
    rate = engine.stats()["prefix_cache_hit_rate"]
    _expect(rate > 0, f"LLMEngine(prefix_cache_cls=cls).stats() reports a hit rate of {rate} after cache hits: "
                      "record() must add up prompt and cached tokens")
    small = _engine(g, "prefix_cache_cls=cls, num_kv_blocks=8", prefix_cache_cls=cls, **_SMALL_POOL)
    ours = _drive(g, small, _PROMPTS, _GREEDY, "prefix_cache_cls=cls, 8 blocks: 5 prompts", stuck)
    ours += _drive(g, small, shared, _GREEDY, "prefix_cache_cls=cls, 8 blocks: 3 prompts sharing a prefix", stuck)
    reference = _reference_run(_PROMPTS, _GREEDY, **_AMPLE_POOL) + _reference_run(shared, _GREEDY, **_AMPLE_POOL)
    _compare_runs(_PROMPTS + shared, ours, reference,
                  "prefix_cache_cls=cls, 8 blocks (cached blocks get evicted and reused)",
                  "when a block is handed out for new tokens, forget(block) must drop its old hash, or a later "
                  "prompt reuses KV that was overwritten")
    return g.passed()


# ---------------------------------------------------------------- lesson 04: copy-on-write

def _expect_cow(bm, seq, n, before_table, sibling, sibling_table, shared_idx, label):
    """After append_slots(seq, n): the written shared blocks were copied, nothing else was."""
    from .kv.block_manager import cdiv

    bs = bm.block_size
    start = seq.num_computed_tokens
    written = range(start // bs, cdiv(start + n, bs))
    table, copies = list(seq.block_table), list(bm.ops.copies)
    call = f"append_slots(seq, {n}) with {start} tokens computed, block table {before_table} ({label})"
    _expect(list(sibling.block_table) == sibling_table,
            f"{call} changed the sibling's block table {sibling_table} -> {sibling.block_table}: copy-on-write "
            "only changes the table of the sequence that writes")
    _expect(len(table) == cdiv(start + n, bs),
            f"{call}: the table should cover {start + n} tokens ({cdiv(start + n, bs)} blocks), got {table}")
    for i in range(len(before_table)):
        old = before_table[i]
        if i not in written or i not in shared_idx:
            _expect(table[i] == old,
                    f"{call} replaced block {old} (table entry {i}) by {table[i]}, but "
                    + ("that block is not written by this step" if i not in written else
                       "it is not shared (ref count 1): write it in place, no copy")
                    + "; only shared blocks that this step writes need a private copy")
            continue
        new = table[i]
        if new == old:
            raise AssertionError(
                f"{call} writes into block {old}, which the sibling also holds (ref count "
                f"{bm.allocator.ref_counts[old]}): that would overwrite the sibling's KV. Copy-on-write: "
                "new = self._new_block(); self.ops.copies.append((old, new)); self.allocator.free(old); "
                "seq.block_table[i] = new")
        _expect(new not in before_table and new not in sibling_table,
                f"{call} replaced shared block {old} with block {new}, which is already in use")
        if (new, old) in copies:
            raise AssertionError(f"{call} queued the copy as ({new}, {old}); the pair is (src, dst) = "
                                 f"(shared block, your new block) = ({old}, {new})")
        _expect((old, new) in copies,
                f"{call} moved the sequence to block {new} but did not queue the copy ({old}, {new}) in "
                f"self.ops.copies (got {copies}): without it the new block holds garbage, not the shared KV")
        _expect(bm.allocator.ref_counts[new] == 1,
                f"{call}: the private copy {new} should have ref count 1, got {bm.allocator.ref_counts[new]}")
    expected = [(before_table[i], table[i]) for i in sorted(shared_idx) if i in written]
    _expect(copies == expected, f"{call} queued copies {copies}, expected exactly {expected}")


def check_copy_on_write(cls) -> bool:
    """cls: a `kv.block_manager.BlockManager` subclass overriding
    `append_slots(self, seq, num_new_tokens)` (same constructor as BlockManager).

    After fork, a sequence writing into the shared, partly filled last block gets a
    private copy: a new block (from self._new_block(), so a stale cached prefix is
    forgotten), the pair (shared, copy) queued in self.ops.copies, the shared block's
    ref count decremented, the sibling's table untouched. Blocks not shared, or
    shared but not written this step, are used in place; the last holder writes in
    place; three siblings copy twice; a chunk that spans the shared block and new
    blocks grows the table. Then n=4 seeded sampling through the engine with
    `block_manager_cls=cls` gives the reference engine's four samples, and no block leaks.
    """
    g = _Grader("check_copy_on_write", "your append_slots")
    S = _Seqs()

    def step(bm, seq, n, sibling, label):
        before, sib = list(seq.block_table), list(sibling.block_table)
        shared_idx = {i for i, b in enumerate(before) if bm.allocator.ref_counts[b] > 1}
        with g.case(f"calling append_slots(seq, {n}) ({label})"):
            bm.append_slots(seq, n)
        _expect_cow(bm, seq, n, before, sibling, sib, shared_idx, label)
        bm.take_ops()
        bm.mark_computed(seq, n)

    with g.case("constructing cls(16, 4) and computing a 6-token prompt"):
        bm = cls(16, 4)
        parent = S.new(range(100, 106))
        bm.allocate(parent)
        table = list(parent.block_table)
        bm.append_slots(parent, 6)
    _expect(parent.block_table == table and not bm.ops.copies,
            f"append_slots on a fresh sequence's own blocks (none shared) should write in place: the table went "
            f"{table} -> {parent.block_table}, copies {bm.ops.copies}")
    bm.take_ops()
    bm.mark_computed(parent, 6)
    child = S.new(range(100, 106))
    bm.fork(parent, child)
    parent.output_token_ids.append(7)
    child.output_token_ids.append(8)
    full, partial = table
    step(bm, parent, 1, child, "after fork, the parent writes position 6 into the shared block 1")
    _expect(bm.allocator.ref_counts[partial] == 1 and bm.allocator.ref_counts[full] == 2,
            f"after the parent copied shared block {partial}, its ref count should drop from 2 to 1 (the child "
            f"still holds it) and block {full} (shared, not written) stay at 2; got "
            f"{bm.allocator.ref_counts[partial]} and {bm.allocator.ref_counts[full]}. Drop the writer's reference "
            "with self.allocator.free(shared_block)")
    step(bm, child, 1, parent, "the child, now the only holder of block 1, writes position 6")
    _expect(bm.num_free_blocks == 16 - 3, f"after one copy-on-write, 3 of 16 blocks should be in use, got "
                                          f"{16 - bm.num_free_blocks}")

    # three siblings and a chunk that spans the shared block and a new one
    p = S.new(range(200, 206))
    sibs = [S.new(range(200, 206)) for _ in range(2)]
    with g.case("computing a 6-token prompt and forking it twice"):
        _computed(bm, p)
        for s in sibs:
            bm.fork(p, s)
    for s, t in zip([p] + sibs, (1, 2, 3)):
        s.output_token_ids.append(t)
    p.output_token_ids += [4, 5]
    step(bm, p, 3, sibs[0], "3 holders of block 1; the chunk 6..8 also needs a new block")
    step(bm, sibs[0], 1, sibs[1], "2 holders of block 1 left")
    step(bm, sibs[1], 1, sibs[0], "the last holder of block 1")

    # fork at a block boundary: nothing shared is written
    q, r = S.new(range(300, 308)), S.new(range(300, 308))
    with g.case("computing an 8-token prompt (two full blocks) and forking it"):
        _computed(bm, q)
        bm.fork(q, r)
    q.output_token_ids.append(1)
    r.output_token_ids.append(2)
    step(bm, q, 1, r, "forked at a block boundary: position 8 opens a new block")

    # the copy's block may hold a stale cached prefix: it must be forgotten
    with g.case("constructing cls(4, 4), caching an 8-token prefix, freeing it, then forking a 6-token prompt"):
        bm = cls(4, 4)
        a = S.new(range(400, 408))
        _computed(bm, a)
        cached_hashes = list(a.block_hashes)
        bm.free(a)
        parent = S.new(range(500, 506))
        _computed(bm, parent)
        child = S.new(range(500, 506))
        bm.fork(parent, child)
        parent.output_token_ids.append(1)
        child.output_token_ids.append(2)
        bm.append_slots(parent, 1)
    copy = parent.block_table[-1]
    stale = [int(b) for b in bm.prefix_cache.lookup(cached_hashes)]
    _expect(copy not in stale,
            f"the private copy went into block {copy}, which still named a cached prefix (it was free, holding an "
            f"old prompt's KV), and the prefix cache still maps that prefix to it: take new blocks with "
            "self._new_block(), which also calls prefix_cache.forget(block); self.allocator.allocate() alone "
            "leaves a cache entry pointing at KV you are about to overwrite")

    # the real engine: n=4 siblings share the prompt's last, partly filled block
    prompts = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    engine = _engine(g, "block_manager_cls=cls", block_manager_cls=cls, num_kv_blocks=32, block_size=4)
    ours = _drive(g, engine, prompts, params, "block_manager_cls=cls, n=4 seeded sampling",
                  "append_slots must leave a writable slot for every token the step feeds")
    reference = _reference_run(prompts, params, num_kv_blocks=32, block_size=4)
    _compare_runs(prompts, ours, reference, "block_manager_cls=cls, n=4 seeded sampling",
                  "siblings must not see each other's tokens: copy shared blocks before writing, and queue "
                  "every copy in self.ops.copies", greedy=False)
    _expect_no_leak(engine, "block_manager_cls=cls, n=4", "after a copy, free the writer's reference to the "
                                                          "shared block")
    return g.passed()


# ---------------------------------------------------------------- lesson 05: scheduler

class _Scenario:
    """Requests fed to a scheduler with no model: (prompt length, max_tokens, arrival step, priority)."""

    def __init__(self, label, requests, *, num_blocks=64, block_size=4, max_num_seqs=4, budget=16,
                 chunked=False, policy="fcfs", note=""):
        self.label, self.requests, self.note = label, requests, note
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.budget, self.chunked, self.policy = max_num_seqs, budget, chunked, policy

    def __str__(self):
        return (f"{self.label}: {len(self.requests)} requests, max_num_seqs={self.max_num_seqs}, "
                f"max_num_batched_tokens={self.budget}, chunked prefill {'on' if self.chunked else 'off'}, "
                f"policy {self.policy!r}, {self.num_blocks} blocks of {self.block_size}")


_SCENARIOS = [
    _Scenario("staggered arrivals",
              [(12, 5, 0, 0), (5, 8, 0, 0), (9, 3, 1, 0), (14, 6, 2, 0), (3, 7, 2, 0), (11, 2, 3, 0),
               (7, 6, 5, 0), (16, 4, 6, 0), (4, 9, 6, 0), (10, 3, 8, 0)]),
    _Scenario("a small pool (running sequences must be preempted)",
              [(7, 10, 0, 0), (5, 9, 0, 0), (9, 8, 0, 0), (6, 10, 1, 0), (8, 7, 2, 0), (5, 9, 3, 0)],
              num_blocks=10, budget=32,
              note="when self.bm.can_append(seq, n) is False, preempt: victim = self.pick_victim(), "
                   "self._preempt(victim, out), until it fits or seq itself was the victim"),
    _Scenario("chunked prefill of prompts longer than the budget",
              [(4, 10, 0, 0), (20, 4, 1, 0), (3, 8, 1, 0), (13, 5, 2, 0), (30, 3, 3, 0)],
              max_num_seqs=3, budget=8, chunked=True),
    _Scenario("the priority policy (lower value first)",
              [(6, 6, 0, 2), (5, 6, 0, 1), (7, 5, 0, 2), (4, 6, 1, 0), (6, 4, 1, 3), (5, 5, 3, 0), (6, 5, 4, 1)],
              max_num_seqs=2, policy="priority"),
]


def _simulate(g, cls, sc: _Scenario, max_steps: int, verify: bool = True) -> int:
    """Run a scenario like the engine would, checking each step (unless `verify` is False:
    timing the reference). Returns the steps it took."""
    from .kv.block_manager import BlockManager
    from .sequence import Status

    bm = BlockManager(sc.num_blocks, sc.block_size)
    with g.case(f"constructing cls(BlockManager({sc.num_blocks}, {sc.block_size}), {sc.max_num_seqs}, "
                f"{sc.budget}, {sc.chunked}, {sc.policy!r}, 'recompute', False)"):
        sched = cls(bm, sc.max_num_seqs, sc.budget, sc.chunked, sc.policy, "recompute", False)
    S = _Seqs()
    seqs = [S.new([1000 * i + j for j in range(n)], max_tokens=m, priority=pr)
            for i, (n, m, _, pr) in enumerate(sc.requests)]
    arrive = [a for _, _, a, _ in sc.requests]
    never_admitted, admitted_at, where = set(), {}, f"({sc})"
    for t in range(max_steps):
        for seq, a in zip(seqs, arrive):
            if a == t:
                with g.case(f"calling add() at step {t}"):
                    sched.add(seq)
                never_admitted.add(seq)
        if all(s.status is Status.FINISHED for s in seqs):
            return t
        running_before = [s for s in sched.running if s.status is Status.RUNNING]
        with g.case(f"calling schedule() at step {t} {where}" + (f"; {sc.note}" if sc.note else "")):
            out = sched.schedule()
        _expect(hasattr(out, "scheduled") and hasattr(out, "preempted"),
                f"schedule() should return a SchedulerOutput, got {type(out).__name__} (step {t} {where})")
        plan = [(s, n) for s, n in out.scheduled]
        names = {s: f"request {s.seq_id}" for s in seqs}
        if verify:
            total = sum(n for _, n in plan)
            _expect(total <= sc.budget,
                    f"step {t}: schedule() fed {total} tokens ({[(names[s], n) for s, n in plan]}), more than "
                    f"max_num_batched_tokens={sc.budget}: give each sequence min(its uncomputed tokens, the "
                    f"budget left) and stop admitting when the budget is spent {where}")
            _expect(len(sched.running) <= sc.max_num_seqs,
                    f"step {t}: {len(sched.running)} sequences are running, more than max_num_seqs="
                    f"{sc.max_num_seqs} {where}")
            _expect(len({s for s, _ in plan}) == len(plan), f"step {t}: a sequence was scheduled twice {where}")
            for s, n in plan:
                _expect(isinstance(n, int) and 1 <= n <= s.num_uncomputed_tokens,
                        f"step {t}: {names[s]} was given {n!r} tokens but has {s.num_uncomputed_tokens} still to "
                        f"feed: schedule between 1 and seq.num_uncomputed_tokens {where}")
                _expect(s.status is Status.RUNNING and s in sched.running,
                        f"step {t}: {names[s]} was scheduled but is not in self.running with status RUNNING "
                        f"(status {s.status.name}) {where}")
                _expect(len(s.block_table) * sc.block_size >= s.num_computed_tokens + n,
                        f"step {t}: {names[s]} feeds {n} token(s) after {s.num_computed_tokens} computed but its "
                        f"block table has room for {len(s.block_table) * sc.block_size}: call "
                        f"self.bm.append_slots(seq, n) for every scheduled sequence {where}")
                _expect(sc.chunked or n == s.num_uncomputed_tokens,
                        f"step {t}: {names[s]} was given {n} of its {s.num_uncomputed_tokens} prompt tokens with "
                        f"chunked prefill off: without chunking a prompt is fed whole {where}")
            newly = [s for s, _ in plan if s in never_admitted]
            used = sum(n for _, n in plan)
            for s in running_before:
                if s in out.preempted or s in {x for x, _ in plan}:
                    continue
                if newly:
                    raise AssertionError(
                        f"step {t}: {names[s]} was running but got no tokens, while {names[newly[0]]} was "
                        f"admitted: schedule the running sequences first (their decode tokens), then admit new "
                        f"ones with the budget left {where}")
                _expect(used >= sc.budget,
                        f"step {t}: {names[s]} was running but got no tokens, though only {used} of the "
                        f"{sc.budget}-token budget was used: every running sequence feeds its next token (or "
                        f"chunk) each step {where}")
            for s in newly:
                earlier = [w for w in never_admitted if w not in newly and sched.rank(w) < sched.rank(s)]
                if earlier:
                    raise AssertionError(
                        f"step {t}: {names[s]} was admitted while {names[min(earlier, key=sched.rank)]}, which "
                        + ("ranks higher (priority, then arrival)" if sc.policy == "priority" else "arrived earlier")
                        + ", was still waiting: admit waiting requests in order "
                        + ("of self.rank (sort the queue with key=self.rank)" if sc.policy == "priority" else
                           "of arrival (first come, first served)")
                        + f", never skipping the head of the queue {where}")
            if not out.preempted and len(sched.running) < sc.max_num_seqs:
                waiting = [w for w in sched.waiting if w.status is Status.WAITING]
                head = min(waiting, key=sched.rank) if waiting else None
                room = sc.budget - used
                if head is not None and bm.can_allocate(head) and (room >= len(head) or (sc.chunked and room > 0)):
                    raise AssertionError(
                        f"step {t}: {names[head]} ({len(head)} tokens) was left waiting though it fits: "
                        f"{len(sched.running)} of {sc.max_num_seqs} sequences running, {room} tokens of budget "
                        f"left, blocks free. "
                        + (f"With chunked prefill on, a prompt longer than the budget left is admitted with a "
                           f"first chunk of min(its tokens, budget left) = {room} tokens " if room < len(head) else
                           "Continuous batching admits new requests every step, not only when the batch is empty ")
                        + where)
        for s in out.preempted:
            never_admitted.discard(s)
        for s, _ in plan:
            never_admitted.discard(s)
            admitted_at.setdefault(s, t)
        bm.take_ops()
        with g.case(f"running step {t}: mark_computed, sampling and finishing {where}"):
            for s, n in plan:
                bm.mark_computed(s, n)
            for s, n in plan:
                if s.num_computed_tokens == len(s):
                    s.output_token_ids.append(7)
                    if len(s.output_token_ids) >= s.params.max_tokens:
                        sched.finish(s)
    late = [s for s in seqs if s.status is not Status.FINISHED]
    waited = {s.seq_id: f"arrived at step {arrive[s.seq_id]}, " + (f"admitted at step {admitted_at[s]}" if s in
              admitted_at else "never admitted") for s in late}
    raise AssertionError(f"after {max_steps} steps, requests are still unfinished: {waited}. No request may wait "
                         f"forever: admit in order, and let running ones finish {where}")


def check_scheduler(cls) -> bool:
    """cls: a `scheduler.Scheduler` subclass overriding `schedule(self) -> SchedulerOutput`.

    Drives it without a model over four scenarios (staggered arrivals, a pool so small
    that running sequences must be preempted, chunked prefill with prompts longer than
    the budget, the priority policy), doing after each step what the engine does
    (mark_computed, a fake token once a sequence has fed all its tokens, finish at
    max_tokens), and checks every step: tokens <= max_num_batched_tokens, running <=
    max_num_seqs, each sequence gets 1..its uncomputed tokens with block room made by
    append_slots, a prompt is fed whole unless chunked prefill is on, a running
    sequence is never dropped for a new prefill, admission follows arrival (FCFS) or
    rank (priority), a waiting request that fits is admitted at once, and every
    request finishes within a bound. Then the engine with `scheduler_cls=cls` on a
    small pool, with and without chunked prefill, gives the reference's greedy tokens.
    """
    from .scheduler import Scheduler

    g = _Grader("check_scheduler", "your schedule()")
    for sc in _SCENARIOS:
        reference_steps = _simulate(_Grader("reference", "the reference"), Scheduler, sc, 1000, verify=False)
        _simulate(g, cls, sc, max_steps=2 * reference_steps + 10)
    stuck = "is every running sequence scheduled each step, and the waiting queue admitted when there is room?"
    configs = [("scheduler_cls=cls, 8 blocks", dict(_SMALL_POOL)),
               ("scheduler_cls=cls, chunked prefill, max_num_batched_tokens=6",
                dict(num_kv_blocks=16, block_size=4, max_num_seqs=3, enable_chunked_prefill=True,
                     max_num_batched_tokens=6))]
    reference = _reference_run(_PROMPTS, _GREEDY, **_AMPLE_POOL)
    for label, options in configs:
        engine = _engine(g, label, scheduler_cls=cls, **options)
        ours = _drive(g, engine, _PROMPTS, _GREEDY, label, stuck)
        _compare_runs(_PROMPTS, ours, reference, label,
                      "the scheduling checks pass, so look at what the runner relies on: each (seq, n) feeds "
                      "the n tokens after seq.num_computed_tokens, with append_slots called first")
        _expect_no_leak(engine, label, "preempted and finished sequences must give their blocks back")
    return g.passed()


# ---------------------------------------------------------------- lesson 06: preemption

def _running_scheduler(g, cls, policy, mode, specs, num_cpu_blocks=0, num_blocks=32):
    """A scheduler whose running queue holds sequences (priority, arrival, prompt len, outputs)
    already computed, sorted by rank as schedule() leaves it."""
    from .kv.block_manager import BlockManager
    from .sequence import Status

    bm = BlockManager(num_blocks, 4, num_cpu_blocks=num_cpu_blocks)
    with g.case(f"constructing cls(BlockManager({num_blocks}, 4), 8, 64, False, {policy!r}, {mode!r}, False)"):
        sched = cls(bm, 8, 64, False, policy, mode, False)
    S = _Seqs()
    seqs = []
    for i, (priority, arrival, n, outputs) in enumerate(specs):
        s = S.new([50 * i + j for j in range(n)], priority=priority, arrival=arrival)
        _computed(bm, s, outputs)
        s.status = Status.RUNNING
        seqs.append(s)
    sched.running = sorted(seqs, key=sched.rank)
    return bm, sched, seqs


def check_preemption(cls) -> bool:
    """cls: a `scheduler.Scheduler` subclass overriding `pick_victim(self)` and/or
    `_preempt(self, seq, out)`.

    pick_victim returns, without changing the queues, the running sequence of lowest
    priority (under the "priority" policy: largest value), latest arrival among
    those. _preempt(seq, out) takes seq out of running and lists it in out.preempted;
    in "recompute" mode it frees its blocks and puts it back in waiting (status
    WAITING, nothing computed) with its generated tokens kept; in "swap" mode it moves
    the blocks to CPU with bm.swap_out (status SWAPPED, in self.swapped, KV kept), and
    falls back to recompute when bm.can_swap_out says the CPU pool is full. Then the
    engine with `scheduler_cls=cls` on a pool that forces preemption, in both modes,
    gives greedy tokens identical to a run that never preempts.
    """
    from .scheduler import SchedulerOutput
    from .sequence import Status

    g = _Grader("check_preemption", "your preemption")

    def desc(s):
        return f"(priority {s.priority}, arrival {s.arrival:g})"

    victims = [
        ("fcfs", [(0, 0.0), (0, 1.0), (0, 3.0), (0, 2.0)], 2, "fcfs: the latest arrival"),
        ("priority", [(0, 0.0), (2, 1.0), (1, 2.0), (2, 3.0)], 3,
         "priority: the largest priority value, latest arrival among equals"),
        ("priority", [(5, 0.0), (0, 1.0), (0, 2.0)], 0, "priority: low priority beats late arrival"),
    ]
    for policy, keys, want, label in victims:
        bm, sched, seqs = _running_scheduler(g, cls, policy, "recompute", [(p, a, 5, [9]) for p, a in keys])
        queue = list(sched.running)
        with g.case(f"calling pick_victim() ({label})"):
            victim = sched.pick_victim()
        _expect(sched.running == queue, "pick_victim() changed self.running: it only chooses; _preempt removes")
        _expect(victim is seqs[want],
                f"pick_victim() with running sequences {[desc(s) for s in queue]} under the {policy!r} policy "
                f"returned {desc(victim) if victim in seqs else repr(victim)}; expected {desc(seqs[want])}: the "
                "lowest ranked one, i.e. max(self.running, key=self.rank)"
                + (" (rank ignores priority under fcfs)" if policy == "fcfs" else ""))

    def preempt(sched, seq, label):
        out = SchedulerOutput()
        with g.case(f"calling _preempt(seq, out) ({label})"):
            sched._preempt(seq, out)
        _expect(seq not in sched.running, f"_preempt ({label}) left the sequence in self.running")
        _expect(seq in out.preempted, f"_preempt ({label}) should list the sequence in out.preempted (the engine "
                                      "counts preemptions from it)")
        return out

    def expect_recomputed(bm, sched, seq, blocks, outputs, free_before, label):
        _expect(seq.output_token_ids == outputs,
                f"_preempt ({label}) changed the sequence's generated tokens {outputs} -> {seq.output_token_ids}: "
                "keep them. The sequence is recomputed from prompt + generated tokens, and sampling continues "
                "after them (its max_tokens, stop checks and seeded generator all count them)")
        _expect(seq.status is Status.WAITING and seq in sched.waiting and seq not in sched.swapped,
                f"_preempt ({label}) should put the sequence back in self.waiting with status WAITING; it is "
                f"{seq.status.name}, in waiting: {seq in sched.waiting}")
        _expect(seq.block_table == [] and seq.num_computed_tokens == 0
                and bm.num_free_blocks == free_before + len(blocks)
                and all(bm.allocator.ref_counts[b] == 0 for b in blocks),
                f"_preempt ({label}) should give the sequence's blocks {blocks} back with self.bm.free(seq) (table "
                f"empty, nothing computed); now table {seq.block_table}, {seq.num_computed_tokens} computed, "
                f"{bm.num_free_blocks - free_before} of {len(blocks)} blocks freed")

    specs = [(0, 0.0, 6, [11, 12, 13]), (0, 1.0, 5, [21, 22, 23, 24, 25])]
    bm, sched, seqs = _running_scheduler(g, cls, "fcfs", "recompute", specs)
    seq, other = seqs[1], seqs[0]
    blocks, outputs, free_before = list(seq.block_table), list(seq.output_token_ids), bm.num_free_blocks
    other_table = list(other.block_table)
    preempt(sched, seq, "recompute mode")
    expect_recomputed(bm, sched, seq, blocks, outputs, free_before, "recompute mode")
    _expect(other in sched.running and other.block_table == other_table,
            "_preempt changed a sequence it was not asked to preempt")

    bm, sched, seqs = _running_scheduler(g, cls, "fcfs", "swap", specs, num_cpu_blocks=8)
    seq = seqs[1]
    blocks, outputs, computed, free_before = (list(seq.block_table), list(seq.output_token_ids),
                                              seq.num_computed_tokens, bm.num_free_blocks)
    preempt(sched, seq, "swap mode, CPU room for its blocks")
    _expect(seq.status is Status.SWAPPED and seq in sched.swapped and seq not in sched.waiting,
            f"_preempt in swap mode (CPU blocks free) should call self.bm.swap_out(seq), set status SWAPPED and put "
            f"it in self.swapped; it is {seq.status.name}, in swapped: {seq in sched.swapped}, in waiting: "
            f"{seq in sched.waiting}")
    _expect(seq.output_token_ids == outputs and seq.num_computed_tokens == computed,
            f"_preempt in swap mode must keep the generated tokens and num_computed_tokens (the KV is kept on the "
            f"CPU); got {seq.output_token_ids}, {seq.num_computed_tokens} computed (was {outputs}, {computed})")
    _expect(list(bm.ops.swap_out) and [d for d, _ in bm.ops.swap_out] == blocks
            and bm.num_free_blocks == free_before + len(blocks),
            f"_preempt in swap mode should move blocks {blocks} to the CPU with self.bm.swap_out(seq); queued "
            f"swaps {bm.ops.swap_out}, {bm.num_free_blocks - free_before} device blocks freed")

    bm, sched, seqs = _running_scheduler(g, cls, "fcfs", "swap", specs, num_cpu_blocks=1)
    seq = seqs[1]
    blocks, outputs, free_before = list(seq.block_table), list(seq.output_token_ids), bm.num_free_blocks
    preempt(sched, seq, "swap mode, but only 1 CPU block for its 3")
    expect_recomputed(bm, sched, seq, blocks, outputs, free_before,
                      "swap mode without CPU room: check self.bm.can_swap_out(seq), else recompute")

    # the real engine
    reference = _reference_run(_PROMPTS, _GREEDY, **_AMPLE_POOL)
    stuck = "a preempted sequence must come back: recompute puts it in self.waiting, swap in self.swapped"
    for mode in ("recompute", "swap"):
        label = f"scheduler_cls=cls, 8 blocks, preemption_mode={mode!r}"
        engine = _engine(g, label, scheduler_cls=cls, preemption_mode=mode, **_SMALL_POOL)
        ours = _drive(g, engine, _PROMPTS, _GREEDY, label, stuck)
        _compare_runs(_PROMPTS, ours, reference, label,
                      "a preempted sequence must resume where it was: generated tokens kept, and its KV either "
                      "recomputed from all its tokens or swapped back")
        _expect_no_leak(engine, label, "preempted and finished sequences must give their blocks back")
        if mode == "swap":
            swapped = engine.block_manager.num_swapped_out_blocks
            _expect(swapped > 0, f"LLMEngine({label}) preempted {engine.scheduler.num_preemptions} times but never "
                                 "swapped a block out: in swap mode, use self.bm.swap_out(seq) when "
                                 "self.bm.can_swap_out(seq)")
    return g.passed()


# ---------------------------------------------------------------- lesson 06: swap

def check_swap(cls) -> bool:
    """cls: a `kv.block_manager.BlockManager` subclass overriding `swap_out(self, seq)` and
    `swap_in(self, seq)` (same constructor as BlockManager, with num_cpu_blocks > 0).

    swap_out: each device block of the table gets a CPU block (from self.cpu_allocator),
    the pair (device, cpu) is queued in self.ops.swap_out in table order, the device
    block is freed (a block shared with a sibling stays held by it), and the table now
    lists the CPU blocks. swap_in: the reverse, fresh device blocks from
    self._new_block() (a stale cached prefix is forgotten), (cpu, device) pairs in
    self.ops.swap_in, CPU blocks freed. num_computed_tokens is unchanged both ways.
    Then the engine with `block_manager_cls=cls`, preemption_mode="swap" and a tiny pool
    swaps many times and gives greedy tokens identical to a run that never preempts.
    """
    g = _Grader("check_swap", "your swap_out / swap_in")
    S = _Seqs()
    with g.case("constructing cls(3, 4, num_cpu_blocks=6)"):
        bm = cls(3, 4, num_cpu_blocks=6)
    with g.case("allocating and freeing a 3-token sequence, then computing an 11-token one"):
        warmup = S.new([1, 2, 3])                      # a partial block: not cached, goes to the pool's back
        bm.allocate(warmup)
        bm.free(warmup)
        seq = S.new(range(600, 609))
        _computed(bm, seq, [1, 2])                     # 11 tokens, 10 computed: all 3 device blocks, [1, 2, 0]
    dev, computed = list(seq.block_table), seq.num_computed_tokens
    with g.case(f"calling swap_out(seq) on a sequence holding device blocks {dev}"):
        bm.swap_out(seq)
    cpu, pairs = list(seq.block_table), list(bm.ops.swap_out)
    _expect(len(cpu) == 3 and len(set(cpu)) == 3
            and all(0 <= c < 6 and bm.cpu_allocator.ref_counts[c] == 1 for c in cpu),
            f"after swap_out, the table should list 3 distinct CPU blocks, each allocated from self.cpu_allocator "
            f"(ref count 1); table {cpu}")
    if pairs == list(zip(cpu, dev)) and cpu != dev:
        raise AssertionError(f"swap_out queued {pairs}: the pairs are (src, dst) = (device block, CPU block), "
                             f"i.e. {list(zip(dev, cpu))}")
    _expect(pairs == list(zip(dev, cpu)),
            f"swap_out of device blocks {dev} into CPU blocks {cpu} should queue {list(zip(dev, cpu))} in "
            f"self.ops.swap_out (table order), got {pairs}: the engine copies exactly these pairs out")
    _expect(bm.num_free_blocks == 3 and all(bm.allocator.ref_counts[b] == 0 for b in dev),
            f"after swap_out the device blocks {dev} should be free (self.allocator.free(block)); ref counts "
            f"{[bm.allocator.ref_counts[b] for b in dev]}, {bm.num_free_blocks} of 3 free")
    _expect(bm.cpu_allocator.num_free == 3, f"3 of 6 CPU blocks should be free, got {bm.cpu_allocator.num_free}")
    _expect(seq.num_computed_tokens == computed, f"swap_out changed num_computed_tokens {computed} -> "
                                                 f"{seq.num_computed_tokens}: the KV is kept, so is the count")
    bm.take_ops()

    # swap back in while the free device blocks hold another prompt's cached prefix
    other = S.new(range(700, 708))
    with g.case("computing and freeing an 8-token prompt while the sequence is swapped out"):
        _computed(bm, other)                           # 2 full blocks, named in the prefix cache
        cached = list(other.block_hashes)
        bm.free(other)
    with g.case("calling swap_in(seq) with the 3 device blocks free, 2 of them holding a cached prefix"):
        bm.swap_in(seq)
    new, pairs = list(seq.block_table), list(bm.ops.swap_in)
    _expect(len(new) == 3 and len(set(new)) == 3
            and all(0 <= b < 3 and bm.allocator.ref_counts[b] == 1 for b in new),
            f"after swap_in the table should list 3 distinct device blocks with ref count 1, got {new}")
    if pairs == list(zip(new, cpu)) and new != cpu:
        raise AssertionError(f"swap_in queued {pairs}: the pairs are (src, dst) = (CPU block, device block), "
                             f"i.e. {list(zip(cpu, new))}")
    _expect(pairs == list(zip(cpu, new)),
            f"swap_in from CPU blocks {cpu} into device blocks {new} should queue {list(zip(cpu, new))} in "
            f"self.ops.swap_in, (src, dst) in table order; got {pairs}")
    _expect(bm.cpu_allocator.num_free == 6 and all(bm.cpu_allocator.ref_counts[c] == 0 for c in cpu),
            f"after swap_in the CPU blocks {cpu} should be free again (self.cpu_allocator.free(block)); "
            f"{bm.cpu_allocator.num_free} of 6 free")
    _expect(bm.num_free_blocks == 0,
            f"after swap_in all 3 device blocks should be in use, {bm.num_free_blocks} free")
    _expect(seq.num_computed_tokens == computed, f"swap_in changed num_computed_tokens {computed} -> "
                                                 f"{seq.num_computed_tokens}")
    stale = [b for b in (int(x) for x in bm.prefix_cache.lookup(cached)) if b in new]
    _expect(not stale, f"swap_in put the sequence in block(s) {stale}, which the prefix cache still maps to an old "
                       "prompt's prefix: take device blocks with self._new_block(), which also forgets their old "
                       "hash; self.allocator.allocate() alone leaves a cache entry pointing at overwritten KV")
    bm.take_ops()

    # a block shared with a sibling stays with the sibling
    with g.case("constructing cls(8, 4, num_cpu_blocks=6), forking a 6-token sequence and swapping the child out"):
        bm = cls(8, 4, num_cpu_blocks=6)
        parent = S.new(range(800, 806))
        _computed(bm, parent)
        child = S.new(range(800, 806))
        bm.fork(parent, child)
        shared = list(parent.block_table)
        bm.swap_out(child)
    _expect([bm.allocator.ref_counts[b] for b in shared] == [1, 1] and parent.block_table == shared,
            f"swap_out of a child sharing blocks {shared} with its parent should drop only the child's reference "
            f"(ref counts 2 -> 1, use self.allocator.free), got ref counts "
            f"{[bm.allocator.ref_counts[b] for b in shared]}, parent table {parent.block_table}")

    # the real engine, swapping many times
    class Counting(cls):
        swaps_out = swaps_in = 0

        def swap_out(self, seq):
            self.swaps_out += 1
            return super().swap_out(seq)

        def swap_in(self, seq):
            self.swaps_in += 1
            return super().swap_in(seq)

    label = "block_manager_cls=cls, preemption_mode='swap', 8 blocks"
    prompts = _PROMPTS + ["Write a poem about the sea", "1, 2, 3, 4,"]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = _engine(g, label, block_manager_cls=Counting, preemption_mode="swap", swap_space=64, **_SMALL_POOL)
    ours = _drive(g, engine, prompts, params, label, "swapped sequences must come back: swap_in fills their table "
                                                     "with device blocks again")
    _compare_runs(prompts, ours, _reference_run(prompts, params, **_AMPLE_POOL), label,
                  "the unit cases pass, so check the (src, dst) pairs: the engine copies exactly what ops lists")
    _expect_no_leak(engine, label, "swap_out frees the device blocks, swap_in frees the CPU blocks")
    bm = engine.block_manager
    _expect(bm.swaps_out >= 3 and bm.swaps_in == bm.swaps_out,
            f"LLMEngine({label}) swapped out {bm.swaps_out} and in {bm.swaps_in} times; the reference swaps out at "
            "least 3 times here, and every swapped-out sequence comes back")
    return g.passed()


# Importing this module before minillm.checks leaves that module's `import *` with a
# half-built module: make the graders reachable from minillm.checks in either order.
from . import checks as _checks  # noqa: E402

for _name in __all__:
    setattr(_checks, _name, globals()[_name])
