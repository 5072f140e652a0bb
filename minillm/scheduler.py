"""Lessons 05-06: iteration-level scheduling (continuous batching) and preemption.

Every step the scheduler decides, from scratch, who runs:
  1. the running sequences keep going (each feeds its next token or prompt chunk);
     if one needs a block and none is free, the lowest-priority, latest-arrived
     running sequence is preempted — swapped to CPU or dropped for recompute;
  2. if nobody was preempted, sequences are brought in, best ranked first:
     swapped ones back from CPU, waiting ones new, while the token budget, the
     sequence budget and free blocks allow.
Under the priority policy a waiting request that outranks running work may
preempt it to get in.
A finished sequence leaves at once and its place is taken in the very next step.

Order: "fcfs" by arrival; "priority" by (priority value, arrival), lower first.
"static" batching (a lesson 05 baseline) admits a new batch only when the last is done.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .kv.block_manager import BlockManager
from .sequence import Sequence, Status

POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)   # (sequence, tokens to feed)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = False, policy: str = "fcfs",
                 preemption_mode: str = "recompute", static_batching: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {policy!r}")
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = enable_chunked_prefill
        self.policy, self.preemption_mode, self.static = policy, preemption_mode, static_batching
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.last_plan = SchedulerOutput()     # kept for lessons and tests to inspect

    def rank(self, seq: Sequence) -> tuple:
        """Sort key: who goes first (and, from the end, who is preempted first)."""
        return (seq.priority if self.policy == "priority" else 0, seq.arrival, seq.seq_id)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> SchedulerOutput:
        self.last_plan = out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for queue in (self.running, self.swapped, self.waiting):
            queue.sort(key=self.rank)
        if self.policy == "priority":
            self._make_room_for_priority(out)
        was_idle = not self.running
        # 1. keep the running sequences going
        preempted_before = len(out.preempted)
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
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
        if len(out.preempted) > preempted_before or (self.static and not was_idle):
            return out                     # memory is short (or the static batch is still running)
        # 2. bring sequences in, best ranked first: swapped ones back, waiting ones new
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._next_candidate()
            if seq is None:
                break
            n = min(seq.num_uncomputed_tokens, budget)
            if seq.status is Status.SWAPPED:
                if not self.bm.can_swap_in(seq, n):
                    break
                self.swapped.remove(seq)
                self.bm.swap_in(seq)
            else:
                if not self.bm.can_allocate(seq):
                    break
                self.bm.allocate(seq)
                n = seq.num_uncomputed_tokens
                if n > budget and not self.chunked:
                    self.bm.free(seq)      # does not fit this step; undo (cached blocks stay cached)
                    break
                n = min(n, budget)
                self.waiting.remove(seq)
            self.bm.append_slots(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def _next_candidate(self) -> Sequence | None:
        heads = [q[0] for q in (self.swapped, self.waiting) if q]
        return min(heads, key=self.rank) if heads else None

    def _make_room_for_priority(self, out: SchedulerOutput) -> None:
        """A waiting request that outranks running work takes that work's place: its
        memory, or its seat when max_num_seqs are already running."""
        while self.waiting and self.running:
            best, worst = self.waiting[0], self.pick_victim()
            has_seat = len(self.running) < self.max_num_seqs
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

    def finish(self, seq: Sequence) -> None:
        """A sequence ended (or was aborted): its blocks go back at once."""
        if seq in self.running:
            self.running.remove(seq)
            self.bm.free(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.bm.free_swapped(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
