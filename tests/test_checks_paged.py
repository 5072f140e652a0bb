"""The graders of lessons 03-06 (minillm.checks_paged, importable from minillm.checks): the
reference passes each one, an independent correct piece passes, and planted mistakes —
the ones learners make — are rejected with a hint that names the problem.

Addressable per lesson task: `pytest -k check_block_allocator`, `pytest -k check_scheduler`, ...
"""
import bisect
import hashlib
from collections import deque

import pytest
import torch

from minillm import checks
from minillm.attention.paged import slot_mapping
from minillm.kv.block_allocator import BlockAllocator, NoFreeBlocksError
from minillm.kv.block_manager import BlockManager, cdiv
from minillm.kv.prefix_cache import PrefixCache, block_hash
from minillm.scheduler import Scheduler
from minillm.sequence import Status


def rejects(check, bad, match=None):
    with pytest.raises(AssertionError, match=match):
        check(bad)


def test_graders_are_importable_from_checks_and_their_own_module():
    from minillm import checks_paged
    from minillm.checks import check_block_allocator, check_swap
    assert check_block_allocator is checks_paged.check_block_allocator and check_swap is checks_paged.check_swap
    for name in checks_paged.__all__:
        assert getattr(checks, name) is getattr(checks_paged, name)


# ---------------------------------------------------------------- the engine stage of every grader

def test_engine_stage_fails_instead_of_hanging_on_a_scheduler_that_never_schedules():
    from minillm import checks_paged
    from minillm.scheduler import SchedulerOutput

    class Idle(Scheduler):
        def schedule(self):
            return SchedulerOutput()

    g = checks._Grader("check_scheduler", "your schedule()")
    engine = checks_paged._engine(g, "scheduler_cls=Idle", scheduler_cls=Idle, num_kv_blocks=8, block_size=4)
    with pytest.raises(AssertionError, match=r"did not finish 2 short requests in 20 steps \(2 waiting, 0 running"):
        checks_paged._drive(g, engine, ["Hi", "Hello"], checks_paged._GREEDY, "scheduler_cls=Idle", "stuck",
                            max_steps=20)


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


class AllocatorSkeleton(BlockAllocator):
    def allocate(self):
        raise NotImplementedError


def test_check_block_allocator_passes_reference(capsys):
    assert checks.check_block_allocator(BlockAllocator) is True
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
            if block not in self.ref_counts:
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

    assert checks.check_block_allocator(Mine) is True


@pytest.mark.parametrize("bad, match", [
    (LeakyAllocator, "put a block whose count reaches 0 back"),
    (StackAllocator, "least recently freed first"),
    (NoDoubleFreeCheck, "double free"),
    (AcceptsNegativeIds, r"free\(-1\)"),
    (IncrefKeepsBlockInPool, "take it out of the free pool"),
    (NumFreeMethod, "@property"),
    (AssertsOnDoubleFree, "assert"),
    (IndexErrorOnUnknownId, "raised IndexError"),
    (AllocatorSkeleton, "not implemented"),
], ids=["leaks_on_free", "stack_not_queue", "no_double_free_check", "accepts_negative_ids",
        "incref_keeps_block_in_pool", "num_free_method", "asserts", "index_error", "skeleton"])
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


def slots_skeleton(block_table, positions, block_size):
    raise NotImplementedError


def test_check_slot_mapping_passes_reference():
    assert checks.check_slot_mapping(slot_mapping) is True


