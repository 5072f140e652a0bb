"""Lesson 05's grader, `check_scheduler`: the learner's `schedule()` (the core of
`engine.scheduler.ContinuousBatchingScheduler`) driven without a model over five scenarios
(staggered arrivals, a pool that fills up, chunked prefill, prompts that share a prefix
with and without chunking: prefix-cache hits), with the token budget, the
seats, admission order and fairness checked at every step, then run in the engine. A
scheduling bug shows up as a hang or a starved request rather than wrong text, so the
grader checks each step.
"""
from __future__ import annotations

from .engine_runs import (AMPLE_POOL, GREEDY, PROMPTS, Seqs, compare_runs, drive, expect_no_leak, make_engine,
                          reference_run)
from .harness import Grader, expect, grader


class _Scenario:
    """Requests fed to a scheduler with no model: (prompt length, max_tokens, arrival step)."""

    def __init__(self, label, requests, *, num_blocks=64, block_size=4, max_num_seqs=4, budget=16,
                 chunked=False, shared=0, note=""):
        self.label, self.requests, self.note, self.shared = label, requests, note, shared
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.budget, self.chunked = max_num_seqs, budget, chunked

    def __str__(self):
        return (f"{self.label}: {len(self.requests)} requests, max_num_seqs={self.max_num_seqs}, "
                f"max_num_batched_tokens={self.budget}, chunked prefill {'on' if self.chunked else 'off'}, "
                f"{self.num_blocks} blocks of {self.block_size}"
                + (f", every prompt starts with the same {self.shared} tokens" if self.shared else ""))

    def prompt(self, i: int, n: int) -> list[int]:
        """Request i's n prompt tokens: the shared prefix (as much as fits), then its own."""
        shared = min(self.shared, n)
        return list(range(shared)) + [1000 * (i + 1) + j for j in range(n - shared)]


_SCENARIOS = [
    _Scenario("staggered arrivals",
              [(12, 5, 0), (5, 8, 0), (9, 3, 1), (14, 6, 2), (3, 7, 2), (11, 2, 3), (7, 6, 5), (16, 4, 6),
               (4, 9, 6), (10, 3, 8)]),
    _Scenario("a pool that fills up (running sequences wait for a free block, new ones for room)",
              [(7, 10, 0), (4, 9, 1), (5, 8, 2), (9, 9, 2), (6, 6, 3), (4, 10, 3)],
              num_blocks=8, budget=32),
    _Scenario("chunked prefill of prompts longer than the budget",
              [(4, 10, 0), (20, 4, 1), (3, 8, 1), (13, 5, 2), (30, 3, 3)],
              max_num_seqs=3, budget=8, chunked=True),
    # a later prompt finds the first one's full blocks in the prefix cache: allocate() marks them
    # computed, so it feeds only the rest (request 2 is the prefix itself: its last block is fed again)
    _Scenario("prompts that share a prefix (prefix-cache hits)",
              [(12, 5, 0), (10, 3, 2), (8, 4, 3), (13, 2, 3), (9, 6, 4), (14, 3, 7)], shared=8),
    _Scenario("prompts that share a prefix, chunked prefill (prefix-cache hits)",
              [(12, 4, 0), (14, 3, 3), (8, 5, 3), (17, 2, 4), (11, 3, 6)],
              max_num_seqs=3, budget=8, chunked=True, shared=8),
]

# the engine runs: pools in which three sequences always fit at their longest (nothing to preempt)
_ENGINE_RUNS = [
    ("scheduler_cls=cls, 16 blocks, max_num_seqs=3",
     dict(num_kv_blocks=16, block_size=4, max_num_seqs=3, enable_chunked_prefill=False)),
    ("scheduler_cls=cls, chunked prefill, max_num_batched_tokens=6",
     dict(num_kv_blocks=16, block_size=4, max_num_seqs=3, enable_chunked_prefill=True, max_num_batched_tokens=6)),
]


def _arrival(seq) -> tuple:
    return seq.arrival, seq.seq_id


_ASK_FIRST = {
    "append_slots": "self.bm.append_slots(seq, n) found no free block: ask self.bm.can_append(seq, n) first. "
                    "A running sequence that has no room waits this step (lesson 06 makes someone give way)",
    "allocate": "self.bm.allocate(seq) found too few free blocks for the prompt: ask self.bm.can_allocate(seq) "
                "first, and when it is False stop admitting: the head of the queue waits, and everyone behind it",
}


