"""Lessons 05-06: iteration-level scheduling (continuous batching) and preemption.

Every step the scheduler decides, from scratch, who runs. Two classes, one on the other:

`ContinuousBatchingScheduler` (lesson 05) is the core. The running sequences go first,
each feeding its next token or prompt chunk within the step's token budget; then waiting
requests are admitted, first come first served, while the budget, the seats
(max_num_seqs) and free blocks allow. A finished sequence leaves at once and its place
is taken in the very next step.

`Scheduler`, the engine's, is that core plus what lessons 04 and 06 add:
  1. the running sequences keep going; if one needs a block and none is free, the
     lowest-priority, latest-arrived running sequence is preempted — swapped to CPU or
     dropped for recompute;
  2. if nobody was preempted, sequences are brought in, best ranked first: swapped ones
     back from CPU, waiting ones new, while the token budget, the seats (a request with
     n samples takes n) and free blocks allow.
Under the priority policy a waiting request that outranks running work may preempt it
to get in. Order: "fcfs" by arrival; "priority" by (priority value, arrival), lower first.

Lesson 05's static batching baseline, which admits a new batch only when the last is
done, is `baselines.static_batching.StaticBatchScheduler`.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..config import SchedulerConfig
from ..kv.block_manager import BlockManager, BlockOps
from .sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    """A step's plan: the only thing that crosses from the scheduler to the runner. Plain data
    (sequences are ids, tokens, block tables and counts), so it pickles: a tensor-parallel
    worker receives exactly this."""
    # set by schedule(): each sequence that runs this step and how many of its tokens it feeds
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    # set by _preempt(): sequences that gave up their blocks this step (swapped out or requeued)
    preempted: list[Sequence] = field(default_factory=list)
    # set by plan_step(): the block manager's queued moves (swap out, copy-on-write, swap in),
    # which the runner applies before the forward
    block_ops: BlockOps = field(default_factory=BlockOps)


def seats(seq: Sequence) -> int:
    """Seats (of max_num_seqs) a sequence takes: a request with n > 1 samples reserves
    all n while its prompt runs, because it forks into n sequences once it is done."""
    return seq.params.n if seq.index == 0 and not seq.output_token_ids else 1


class ContinuousBatchingScheduler:
    """Lesson 05: continuous batching, the decision the engine asks for every step.

    What it leaves to the engine's `Scheduler`: here a running sequence that finds no free
    block simply waits a step (lesson 06 makes someone give way, and without that a full
    pool can stall everyone), a request takes one seat whatever its n (lesson 04's samples
    reserve n), and requests are served by arrival only (no priorities, nothing swapped).
    """

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig | None = None):
        config = config or SchedulerConfig()
        self.bm = block_manager
        self.config = config
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []        # KV on CPU: only the Scheduler swaps (lesson 06)
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self._finished_waiting = 0               # finished sequences still in `waiting` (see finish)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def add_fork(self, parent: Sequence, child: Sequence) -> None:
        """A running parent forked a child (n > 1): it shares the parent's blocks and
        runs from the next step (in one of the seats the parent reserved, in the Scheduler)."""
        self.bm.fork(parent, child)
        child.status = Status.RUNNING
        self.running.append(child)

    def plan_step(self) -> SchedulerOutput:
        """What the engine calls each step: the schedule, with the block moves it queued."""
        self.drop_finished_waiting()
        out = self.schedule()
        for seq, n in out.scheduled:          # drafts past the step's budget are not fed (speculation)
            if seq.spec_token_ids and n < seq.num_uncomputed_tokens:
                del seq.spec_token_ids[max(0, n - (len(seq) - seq.num_computed_tokens)):]
        for seq in out.preempted:             # its drafts are proposed afresh once it runs again
            seq.spec_token_ids = []
        out.block_ops = self.bm.take_ops()
        return out

    def schedule(self) -> SchedulerOutput:
        """Decide this step: which sequences feed how many tokens."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # 1. the running sequences first: each feeds its next token (or the next chunk of its prompt)
        for seq in self.running:
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 0 and self.bm.can_append(seq, n):    # else it waits: no budget left, or no free block
                self.bm.append_slots(seq, n)
                out.scheduled.append((seq, n))
                budget -= n
        # 2. then the waiting ones, first come first served, while budget, seats and free blocks allow
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = self.bm.num_tokens_to_compute(seq)      # cached prefix blocks need no feeding
            if (n > budget and not self.chunked) or not self.bm.can_allocate(seq):
                break                                   # checked before allocating: nothing to undo
            self.waiting.pop(0)
            self.bm.allocate(seq)
            n = min(n, budget)
            self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def mark_computed(self, seq: Sequence, n: int) -> None:
        """The forward wrote n more of seq's tokens into the cache (full blocks join the prefix cache)."""
        self.bm.mark_computed(seq, n)

    def append_token(self, seq: Sequence, token: int) -> None:
        """The sampler's token for seq: its next input."""
        seq.output_token_ids.append(token)

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        """A sequence ended (or was aborted): its blocks go back at once. O(1) for a waiting one:
        it is marked finished and dropped from the queue in one pass once finished ones are half
        of it (or at the next step), so an abort storm of n waiting requests costs O(n), not O(n^2)."""
        if reason is not None:
            seq.finish_reason = reason
        was_waiting = seq.status is Status.WAITING
        if seq in self.running:                 # running and swapped hold max_num_seqs / the swap space
            self.running.remove(seq)
            self.bm.free(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.bm.free_swapped(seq)
        seq.status = Status.FINISHED
        if was_waiting:
            self._finished_waiting += 1
            if 2 * self._finished_waiting >= len(self.waiting):
                self.drop_finished_waiting()

    def drop_finished_waiting(self) -> None:
        if self._finished_waiting:
            self.waiting[:] = [s for s in self.waiting if not s.is_finished]
            self._finished_waiting = 0


class Scheduler(ContinuousBatchingScheduler):
    """The engine's scheduler: lesson 05's core with preemption and swapping (lesson 06),
    the priority policy, and seats for requests with n > 1 samples (lesson 04)."""

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig | None = None):
        super().__init__(block_manager, config)
        self.policy, self.preemption_mode = self.config.scheduling_policy, self.config.preemption_mode

    def rank(self, seq: Sequence) -> tuple:
        """Sort key: who goes first (and, from the end, who is preempted first)."""
        return (seq.priority if self.policy == "priority" else 0, seq.arrival, seq.seq_id)

    def seats_taken(self) -> int:
        return sum(seats(s) for s in self.running)

    def schedule(self) -> SchedulerOutput:
        """The core's two steps, each extended: the running sequences keep going, best ranked
        first, preempting when memory runs out; then, unless someone was preempted, swapped
        and waiting sequences are brought in by rank. Under the priority policy a waiting
        request that outranks running work first takes its place."""
        out = SchedulerOutput()
        for queue in (self.running, self.swapped, self.waiting):
            queue.sort(key=self.rank)
        if self.policy == "priority":
            self._make_room_for_priority(out)
        preempted_before = len(out.preempted)
        budget = self.keep_running(out, self.max_num_batched_tokens)
        if len(out.preempted) == preempted_before:     # else memory is short: admit nobody
            self.bring_in(out, budget)
        return out

    def keep_running(self, out: SchedulerOutput, budget: int) -> int:
        """Step 1: each running sequence feeds its next token (or prompt chunk), best ranked
        first; when one needs a block and none is free, the lowest ranked gives way. Returns
        the budget left."""
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue                   # preempted earlier in this loop, or no budget
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.bm.can_append(seq, n):
                victim = self.pick_victim()
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.bm.append_slots(seq, n)
                out.scheduled.append((seq, n))
                budget -= n
        return budget

    def bring_in(self, out: SchedulerOutput, budget: int) -> None:
        """Step 2: sequences brought in, best ranked first (swapped ones back, waiting ones
        new) while the budget, the seats and free blocks allow; never past the head."""
        while budget > 0:
            seq = self._next_candidate()
            if seq is None or self.seats_taken() + seats(seq) > self.max_num_seqs:
                break
            if seq.status is Status.SWAPPED:
                n = min(seq.num_uncomputed_tokens, budget)
                if not self.bm.can_swap_in(seq, n):
                    break
                self.swapped.remove(seq)
                self.bm.swap_in(seq)
            else:
                n = self.bm.num_tokens_to_compute(seq)     # cached prefix blocks need no feeding
                if (n > budget and not self.chunked) or not self.bm.can_allocate(seq):
                    break                  # checked before allocating: nothing to undo
                self.bm.allocate(seq)
                n = min(n, budget)
                self.waiting.remove(seq)
            self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n

    def _next_candidate(self) -> Sequence | None:
        heads = [q[0] for q in (self.swapped, self.waiting) if q]
        best = min(heads, key=self.rank) if heads else None
        gate = getattr(self, "lora_gate", None)          # enable_lora: its adapter needs a slot (lora/slots.py)
        return None if best is None or (gate is not None and not gate(best, self.running)) else best

    def _make_room_for_priority(self, out: SchedulerOutput) -> None:
        """A waiting request that outranks running work takes that work's place: its
        memory, or its seat when max_num_seqs are already running."""
        while self.waiting and self.running:
            best, worst = self.waiting[0], self.pick_victim()
            has_seat = self.seats_taken() + seats(best) <= self.max_num_seqs
            if worst.priority <= best.priority or (has_seat and self.bm.can_allocate(best)):
                return
            self._preempt(worst, out)

    def pick_victim(self) -> Sequence:
        """The running sequence to preempt: the lowest ranked (lowest priority, latest arrival)."""
        return max(self.running, key=self.rank)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Swap the sequence's KV to CPU when asked and there is room; otherwise drop it
        and requeue the sequence with prompt + generated tokens, to be recomputed."""
        self.running.remove(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)
        if self.preemption_mode == "swap" and self.bm.can_swap_out(seq):
            self.bm.swap_out(seq)
            seq.status = Status.SWAPPED
            bisect.insort(self.swapped, seq, key=self.rank)
        else:
            self.num_recomputed_tokens += seq.num_computed_tokens
            self.bm.free(seq)
            seq.status = Status.WAITING
            bisect.insort(self.waiting, seq, key=self.rank)
