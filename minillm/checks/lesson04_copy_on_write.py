"""Lesson 04's copy-on-write grader, `check_copy_on_write`: after a fork, the learner's
BlockManager.append_slots must give a private copy (queued in ops.copies) to exactly
the shared blocks the step writes, and nothing else; then n=4 seeded sampling runs in
the engine, where siblings writing into a shared block would see each other's tokens.
"""
from __future__ import annotations

from ..sampling_params import SamplingParams
from .engine_runs import Seqs, compare_runs, compute, drive, expect_no_leak, make_engine, reference_run
from .harness import Grader, expect, grader


def _expect_cow(bm, seq, n, before_table, sibling, sibling_table, shared_idx, label):
    """After append_slots(seq, n): the written shared blocks were copied, nothing else was."""
    from ..kv.block_manager import cdiv

    bs = bm.block_size
    start = seq.num_computed_tokens
    written = range(start // bs, cdiv(start + n, bs))
    table, copies = list(seq.block_table), list(bm.ops.copies)
    call = f"append_slots(seq, {n}) with {start} tokens computed, block table {before_table} ({label})"
    expect(list(sibling.block_table) == sibling_table,
           f"{call} changed the sibling's block table {sibling_table} -> {sibling.block_table}: copy-on-write "
           "only changes the table of the sequence that writes")
    expect(len(table) == cdiv(start + n, bs),
           f"{call}: the table should cover {start + n} tokens ({cdiv(start + n, bs)} blocks), got {table}")
    for i in range(len(before_table)):
        old = before_table[i]
        if i not in written or i not in shared_idx:
            expect(table[i] == old,
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
        expect(new not in before_table and new not in sibling_table,
               f"{call} replaced shared block {old} with block {new}, which is already in use")
        if (new, old) in copies:
            raise AssertionError(f"{call} queued the copy as ({new}, {old}); the pair is (src, dst) = "
                                 f"(shared block, your new block) = ({old}, {new})")
        expect((old, new) in copies,
               f"{call} moved the sequence to block {new} but did not queue the copy ({old}, {new}) in "
               f"self.ops.copies (got {copies}): without it the new block holds garbage, not the shared KV")
        expect(bm.allocator.ref_counts[new] == 1,
               f"{call}: the private copy {new} should have ref count 1, got {bm.allocator.ref_counts[new]}")
    expected = [(before_table[i], table[i]) for i in sorted(shared_idx) if i in written]
    expect(copies == expected, f"{call} queued copies {copies}, expected exactly {expected}")


@grader
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
    g = Grader("check_copy_on_write", "your append_slots")
    S = Seqs()

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
    expect(parent.block_table == table and not bm.ops.copies,
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
    expect(bm.allocator.ref_counts[partial] == 1 and bm.allocator.ref_counts[full] == 2,
           f"after the parent copied shared block {partial}, its ref count should drop from 2 to 1 (the child "
           f"still holds it) and block {full} (shared, not written) stay at 2; got "
           f"{bm.allocator.ref_counts[partial]} and {bm.allocator.ref_counts[full]}. Drop the writer's reference "
           "with self.allocator.free(shared_block)")
    step(bm, child, 1, parent, "the child, now the only holder of block 1, writes position 6")
    expect(bm.num_free_blocks == 16 - 3, f"after one copy-on-write, 3 of 16 blocks should be in use, got "
                                         f"{16 - bm.num_free_blocks}")

    # three siblings and a chunk that spans the shared block and a new one
    p = S.new(range(200, 206))
    sibs = [S.new(range(200, 206)) for _ in range(2)]
    with g.case("computing a 6-token prompt and forking it twice"):
        compute(bm, p)
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
        compute(bm, q)
        bm.fork(q, r)
    q.output_token_ids.append(1)
    r.output_token_ids.append(2)
    step(bm, q, 1, r, "forked at a block boundary: position 8 opens a new block")

    # the copy's block may hold a stale cached prefix: it must be forgotten
    with g.case("constructing cls(4, 4), caching an 8-token prefix, freeing it, then forking a 6-token prompt"):
        bm = cls(4, 4)
        a = S.new(range(400, 408))
        compute(bm, a)
        cached_hashes = list(a.block_hashes)
        bm.free(a)
        parent = S.new(range(500, 506))
        compute(bm, parent)
        child = S.new(range(500, 506))
        bm.fork(parent, child)
        parent.output_token_ids.append(1)
        child.output_token_ids.append(2)
        bm.append_slots(parent, 1)
    copy = parent.block_table[-1]
    stale = [int(b) for b in bm.prefix_cache.lookup(cached_hashes)]
    expect(copy not in stale,
           f"the private copy went into block {copy}, which still named a cached prefix (it was free, holding an "
           f"old prompt's KV), and the prefix cache still maps that prefix to it: take new blocks with "
           "self._new_block(), which also calls prefix_cache.forget(block); self.allocator.allocate() alone "
           "leaves a cache entry pointing at KV you are about to overwrite")

    # the real engine: n=4 siblings share the prompt's last, partly filled block
    prompts = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    engine = make_engine(g, "block_manager_cls=cls", block_manager_cls=cls, num_kv_blocks=32, block_size=4)
    ours = drive(g, engine, prompts, params, "block_manager_cls=cls, n=4 seeded sampling",
                 "append_slots must leave a writable slot for every token the step feeds")
    reference = reference_run(prompts, params, num_kv_blocks=32, block_size=4)
    compare_runs(prompts, ours, reference, "block_manager_cls=cls, n=4 seeded sampling",
                 "siblings must not see each other's tokens: copy shared blocks before writing, and queue "
                 "every copy in self.ops.copies", greedy=False)
    expect_no_leak(engine, "block_manager_cls=cls, n=4", "after a copy, free the writer's reference to the "
                                                         "shared block")
    return g.passed()