def _no_free_block_hint(e, t: int, where: str) -> str:
    """Which block manager call ran out of blocks (the outermost one your schedule() made), and what to ask first."""
    tb, called = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("block_manager.py"):
            called = tb.tb_frame.f_code.co_name
            break
        tb = tb.tb_next
    hint = _ASK_FIRST.get(called, f"self.bm.{called}(...) found no free block: check there is room before "
                                  "taking blocks" if called else "check there is room before taking blocks")
    return f"your schedule() raised NoFreeBlocksError ({e}) at step {t}: {hint} {where}"


def _simulate(g, cls, sc: _Scenario, max_steps: int, verify: bool = True) -> int:
    """Run a scenario like the engine would, checking each step (unless `verify` is False:
    timing the reference). Returns the steps it took."""
    from ..config import SchedulerConfig
    from ..engine.sequence import Status
    from ..kv.block_allocator import NoFreeBlocksError
    from ..kv.block_manager import BlockManager

    bm = BlockManager(sc.num_blocks, sc.block_size)
    config = SchedulerConfig(max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.budget,
                             enable_chunked_prefill=sc.chunked)
    with g.case(f"constructing cls(BlockManager({sc.num_blocks}, {sc.block_size}), {config})"):
        sched = cls(bm, config)
    S = Seqs()
    seqs = [S.new(sc.prompt(i, n), max_tokens=m) for i, (n, m, _) in enumerate(sc.requests)]
    arrive = [a for _, _, a in sc.requests]
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
            try:
                out = sched.schedule()
            except NoFreeBlocksError as e:
                raise AssertionError(_no_free_block_hint(e, t, where)) from e
        expect(hasattr(out, "scheduled") and hasattr(out, "preempted"),
               f"schedule() should return a SchedulerOutput, got {type(out).__name__} (step {t} {where})")
        plan = [(s, n) for s, n in out.scheduled]
        names = {s: f"request {s.seq_id}" for s in seqs}
        if verify:
            _check_step(t, sc, sched, bm, plan, running_before, never_admitted, names, where)
        for s in plan:
            never_admitted.discard(s[0])
            admitted_at.setdefault(s[0], t)
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


def _check_step(t, sc, sched, bm, plan, running_before, never_admitted, names, where) -> None:
    from ..engine.sequence import Status

    total = sum(n for _, n in plan)
    expect(total <= sc.budget,
           f"step {t}: schedule() fed {total} tokens ({[(names[s], n) for s, n in plan]}), more than "
           f"max_num_batched_tokens={sc.budget}: give each sequence min(its uncomputed tokens, the "
           f"budget left) and stop admitting when the budget is spent {where}")
    expect(len(sched.running) <= sc.max_num_seqs,
           f"step {t}: {len(sched.running)} sequences are running, more than max_num_seqs={sc.max_num_seqs}: "
           f"admit only while len(self.running) < self.max_num_seqs {where}")
    expect(len({s for s, _ in plan}) == len(plan), f"step {t}: a sequence was scheduled twice {where}")
    was_running = set(running_before)
    for s, n in plan:
        if isinstance(n, int) and n > s.num_uncomputed_tokens and s not in was_running and s.num_computed_tokens:
            raise AssertionError(
                f"step {t}: {names[s]} ({len(s)} tokens) was admitted with a prefix-cache hit: allocate() found "
                f"its first {s.num_computed_tokens} tokens in the cache and marked them computed, so only "
                f"{s.num_uncomputed_tokens} are left to feed, but it was given {n}. seq.num_uncomputed_tokens read "
                f"before allocate() still counts the cached prefix: budget a new prompt with "
                f"self.bm.num_tokens_to_compute(seq) (what the block manager says must be computed), and feed "
                f"min(that, budget left). The engine would write K/V past the sequence's end {where}")
        expect(isinstance(n, int) and 1 <= n <= s.num_uncomputed_tokens,
               f"step {t}: {names[s]} was given {n!r} tokens but has {s.num_uncomputed_tokens} still to "
               f"feed: schedule between 1 and seq.num_uncomputed_tokens {where}")
        expect(s.status is Status.RUNNING and s in sched.running,
               f"step {t}: {names[s]} was scheduled but is not in self.running with status RUNNING "
               f"(status {s.status.name}) {where}")
        expect(len(s.block_table) * sc.block_size >= s.num_computed_tokens + n,
               f"step {t}: {names[s]} feeds {n} token(s) after {s.num_computed_tokens} computed but its "
               f"block table has room for {len(s.block_table) * sc.block_size}: call "
               f"self.bm.append_slots(seq, n) for every scheduled sequence {where}")
        expect(sc.chunked or n == s.num_uncomputed_tokens,
               f"step {t}: {names[s]} was given {n} of its {s.num_uncomputed_tokens} prompt tokens with "
               f"chunked prefill off: without chunking a prompt is fed whole {where}")
    fed = dict(plan)
    newly = [s for s, _ in plan if s in never_admitted]
    budget = sc.budget
    for s in running_before:              # in the order schedule() met them: the budget each one had
        n = min(s.num_uncomputed_tokens, budget)
        budget -= fed.get(s, 0)
        if s in fed or n == 0 or not bm.can_append(s, n):
            continue                      # fed, or no budget, or no free block: it waits
        if newly:
            raise AssertionError(
                f"step {t}: {names[s]} was running but got no tokens, while {names[newly[0]]} was "
                f"admitted: schedule the running sequences first (their decode tokens), then admit new "
                f"ones with the budget left {where}")
        raise AssertionError(
            f"step {t}: {names[s]} was running but got no tokens, though {n} tokens of the "
            f"{sc.budget}-token budget and the blocks for them were free: every running sequence feeds "
            f"its next token (or chunk) each step {where}")
    for s in newly:
        earlier = [w for w in never_admitted if w not in newly and _arrival(w) < _arrival(s)]
        if earlier:
            raise AssertionError(
                f"step {t}: {names[s]} was admitted while {names[min(earlier, key=_arrival)]}, which arrived "
                f"earlier, was still waiting: admit waiting requests in order of arrival (first come, first "
                f"served), never skipping the head of the queue {where}")
    if len(sched.running) < sc.max_num_seqs:
        waiting = [w for w in sched.waiting if w.status is Status.WAITING]
        head = min(waiting, key=_arrival) if waiting else None
        room = sc.budget - sum(fed.values())
        need = bm.num_tokens_to_compute(head) if head is not None else 0
        if head is not None and bm.can_allocate(head) and (room >= need or (sc.chunked and room > 0)):
            cached = len(head) - need
            raise AssertionError(
                f"step {t}: {names[head]} ({len(head)} tokens"
                + (f", {cached} of them in the prefix cache" if cached else "")
                + f") was left waiting though it fits: {len(sched.running)} of {sc.max_num_seqs} sequences "
                f"running, {room} tokens of budget left, blocks free. "
                + (f"With chunked prefill on, a prompt longer than the budget left is admitted with a "
                   f"first chunk of min(its tokens, budget left) = {room} tokens " if room < need else
                   f"Its cached prefix needs no feeding: it fits when self.bm.num_tokens_to_compute(seq) = "
                   f"{need} does, not its whole length " if cached and room < len(head) else
                   "Continuous batching admits new requests every step, not only when the batch is empty ")
                + where)