def test_check_slot_mapping_accepts_a_tensor_version():
    def vectorised(block_table, positions, block_size):
        pos = torch.tensor(positions, dtype=torch.long)
        table = torch.tensor(block_table, dtype=torch.long)
        return table[pos // block_size] * block_size + pos % block_size
    assert checks.check_slot_mapping(vectorised) is True


@pytest.mark.parametrize("bad, match", [
    (slots_off_by_one, "off by one"),
    (slots_ignore_table, "positions themselves"),
    (slots_block_id_plus_offset, r"slot 7 \* 4 \+ 0 = 28, yours 7"),
    (slots_table_index_by_offset, r"p // block_size"),
    (slots_skeleton, "not implemented"),
], ids=["off_by_one", "ignores_table", "block_id_plus_offset", "table_index_by_offset", "skeleton"])
def test_check_slot_mapping_rejects(bad, match):
    rejects(checks.check_slot_mapping, bad, match)


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
    assert checks.check_block_hash(block_hash) is True


def test_check_block_hash_accepts_python_hash_of_a_tuple():
    assert checks.check_block_hash(lambda parent, token_ids: hash((parent, tuple(token_ids)))) is True


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
    assert checks.check_prefix_cache(PrefixCache) is True


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

    assert checks.check_prefix_cache(Mine) is True


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
    assert checks.check_copy_on_write(BlockManager) is True


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
    assert checks.check_copy_on_write(Mine) is True


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


# ---------------------------------------------------------------- lesson 05: scheduler

class _PlantedScheduler(Scheduler):
    """The reference schedule (fcfs/priority admission, preemption) with one knob per classic mistake."""
    lifo = admit_only_when_idle = ignore_budget = prefill_first = never_chunk = skip_append = no_preempt = False

    def schedule(self):
        from minillm.scheduler import SchedulerOutput
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for queue in (self.running, self.swapped):
            queue.sort(key=self.rank)
        self.waiting.sort(key=self.rank, reverse=self.lifo)
        if self.prefill_first:
            budget = self._admit(out, budget)
            return self._keep_running(out, budget, skip=[s for s, _ in out.scheduled])[0]
        was_running = bool(self.running)
        out, budget, preempted = self._keep_running(out, budget)
        if preempted or (self.admit_only_when_idle and was_running):
            return out
        self._admit(out, budget)
        return out

    def _keep_running(self, out, budget, skip=()):
        preempted = False
        for seq in list(self.running):
            if seq in skip or seq.status is not Status.RUNNING or budget <= 0:
                continue
            n = seq.num_uncomputed_tokens if self.ignore_budget else min(seq.num_uncomputed_tokens, budget)
            while not self.no_preempt and not self.bm.can_append(seq, n):
                victim = self.pick_victim()
                self._preempt(victim, out)
                preempted = True
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                if not self.skip_append:
                    self.bm.append_slots(seq, n)
                out.scheduled.append((seq, n))
                budget -= n
        return out, budget, preempted

    def _admit(self, out, budget):
        while (budget > 0 or self.ignore_budget) and len(self.running) < self.max_num_seqs and self.waiting:
            seq = self.waiting[0]
            if not self.bm.can_allocate(seq):
                break
            self.bm.allocate(seq)
            n = seq.num_uncomputed_tokens
            if n > budget and not self.ignore_budget and (self.never_chunk or not self.chunked):
                self.bm.free(seq)
                break
            if not self.ignore_budget:
                n = min(n, budget)
            self.waiting.remove(seq)
            if not self.skip_append:
                self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return budget


class SchedulerLIFO(_PlantedScheduler):
    lifo = True


class SchedulerAdmitsOnlyWhenIdle(_PlantedScheduler):
    admit_only_when_idle = True


class SchedulerIgnoresBudget(_PlantedScheduler):
    ignore_budget = True


class SchedulerPrefillFirst(_PlantedScheduler):
    prefill_first = True


class SchedulerNeverChunks(_PlantedScheduler):
    never_chunk = True


class SchedulerSkipsAppendSlots(_PlantedScheduler):
    skip_append = True


class SchedulerNeverPreempts(_PlantedScheduler):
    no_preempt = True


class SchedulerSkeleton(Scheduler):
    def schedule(self):
        raise NotImplementedError


def test_check_scheduler_passes_reference():
    assert checks.check_scheduler(Scheduler) is True


def test_check_scheduler_accepts_the_planted_base_with_no_knob_turned():
    assert checks.check_scheduler(_PlantedScheduler) is True


@pytest.mark.parametrize("bad, match", [
    (SchedulerLIFO, "arrived earlier"),
    (SchedulerAdmitsOnlyWhenIdle, "left waiting though it fits"),
    (SchedulerIgnoresBudget, "more than max_num_batched_tokens"),
    (SchedulerPrefillFirst, "was running but got no tokens"),
    (SchedulerNeverChunks, "first chunk of min"),
    (SchedulerSkipsAppendSlots, "append_slots"),
    (SchedulerNeverPreempts, r"NoFreeBlocksError(.|\n)*self._preempt\(victim, out\)"),
    (SchedulerSkeleton, "not implemented"),
], ids=["lifo_starves", "admits_only_when_idle", "exceeds_token_budget", "drops_decodes_for_prefills",
        "never_chunks", "skips_append_slots", "never_preempts", "skeleton"])
def test_check_scheduler_rejects(bad, match):
    rejects(checks.check_scheduler, bad, match)


# ---------------------------------------------------------------- lesson 06: preemption

class RecomputeLosesGeneratedTokens(Scheduler):
    """Requeues a preempted sequence with its prompt only."""
    def _preempt(self, seq, out):
        super()._preempt(seq, out)
        if seq.status is Status.WAITING:
            seq.output_token_ids.clear()


class VictimEarliestArrival(Scheduler):
    def pick_victim(self):
        return min(self.running, key=self.rank)


class VictimIgnoresPriority(Scheduler):
    def pick_victim(self):
        return max(self.running, key=lambda s: (s.arrival, s.seq_id))


class VictimPoppedFromRunning(Scheduler):
    def pick_victim(self):
        victim = max(self.running, key=self.rank)
        self.running.remove(victim)
        self.running.append(victim)                     # "move it to the end" -- still a change
        self.running.pop()
        return victim


class PreemptNeverSwaps(Scheduler):
    def _preempt(self, seq, out):
        mode, self.preemption_mode = self.preemption_mode, "recompute"
        try:
            super()._preempt(seq, out)
        finally:
            self.preemption_mode = mode


class PreemptWithoutFreeing(Scheduler):
    def _preempt(self, seq, out):
        self.running.remove(seq)
        out.preempted.append(seq)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=self.rank)


