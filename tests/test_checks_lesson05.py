"""Tests of the grader of lesson 05 (minillm.checks.lesson05).

The reference passes it, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_scheduler`.
"""
import pytest
from checks_support import rejects

from minillm import checks
from minillm.engine.scheduler import ContinuousBatchingScheduler, Scheduler, SchedulerOutput
from minillm.engine.sequence import Status


# ---------------------------------------------------------------- lesson 05: scheduler

class _PlantedScheduler(ContinuousBatchingScheduler):
    """An independent schedule() (two phases, a queue index) with one knob per classic mistake."""
    lifo = admit_only_when_idle = ignore_budget = prefill_first = never_chunk = skip_append = False
    no_can_append = no_can_allocate = ignore_seats = False

    def schedule(self):
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        if self.prefill_first:
            budget = self._admit(out, budget)
            self._keep_running(out, budget, skip=[s for s, _ in out.scheduled])
            return out
        was_running = bool(self.running)
        budget = self._keep_running(out, budget)
        if not (self.admit_only_when_idle and was_running):
            self._admit(out, budget)
        return out

    def _keep_running(self, out, budget, skip=()):
        for seq in self.running:
            if seq in skip or budget <= 0:
                continue
            n = seq.num_uncomputed_tokens if self.ignore_budget else min(seq.num_uncomputed_tokens, budget)
            if not self.no_can_append and not self.bm.can_append(seq, n):
                continue
            if not self.skip_append:
                self.bm.append_slots(seq, n)
            out.scheduled.append((seq, n))
            budget -= n
        return budget

    def _admit(self, out, budget):
        while ((budget > 0 or self.ignore_budget) and self.waiting
               and (self.ignore_seats or len(self.running) < self.max_num_seqs)):
            seq = self.waiting[-1 if self.lifo else 0]
            if not self.no_can_allocate and not self.bm.can_allocate(seq):
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


class SchedulerNeverAsksCanAppend(_PlantedScheduler):
    no_can_append = True


class SchedulerNeverAsksCanAllocate(_PlantedScheduler):
    no_can_allocate = True


class SchedulerIgnoresSeats(_PlantedScheduler):
    ignore_seats = True


class SchedulerSkeleton(ContinuousBatchingScheduler):
    def schedule(self):
        raise NotImplementedError


def test_check_scheduler_passes_reference():
    assert checks.check_scheduler(ContinuousBatchingScheduler)


def test_check_scheduler_passes_the_engines_scheduler():
    """The engine's Scheduler is the core plus preemption, priorities and seats: it passes too."""
    assert checks.check_scheduler(Scheduler)


def test_check_scheduler_accepts_the_planted_base_with_no_knob_turned():
    assert checks.check_scheduler(_PlantedScheduler)


@pytest.mark.parametrize("bad, match", [
    (SchedulerLIFO, "arrived earlier"),
    (SchedulerAdmitsOnlyWhenIdle, "left waiting though it fits"),
    (SchedulerIgnoresBudget, "more than max_num_batched_tokens"),
    (SchedulerPrefillFirst, "was running but got no tokens"),
    (SchedulerNeverChunks, "first chunk of min"),
    (SchedulerSkipsAppendSlots, "append_slots"),
    (SchedulerNeverAsksCanAppend, r"NoFreeBlocksError.*ask self\.bm\.can_append\(seq, n\) first"),
    (SchedulerNeverAsksCanAllocate, r"NoFreeBlocksError.*ask self\.bm\.can_allocate\(seq\) first"),
    (SchedulerIgnoresSeats, "more than max_num_seqs"),
    (SchedulerSkeleton, "not implemented"),
], ids=["lifo_starves", "admits_only_when_idle", "exceeds_token_budget", "drops_decodes_for_prefills",
        "never_chunks", "skips_append_slots", "never_asks_can_append", "never_asks_can_allocate",
        "ignores_seats", "skeleton"])
def test_check_scheduler_rejects(bad, match):
    rejects(checks.check_scheduler, bad, match)


class SchedulerBudgetsBeforeAllocate(ContinuousBatchingScheduler):
    """The reference with one mistake learners make: a new prompt is budgeted with
    seq.num_uncomputed_tokens read before allocate(), not self.bm.num_tokens_to_compute(seq).
    On a prefix-cache hit allocate() marks the cached prefix computed, so the plan feeds
    more tokens than the sequence has left (the engine's rope_write_kv then fails)."""

    def schedule(self):
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for seq in self.running:
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 0 and self.bm.can_append(seq, n):
                self.bm.append_slots(seq, n)
                out.scheduled.append((seq, n))
                budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_uncomputed_tokens               # the mistake: the whole prompt, cached prefix included
            if (n > budget and not self.chunked) or not self.bm.can_allocate(seq):
                break
            self.waiting.pop(0)
            self.bm.allocate(seq)
            n = min(n, budget)
            self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out


def test_check_scheduler_rejects_budgeting_the_cached_prefix():
    """A prefix-cache hit: the plan must feed what the block manager says is left to compute."""
    rejects(checks.check_scheduler, SchedulerBudgetsBeforeAllocate,
            r"cached prefix.*self\.bm\.num_tokens_to_compute\(seq\)")


class SchedulerFitsWholePrompt(SchedulerBudgetsBeforeAllocate):
    """Feeds the right tokens, but decides whether a new prompt fits by its whole length: a
    prompt whose cached prefix needs no feeding waits though what is left would fit."""

    def schedule(self):
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for seq in self.running:
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 0 and self.bm.can_append(seq, n):
                self.bm.append_slots(seq, n)
                out.scheduled.append((seq, n))
                budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if (len(seq) > budget and not self.chunked) or not self.bm.can_allocate(seq):   # the mistake
                break
            self.waiting.pop(0)
            self.bm.allocate(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out


def test_check_scheduler_rejects_waiting_for_room_the_cached_prefix_does_not_need():
    rejects(checks.check_scheduler, SchedulerFitsWholePrompt,
            r"left waiting though it fits.*num_tokens_to_compute\(seq\) = \d+ does")


def test_an_engine_stage_reports_the_engines_error_naming_the_scheduler():
    """Plugged into the engine, the prefix-hit mistake ends requests with the engine's error; the
    engine stage of a check says so (not only that the tokens differ)."""
    from minillm.checks import engine_runs
    from minillm.checks.harness import Grader

    g = Grader("check_scheduler", "your schedule()")
    engine = engine_runs.make_engine(g, "scheduler_cls=cls", scheduler_cls=SchedulerBudgetsBeforeAllocate,
                                     num_kv_blocks=32, block_size=4, max_num_seqs=2)
    shared = "Once upon a time, in a small village by the sea, there lived"
    engine_runs.drive(g, engine, [shared], engine_runs.GREEDY, "scheduler_cls=cls", "stuck")   # its blocks cached
    with pytest.raises(AssertionError, match=r"ended a request with an error instead of tokens: scheduler "
                                             r"SchedulerBudgetsBeforeAllocate planned \d+ tokens for request"):
        engine_runs.drive(g, engine, [shared + " a cat"], engine_runs.GREEDY, "scheduler_cls=cls", "stuck")