@grader
def check_scheduler(cls) -> bool:
    """cls: a `scheduler.ContinuousBatchingScheduler` subclass overriding `schedule(self) -> SchedulerOutput`.

    Drives it without a model over five scenarios (staggered arrivals, a pool so small
    that running sequences must wait for a free block and waiting ones for room, chunked
    prefill with prompts longer than the budget, prompts sharing a prefix with chunked
    prefill off and on, so a later prompt's first blocks are prefix-cache hits), doing after each step what the engine
    does (mark_computed, a fake token once a sequence has fed all its tokens, finish at
    max_tokens), and checks every step: tokens <= max_num_batched_tokens, running <=
    max_num_seqs, each sequence gets 1..its uncomputed tokens (after a prefix-cache hit,
    what allocate() left uncomputed) with block room made by
    append_slots, a prompt is fed whole unless chunked prefill is on, a running sequence
    that has budget and blocks is fed (never dropped for a new prefill), admission follows
    arrival (FCFS), a waiting request that fits is admitted at once, and every request
    finishes within a bound. Then the engine with `scheduler_cls=cls`, with and without
    chunked prefill, gives the reference's greedy tokens.
    """
    from ..engine.scheduler import ContinuousBatchingScheduler

    g = Grader("check_scheduler", "your schedule()")
    for sc in _SCENARIOS:
        reference_steps = _simulate(Grader("reference", "the reference"), ContinuousBatchingScheduler, sc, 1000,
                                    verify=False)
        _simulate(g, cls, sc, max_steps=2 * reference_steps + 10)
    stuck = "is every running sequence scheduled each step, and the waiting queue admitted when there is room?"
    reference = reference_run(PROMPTS, GREEDY, **AMPLE_POOL)
    for label, options in _ENGINE_RUNS:
        engine = make_engine(g, label, scheduler_cls=cls, **options)
        ours = drive(g, engine, PROMPTS, GREEDY, label, stuck)
        compare_runs(PROMPTS, ours, reference, label,
                     "the scheduling checks pass, so look at what the runner relies on: each (seq, n) feeds "
                     "the n tokens after seq.num_computed_tokens, with append_slots called first")
        expect_no_leak(engine, label, "finished sequences must give their blocks back")
    return g.passed()
