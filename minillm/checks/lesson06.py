"""Lesson 06's graders: `check_preemption` (pick_victim, and _preempt in recompute and swap
modes) and `check_swap` (BlockManager.swap_out / swap_in: the (src, dst) pairs, blocks
freed on the side they leave). Each then runs in the engine on a pool that forces
preemption and must match a run that never preempts: a preempted request has to resume
exactly where it was.
"""
from __future__ import annotations

from ..sampling_params import SamplingParams
from .engine_runs import (AMPLE_POOL, GREEDY, PROMPTS, SMALL_POOL, Seqs, compare_runs, compute, drive,
                          expect_no_leak, make_engine, reference_run)
from .harness import Grader, expect, grader


# ---------------------------------------------------------------- lesson 06: preemption

def _running_scheduler(g, cls, policy, mode, specs, num_cpu_blocks=0, num_blocks=32):
    """A scheduler whose running queue holds sequences (priority, arrival, prompt len, outputs)
    already computed, sorted by rank as schedule() leaves it."""
    from ..config import SchedulerConfig
    from ..kv.block_manager import BlockManager
    from ..engine.sequence import Status

    bm = BlockManager(num_blocks, 4, num_cpu_blocks=num_cpu_blocks)
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=False,
                             scheduling_policy=policy, preemption_mode=mode)
    with g.case(f"constructing cls(BlockManager({num_blocks}, 4), {config})"):
        sched = cls(bm, config)
    S = Seqs()
    seqs = []
    for i, (priority, arrival, n, outputs) in enumerate(specs):
        s = S.new([50 * i + j for j in range(n)], priority=priority, arrival=arrival)
        compute(bm, s, outputs)
        s.status = Status.RUNNING
        seqs.append(s)
    sched.running = sorted(seqs, key=sched.rank)
    return bm, sched, seqs


