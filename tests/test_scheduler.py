"""Unit tests of the reference scheduler, apart from the lesson graders: the token budget,
seats for n > 1 requests, chunked prefill, priorities, and that a prompt which must wait
leaves the prefix cache (and its statistics) untouched; lesson 05's core
(ContinuousBatchingScheduler) and its static batching baseline (StaticBatchScheduler)."""
import itertools

from minillm.baselines.static_batching import StaticBatchScheduler
from minillm.config import SchedulerConfig
from minillm.kv.block_manager import BlockManager
from minillm.sampling_params import SamplingParams
from minillm.engine.scheduler import ContinuousBatchingScheduler, Scheduler, seats
from minillm.engine.sequence import Sequence, Status

_ids = itertools.count()


def seq(prompt, n=1, priority=0, request_id=None):
    i = next(_ids)
    return Sequence(seq_id=i, request_id=request_id or f"r{i}", prompt_token_ids=list(prompt),
                    params=SamplingParams(n=n, max_tokens=64), priority=priority, arrival=float(i))


def scheduler(num_blocks=32, block_size=4, cls=Scheduler, **config):
    return cls(BlockManager(num_blocks, block_size, enable_prefix_caching=True), SchedulerConfig(**config))


def run_step(s: Scheduler):
    """What the engine does with a plan: advance each sequence, sample a token where due."""
    plan = s.schedule()
    for sq, n in plan.scheduled:
        s.bm.mark_computed(sq, n)
        if sq.num_computed_tokens == len(sq):
            sq.output_token_ids.append(7)
    return plan


def test_a_waiting_prompt_that_does_not_fit_the_budget_leaves_the_prefix_cache_alone():
    s = scheduler(num_blocks=8, max_num_batched_tokens=12, enable_chunked_prefill=False)
    first = seq(range(100, 112))                              # 3 full blocks
    s.add(first)
    run_step(s)
    s.finish(first)                                           # its blocks are free and cached
    cache = s.bm.prefix_cache
    cached = cache.lookup(s.bm._prompt_hashes(first.prompt_token_ids))
    assert len(cached) == 3 and s.bm.num_free_blocks == 8
    runner = seq(range(200, 204))
    s.add(runner)
    run_step(s)                                               # runner now decodes 1 token a step
    queries = cache.queries
    big = seq(range(300, 312))                                # 12 new tokens > the 11 left
    s.add(big)
    for _ in range(5):
        plan = run_step(s)
        assert [q for q, _ in plan.scheduled] == [runner]
        assert big.status is Status.WAITING and not big.block_table
        assert cache.lookup(s.bm._prompt_hashes(first.prompt_token_ids)) == cached, "cached prefix evicted"
    assert cache.queries == queries, "hit statistics recorded for a prompt that was not admitted"
    s.finish(runner)
    plan = run_step(s)
    assert [q for q, _ in plan.scheduled] == [big]


def test_cached_prefix_counts_toward_the_budget_check():
    s = scheduler(num_blocks=16, max_num_batched_tokens=8, enable_chunked_prefill=False)
    first = seq(range(100, 108))
    s.add(first)
    run_step(s)
    s.finish(first)
    again = seq(list(range(100, 108)) + [500, 501, 502, 503])   # 12 tokens, 8 cached: 4 to feed
    s.add(again)
    plan = run_step(s)
    assert plan.scheduled == [(again, 4)] and again.num_cached_tokens == 8


def test_a_request_with_n_samples_takes_n_seats():
    s = scheduler(max_num_seqs=4)
    three, two, one = seq([1, 2, 3], n=3), seq([4, 5, 6], n=2), seq([7, 8])
    assert (seats(three), seats(two), seats(one)) == (3, 2, 1)
    for q in (three, two, one):
        s.add(q)
    plan = run_step(s)
    assert [q for q, _ in plan.scheduled] == [three]           # 3 + 2 > 4: two waits, and one behind it
    children = [seq([1, 2, 3], request_id=three.request_id) for _ in range(2)]
    for i, child in enumerate(children, start=1):
        child.index = i
        s.add_fork(three, child)
    assert seats(three) == 1 and s.seats_taken() == 3 and len(s.running) == 3
    assert child.block_table == three.block_table
    run_step(s)
    assert two.status is Status.WAITING
    s.finish(children[0])
    s.finish(children[1])
    plan = run_step(s)
    assert [q for q, _ in plan.scheduled] == [three, two, one]      # 1 + 2 + 1 seats


