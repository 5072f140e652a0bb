"""Lesson 05: iteration-level scheduling (continuous batching).

Every step the scheduler decides, from scratch, who runs: first the sequences
already running (each feeds its next token, or its next prompt chunk), then new
sequences from the waiting queue while the token budget, the sequence budget and
free KV blocks allow. A finished sequence leaves at once and its place is taken
in the very next step, instead of idling until the whole batch ends.

When a running sequence needs a block and none is free, the most recently
arrived running sequence is preempted: its blocks are freed and it goes back to
the front of the waiting queue with everything it generated, to be recomputed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .kv.block_manager import BlockManager
from .sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)   # (sequence, tokens to feed)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = False):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # 1. keep the running sequences going, in arrival order
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.bm.can_append(seq, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.bm.append_slots(seq, n)
            out.scheduled.append((seq, n))
            budget -= n
        # 2. admit waiting sequences, unless memory just ran short
        while self.waiting and not out.preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.bm.can_allocate(seq):
                break
            self.bm.allocate(seq)
            n = seq.num_uncomputed_tokens
            if n > budget and not self.chunked:
                self.bm.free(seq)          # does not fit this step; undo (cached blocks stay cached)
                break
            n = min(n, budget)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute mode: drop the sequence's KV; it re-enters with prompt + generated tokens."""
        self.running.remove(seq)
        self.num_recomputed_tokens += seq.num_computed_tokens
        self.bm.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def finish(self, seq: Sequence) -> None:
        """A sequence ended (or was aborted): its blocks go back at once."""
        if seq in self.running:
            self.running.remove(seq)
            self.bm.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            if seq.block_table:
                self.bm.free(seq)
        seq.status = Status.FINISHED