class PreemptSkeleton(Scheduler):
    def _preempt(self, seq, out):
        raise NotImplementedError


def test_check_preemption_passes_reference():
    assert checks.check_preemption(Scheduler) is True


def test_check_preemption_accepts_an_independent_preempt():
    class Mine(Scheduler):
        def pick_victim(self):
            return self.running[-1]                # schedule() keeps running sorted by self.rank

        def _preempt(self, seq, out):
            self.running.remove(seq)
            out.preempted.append(seq)
            if self.preemption_mode == "swap" and self.bm.can_swap_out(seq):
                self.bm.swap_out(seq)
                seq.status = Status.SWAPPED
                self.swapped.append(seq)
            else:
                self.bm.free(seq)
                seq.status = Status.WAITING
                self.waiting.insert(0, seq)        # schedule() sorts the queues anyway
    assert checks.check_preemption(Mine) is True


@pytest.mark.parametrize("bad, match", [
    (RecomputeLosesGeneratedTokens, "changed the sequence's generated tokens"),
    (VictimEarliestArrival, "the lowest ranked one"),
    (VictimIgnoresPriority, r"expected \(priority 5, arrival 0\): the lowest ranked one"),
    (VictimPoppedFromRunning, "changed self.running"),
    (PreemptNeverSwaps, "bm.swap_out"),
    (PreemptWithoutFreeing, r"self.bm.free\(seq\)"),
    (PreemptSkeleton, "not implemented"),
], ids=["recompute_loses_generated_tokens", "victim_earliest_arrival", "victim_ignores_priority",
        "victim_popped_from_running", "never_swaps", "without_freeing", "skeleton"])
def test_check_preemption_rejects(bad, match):
    rejects(checks.check_preemption, bad, match)


# ---------------------------------------------------------------- lesson 06: swap

class _PlantedSwap(BlockManager):
    """The reference swap_out / swap_in with one knob per classic mistake."""
    free_device, reversed_pairs, free_cpu, fresh_via_allocator, queue = True, False, True, False, True

    def swap_out(self, seq):
        cpu_table = []
        for b in seq.block_table:
            c = self.cpu_allocator.allocate()
            if self.queue:
                self.ops.swap_out.append((c, b) if self.reversed_pairs else (b, c))
            if self.free_device:
                self.allocator.free(b)
            cpu_table.append(c)
        seq.block_table = cpu_table

    def swap_in(self, seq):
        table = []
        for c in seq.block_table:
            b = self.allocator.allocate() if self.fresh_via_allocator else self._new_block()
            if self.queue:
                self.ops.swap_in.append((b, c) if self.reversed_pairs else (c, b))
            if self.free_cpu:
                self.cpu_allocator.free(c)
            table.append(b)
        seq.block_table = table


class SwapOutKeepsDeviceBlocks(_PlantedSwap):
    free_device = False


class SwapReversedPairs(_PlantedSwap):
    reversed_pairs = True


class SwapInKeepsCpuBlocks(_PlantedSwap):
    free_cpu = False


class SwapInTakesStaleCachedBlocks(_PlantedSwap):
    fresh_via_allocator = True


class SwapForgetsToQueue(_PlantedSwap):
    queue = False


class SwapSkeleton(BlockManager):
    def swap_out(self, seq):
        raise NotImplementedError


def test_check_swap_passes_reference():
    assert checks.check_swap(BlockManager) is True


def test_check_swap_accepts_the_planted_base_with_no_knob_turned():
    assert checks.check_swap(_PlantedSwap) is True


@pytest.mark.parametrize("bad, match", [
    (SwapOutKeepsDeviceBlocks, "should be free"),
    (SwapReversedPairs, r"\(src, dst\) = \(device block, CPU block\)"),
    (SwapInKeepsCpuBlocks, "free again"),
    (SwapInTakesStaleCachedBlocks, "_new_block"),
    (SwapForgetsToQueue, "should queue"),
    (SwapSkeleton, "not implemented"),
], ids=["swap_out_keeps_device_blocks", "reversed_pairs", "swap_in_keeps_cpu_blocks",
        "swap_in_takes_stale_cached_blocks", "forgets_to_queue", "skeleton"])
def test_check_swap_rejects(bad, match):
    rejects(checks.check_swap, bad, match)