def test_chunked_prefill_splits_a_long_prompt_around_the_decodes():
    s = scheduler(num_blocks=64, max_num_batched_tokens=10, enable_chunked_prefill=True)
    short = seq([1, 2, 3])
    s.add(short)
    run_step(s)
    long = seq(range(100, 125))                              # 25 tokens
    s.add(long)
    chunks = []
    while long.num_computed_tokens < len(long.prompt_token_ids):
        plan = dict((q.request_id, n) for q, n in run_step(s).scheduled)
        assert plan[short.request_id] == 1 and sum(plan.values()) <= 10
        chunks.append(plan[long.request_id])
    assert chunks == [9, 9, 7]


def test_without_chunking_a_prompt_over_the_budget_waits_for_a_quiet_step():
    s = scheduler(num_blocks=64, max_num_batched_tokens=10, enable_chunked_prefill=False)
    busy = seq(range(1, 9))
    s.add(busy)
    run_step(s)
    waiting = seq(range(100, 110))                            # exactly the whole budget
    s.add(waiting)
    plan = run_step(s)
    assert [q for q, _ in plan.scheduled] == [busy] and not waiting.block_table
    s.finish(busy)
    assert run_step(s).scheduled == [(waiting, 10)]


def test_static_batching_admits_nobody_while_the_batch_runs():
    s = scheduler(max_num_seqs=2, cls=StaticBatchScheduler)
    a, b, c = seq([1, 2]), seq([3, 4]), seq([5, 6])
    for q in (a, b, c):
        s.add(q)
    assert [q for q, _ in run_step(s).scheduled] == [a, b]
    s.finish(a)
    assert [q for q, _ in run_step(s).scheduled] == [b]        # a's seat stays empty
    s.finish(b)
    assert [q for q, _ in run_step(s).scheduled] == [c]


def test_priority_preempts_the_lowest_ranked_for_a_seat():
    s = scheduler(max_num_seqs=2, scheduling_policy="priority")
    low, mid = seq([1, 2], priority=5), seq([3, 4], priority=1)
    s.add(low)
    s.add(mid)
    run_step(s)
    urgent = seq([5, 6], priority=0)
    s.add(urgent)
    plan = run_step(s)
    assert plan.preempted == [low] and low.status is Status.WAITING and not low.block_table
    assert {q.request_id for q, _ in plan.scheduled} == {mid.request_id, urgent.request_id}
    assert s.num_preemptions == 1 and s.num_recomputed_tokens == 2    # its prompt's K/V, dropped


def test_fcfs_ignores_priorities_and_keeps_arrival_order():
    s = scheduler(max_num_seqs=1)
    first, second = seq([1, 2], priority=9), seq([3, 4], priority=0)
    assert first.arrival < second.arrival
    s.add(second)
    s.add(first)            # queued later, arrived earlier: rank is by arrival, priority ignored
    assert [q for q, _ in run_step(s).scheduled] == [first]


def test_the_core_plans_like_the_engines_scheduler_when_nothing_needs_preempting():
    """Lesson 05's core and the engine's Scheduler (core + preemption, priorities, seats) agree
    step by step on an FCFS workload that fits: staggered arrivals, chunked prefill, a full seat count."""
    plans = []
    for cls in (ContinuousBatchingScheduler, Scheduler):
        s = scheduler(num_blocks=64, cls=cls, max_num_seqs=3, max_num_batched_tokens=10)
        prompts = [seq(range(100 * i, 100 * i + n)) for i, n in enumerate([4, 23, 3, 12, 7, 16], start=1)]
        steps = []
        for t in range(60):
            if t < len(prompts):
                s.add(prompts[t])
            plan = run_step(s)
            steps.append([(prompts.index(q), n) for q, n in plan.scheduled])
            for q, _ in plan.scheduled:
                if len(q.output_token_ids) >= 4:
                    s.finish(q)
        assert all(q.status is Status.FINISHED for q in prompts)
        plans.append(steps)
    assert plans[0] == plans[1]


def test_the_core_lets_a_running_sequence_wait_when_the_pool_is_full():
    s = scheduler(num_blocks=2, block_size=4, cls=ContinuousBatchingScheduler)
    a, b = seq([1, 2, 3, 4]), seq([5, 6, 7, 8])
    s.add(a)
    s.add(b)
    assert run_step(s).scheduled == [(a, 4), (b, 4)]        # one block each, the pool is full
    plan = run_step(s)                                      # each needs a second block: nobody runs
    assert plan.scheduled == [] and not plan.preempted and s.running == [a, b]
    s.finish(a)
    assert run_step(s).scheduled == [(b, 1)]                # a's block came back: b goes on
