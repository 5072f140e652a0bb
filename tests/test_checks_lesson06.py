"""Tests of the graders of lesson 06 (minillm.checks.lesson06).

The reference passes each one, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_preemption`, `pytest -k check_swap`.
"""
import bisect

import pytest
from checks_support import rejects

from minillm import checks
from minillm.kv.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Status


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
    assert checks.check_preemption(Scheduler)


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
    assert checks.check_preemption(Mine)


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
    assert checks.check_swap(BlockManager)


def test_check_swap_accepts_the_planted_base_with_no_knob_turned():
    assert checks.check_swap(_PlantedSwap)


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