@grader
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
    from ..engine.scheduler import SchedulerOutput
    from ..engine.sequence import Status

    g = Grader("check_preemption", "your preemption")

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
        expect(sched.running == queue, "pick_victim() changed self.running: it only chooses; _preempt removes")
        expect(victim is seqs[want],
               f"pick_victim() with running sequences {[desc(s) for s in queue]} under the {policy!r} policy "
               f"returned {desc(victim) if victim in seqs else repr(victim)}; expected {desc(seqs[want])}: the "
               "lowest ranked one, i.e. max(self.running, key=self.rank)"
               + (" (rank ignores priority under fcfs)" if policy == "fcfs" else ""))

    def preempt(sched, seq, label):
        out = SchedulerOutput()
        with g.case(f"calling _preempt(seq, out) ({label})"):
            sched._preempt(seq, out)
        expect(seq not in sched.running, f"_preempt ({label}) left the sequence in self.running")
        expect(seq in out.preempted, f"_preempt ({label}) should list the sequence in out.preempted (the engine "
                                     "counts preemptions from it)")
        return out

    def expect_recomputed(bm, sched, seq, blocks, outputs, free_before, label):
        expect(seq.output_token_ids == outputs,
               f"_preempt ({label}) changed the sequence's generated tokens {outputs} -> {seq.output_token_ids}: "
               "keep them. The sequence is recomputed from prompt + generated tokens, and sampling continues "
               "after them (its max_tokens, stop checks and seeded generator all count them)")
        expect(seq.status is Status.WAITING and seq in sched.waiting and seq not in sched.swapped,
               f"_preempt ({label}) should put the sequence back in self.waiting with status WAITING; it is "
               f"{seq.status.name}, in waiting: {seq in sched.waiting}")
        expect(seq.block_table == [] and seq.num_computed_tokens == 0
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
    expect(other in sched.running and other.block_table == other_table,
           "_preempt changed a sequence it was not asked to preempt")

    bm, sched, seqs = _running_scheduler(g, cls, "fcfs", "swap", specs, num_cpu_blocks=8)
    seq = seqs[1]
    blocks, outputs, computed, free_before = (list(seq.block_table), list(seq.output_token_ids),
                                              seq.num_computed_tokens, bm.num_free_blocks)
    preempt(sched, seq, "swap mode, CPU room for its blocks")
    expect(seq.status is Status.SWAPPED and seq in sched.swapped and seq not in sched.waiting,
           f"_preempt in swap mode (CPU blocks free) should call self.bm.swap_out(seq), set status SWAPPED and put "
           f"it in self.swapped; it is {seq.status.name}, in swapped: {seq in sched.swapped}, in waiting: "
           f"{seq in sched.waiting}")
    expect(seq.output_token_ids == outputs and seq.num_computed_tokens == computed,
           f"_preempt in swap mode must keep the generated tokens and num_computed_tokens (the KV is kept on the "
           f"CPU); got {seq.output_token_ids}, {seq.num_computed_tokens} computed (was {outputs}, {computed})")
    expect(list(bm.ops.swap_out) and [d for d, _ in bm.ops.swap_out] == blocks
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
    reference = reference_run(PROMPTS, GREEDY, **AMPLE_POOL)
    stuck = "a preempted sequence must come back: recompute puts it in self.waiting, swap in self.swapped"
    for mode in ("recompute", "swap"):
        label = f"scheduler_cls=cls, 8 blocks, preemption_mode={mode!r}"
        engine = make_engine(g, label, scheduler_cls=cls, preemption_mode=mode, **SMALL_POOL)
        ours = drive(g, engine, PROMPTS, GREEDY, label, stuck)
        compare_runs(PROMPTS, ours, reference, label,
                     "a preempted sequence must resume where it was: generated tokens kept, and its KV either "
                     "recomputed from all its tokens or swapped back")
        expect_no_leak(engine, label, "preempted and finished sequences must give their blocks back")
        if mode == "swap":
            swapped = engine.block_manager.num_swapped_out_blocks
            expect(swapped > 0, f"LLMEngine({label}) preempted {engine.scheduler.num_preemptions} times but never "
                                "swapped a block out: in swap mode, use self.bm.swap_out(seq) when "
                                "self.bm.can_swap_out(seq)")
    return g.passed()


# ---------------------------------------------------------------- lesson 06: swap

@grader
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
    g = Grader("check_swap", "your swap_out / swap_in")
    S = Seqs()
    with g.case("constructing cls(3, 4, num_cpu_blocks=6)"):
        bm = cls(3, 4, num_cpu_blocks=6)
    with g.case("allocating and freeing a 3-token sequence, then computing an 11-token one"):
        warmup = S.new([1, 2, 3])                      # a partial block: not cached, goes to the pool's back
        bm.allocate(warmup)
        bm.free(warmup)
        seq = S.new(range(600, 609))
        compute(bm, seq, [1, 2])                       # 11 tokens, 10 computed: all 3 device blocks, [1, 2, 0]
    dev, computed = list(seq.block_table), seq.num_computed_tokens
    with g.case(f"calling swap_out(seq) on a sequence holding device blocks {dev}"):
        bm.swap_out(seq)
    cpu, pairs = list(seq.block_table), list(bm.ops.swap_out)
    expect(len(cpu) == 3 and len(set(cpu)) == 3
           and all(0 <= c < 6 and bm.cpu_allocator.ref_counts[c] == 1 for c in cpu),
           f"after swap_out, the table should list 3 distinct CPU blocks, each allocated from self.cpu_allocator "
           f"(ref count 1); table {cpu}")
    if pairs == list(zip(cpu, dev)) and cpu != dev:
        raise AssertionError(f"swap_out queued {pairs}: the pairs are (src, dst) = (device block, CPU block), "
                             f"i.e. {list(zip(dev, cpu))}")
    expect(pairs == list(zip(dev, cpu)),
           f"swap_out of device blocks {dev} into CPU blocks {cpu} should queue {list(zip(dev, cpu))} in "
           f"self.ops.swap_out (table order), got {pairs}: the engine copies exactly these pairs out")
    expect(bm.num_free_blocks == 3 and all(bm.allocator.ref_counts[b] == 0 for b in dev),
           f"after swap_out the device blocks {dev} should be free (self.allocator.free(block)); ref counts "
           f"{[bm.allocator.ref_counts[b] for b in dev]}, {bm.num_free_blocks} of 3 free")
    expect(bm.cpu_allocator.num_free == 3, f"3 of 6 CPU blocks should be free, got {bm.cpu_allocator.num_free}")
    expect(seq.num_computed_tokens == computed, f"swap_out changed num_computed_tokens {computed} -> "
                                                f"{seq.num_computed_tokens}: the KV is kept, so is the count")
    bm.take_ops()

    # swap back in while the free device blocks hold another prompt's cached prefix
    other = S.new(range(700, 708))
    with g.case("computing and freeing an 8-token prompt while the sequence is swapped out"):
        compute(bm, other)                             # 2 full blocks, named in the prefix cache
        cached = list(other.block_hashes)
        bm.free(other)
    with g.case("calling swap_in(seq) with the 3 device blocks free, 2 of them holding a cached prefix"):
        bm.swap_in(seq)
    new, pairs = list(seq.block_table), list(bm.ops.swap_in)
    expect(len(new) == 3 and len(set(new)) == 3
           and all(0 <= b < 3 and bm.allocator.ref_counts[b] == 1 for b in new),
           f"after swap_in the table should list 3 distinct device blocks with ref count 1, got {new}")
    if pairs == list(zip(new, cpu)) and new != cpu:
        raise AssertionError(f"swap_in queued {pairs}: the pairs are (src, dst) = (CPU block, device block), "
                             f"i.e. {list(zip(cpu, new))}")
    expect(pairs == list(zip(cpu, new)),
           f"swap_in from CPU blocks {cpu} into device blocks {new} should queue {list(zip(cpu, new))} in "
           f"self.ops.swap_in, (src, dst) in table order; got {pairs}")
    expect(bm.cpu_allocator.num_free == 6 and all(bm.cpu_allocator.ref_counts[c] == 0 for c in cpu),
           f"after swap_in the CPU blocks {cpu} should be free again (self.cpu_allocator.free(block)); "
           f"{bm.cpu_allocator.num_free} of 6 free")
    expect(bm.num_free_blocks == 0,
           f"after swap_in all 3 device blocks should be in use, {bm.num_free_blocks} free")
    expect(seq.num_computed_tokens == computed, f"swap_in changed num_computed_tokens {computed} -> "
                                                f"{seq.num_computed_tokens}")
    stale = [b for b in (int(x) for x in bm.prefix_cache.lookup(cached)) if b in new]
    expect(not stale, f"swap_in put the sequence in block(s) {stale}, which the prefix cache still maps to an old "
                      "prompt's prefix: take device blocks with self._new_block(), which also forgets their old "
                      "hash; self.allocator.allocate() alone leaves a cache entry pointing at overwritten KV")
    bm.take_ops()

    # a block shared with a sibling stays with the sibling
    with g.case("constructing cls(8, 4, num_cpu_blocks=6), forking a 6-token sequence and swapping the child out"):
        bm = cls(8, 4, num_cpu_blocks=6)
        parent = S.new(range(800, 806))
        compute(bm, parent)
        child = S.new(range(800, 806))
        bm.fork(parent, child)
        shared = list(parent.block_table)
        bm.swap_out(child)
    expect([bm.allocator.ref_counts[b] for b in shared] == [1, 1] and parent.block_table == shared,
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
    prompts = PROMPTS + ["Write a poem about the sea", "1, 2, 3, 4,"]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = make_engine(g, label, block_manager_cls=Counting, preemption_mode="swap", swap_space=64, **SMALL_POOL)
    ours = drive(g, engine, prompts, params, label, "swapped sequences must come back: swap_in fills their table "
                                                    "with device blocks again")
    compare_runs(prompts, ours, reference_run(prompts, params, **AMPLE_POOL), label,
                 "the unit cases pass, so check the (src, dst) pairs: the engine copies exactly what ops lists")
    expect_no_leak(engine, label, "swap_out frees the device blocks, swap_in frees the CPU blocks")
    bm = engine.block_manager
    expect(bm.swaps_out >= 3 and bm.swaps_in == bm.swaps_out,
           f"LLMEngine({label}) swapped out {bm.swaps_out} and in {bm.swaps_in} times; the reference swaps out at "
           "least 3 times here, and every swapped-out sequence comes back")
    return g.passed()
