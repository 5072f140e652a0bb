"""The continuous-batching engine under memory pressure: preemption (recompute and swap),
priorities, chunked prefill, aborts, a soak, and the LLM front end."""
import random

import pytest

from minillm import LLM, SamplingParams
from minillm.baselines.static_batching import StaticBatchScheduler
from minillm.engine.engine import LLMEngine
from minillm.engine.scheduler import ContinuousBatchingScheduler, SchedulerOutput
from minillm.engine.sequence import Status
from minillm.models.reference import compare_greedy, reference_greedy

from conftest import get_model

GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


@pytest.fixture(scope="module")
def workload(tiny_llama):
    model, tokenizer, hf = tiny_llama
    rng = random.Random(0)
    shared = tokenizer.encode("A shared system prompt that several requests start with. " * 2)
    prompts = []
    for i in range(8):
        body = [rng.randrange(1000, 40000) for _ in range(rng.randint(3, 40))]
        prompts.append(shared + body if i % 2 else body)
    refs = [reference_greedy(hf, p, GREEDY.max_tokens) for p in prompts]
    return prompts, refs


def run_all(engine, prompts, params, priorities=None):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params if not isinstance(params, list) else params[i],
                           priority=priorities[i] if priorities else 0)
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
        assert steps < 5000, "engine made no progress"
    return [final[str(i)] for i in range(len(prompts))]


def assert_no_leak(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.allocator.num_blocks
    assert all(c == 0 for c in bm.allocator.ref_counts)
    if bm.cpu_allocator is not None:
        assert bm.cpu_allocator.num_free == bm.cpu_allocator.num_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_greedy_under_preemption_matches_transformers(tiny_llama, workload, mode, prefix_caching, chunked):
    model, tokenizer, hf = tiny_llama
    prompts, refs = workload
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=40, max_model_len=120,
                       preemption_mode=mode, enable_prefix_caching=prefix_caching,
                       enable_chunked_prefill=chunked, max_num_batched_tokens=24 if chunked else None)
    outs = run_all(engine, prompts, GREEDY)
    for p, out, ref in zip(prompts, outs, refs):
        compare_greedy(hf, p, out.outputs[0].token_ids, ref)
    stats = engine.stats()
    assert stats["num_preemptions"] >= 3, stats
    if mode == "swap":
        assert stats["num_swapped_out_blocks"] > 0
        assert stats["num_swapped_out_blocks"] == stats["num_swapped_in_blocks"]
    assert_no_leak(engine)


def test_chunked_prefill_mixes_prefill_and_decode_in_one_step(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=200, enable_chunked_prefill=True,
                       max_num_batched_tokens=16, max_model_len=256)
    engine.add_request("short", list(range(1000, 1005)), GREEDY)
    engine.step()                                        # prefill of "short"
    engine.add_request("long", list(range(2000, 2050)), GREEDY)
    plan_sizes = []
    for _ in range(3):
        engine.step()
        plan_sizes.append(sorted(n for _, n in engine.last_plan.scheduled))
    assert plan_sizes[0] == [1, 15]                      # one decode token + a 15-token chunk
    assert all(sum(s) <= 16 for s in plan_sizes)


def test_priority_request_overtakes_and_preempts(tiny_llama):
    model, tokenizer, hf = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=30, max_model_len=100,
                       scheduling_policy="priority", preemption_mode="swap")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"low{i}", [1000 + i] * 20, params, priority=5)
    for _ in range(3):
        engine.step()
    engine.add_request("urgent", [3000] * 40, params, priority=0)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished[0] == "urgent"
    assert engine.stats()["num_preemptions"] > 0
    assert_no_leak(engine)


def test_fcfs_finishes_in_arrival_order_for_equal_work(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=20, max_model_len=60, max_num_seqs=2)
    prompts = [[1000 + i] * 8 for i in range(6)]
    order = []
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    while engine.has_unfinished_requests():
        order += [int(o.request_id) for o in engine.step() if o.finished]
    assert order == sorted(order)


def test_seeded_sampling_same_alone_batched_preempted_swapped(tiny_llama):
    model, tokenizer, _ = tiny_llama
    rng = random.Random(3)
    prompts = [[rng.randrange(1000, 40000) for _ in range(rng.randint(5, 30))] for _ in range(6)]
    params = [SamplingParams(temperature=4.0, top_p=0.95, seed=100 + i, max_tokens=25, ignore_eos=True)
              for i in range(6)]
    alone = [run_all(LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=400), [p], [q])[0]
             for p, q in zip(prompts, params)]
    alone = [o.outputs[0].token_ids for o in alone]
    assert len({tuple(a) for a in alone}) == 6
    for mode in ("recompute", "swap"):
        engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=30, max_model_len=100,
                           preemption_mode=mode)
        outs = run_all(engine, prompts, params)
        assert engine.stats()["num_preemptions"] > 0
        assert [o.outputs[0].token_ids for o in outs] == alone, mode


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_soak_random_requests_with_aborts(tiny_llama, policy):
    """A few hundred random requests arriving over time, random priorities, some aborted
    midway, a pool that forces preemption: all others finish and nothing leaks. No
    starvation: under FCFS requests are first scheduled exactly in arrival order."""
    model, tokenizer, _ = tiny_llama
    rng = random.Random(1234)
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=48, max_model_len=96,
                       scheduling_policy=policy, preemption_mode="swap", swap_space=24,
                       enable_chunked_prefill=True, max_num_batched_tokens=64, max_num_seqs=16)
    total, next_id, step = 200, 0, 0
    arrival, done, aborted, live, first_scheduled, wanted = {}, {}, set(), set(), [], {}
    while next_id < total or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 3)):
            if next_id < total:
                rid = str(next_id)
                prompt = [rng.randrange(1000, 40000) for _ in range(rng.randint(1, 40))]
                params = SamplingParams(temperature=rng.choice([0, 1.0]), seed=next_id,
                                        max_tokens=rng.randint(1, 30), ignore_eos=True,
                                        n=rng.choice([1, 1, 1, 2]))
                engine.add_request(rid, prompt, params, priority=rng.randint(0, 3))
                wanted[rid] = (params.n, params.max_tokens)
                arrival[rid], next_id = step, next_id + 1
                live.add(rid)
        if live and rng.random() < 0.08:
            victim = rng.choice(sorted(live))
            engine.abort_request(victim)
            aborted.add(victim)
            live.discard(victim)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = step
                live.discard(out.request_id)
                n, max_tokens = wanted[out.request_id]
                assert len(out.outputs) == n
                assert all(len(o.token_ids) == max_tokens and o.finish_reason == "length" for o in out.outputs)
        for seq, _ in engine.last_plan.scheduled:
            if seq.request_id not in first_scheduled:
                first_scheduled.append(seq.request_id)
        step += 1
        assert step < 20000, "the soak stopped making progress"
    assert set(done) | aborted == set(arrival)
    assert not (set(done) & aborted)
    assert engine.stats()["num_preemptions"] > 0
    assert_no_leak(engine)
    if policy == "fcfs":
        assert [int(r) for r in first_scheduled] == sorted(int(r) for r in first_scheduled)


def test_add_request_refuses_what_can_never_fit(tiny_llama):
    model, tokenizer, _ = tiny_llama
    with pytest.raises(ValueError, match="raise num_kv_blocks to at least 50"):
        LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=10, max_model_len=200)   # asked: refused
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=10)
    assert engine.max_model_len == 40                      # not asked: what the pool holds, 10 blocks x 4
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("big", [1000] * 40, GREEDY)
    with pytest.raises(ValueError, match="lower max_tokens to at most 10"):
        engine.add_request("long", [1000] * 30, SamplingParams(max_tokens=11))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", [1000] * 5, GREEDY)
        engine.add_request("a", [1000] * 5, GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("b", [10 ** 9], GREEDY)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLMEngine(model, tokenizer, max_num_batched_tokens=16, max_model_len=64, num_kv_blocks=100,
                  enable_chunked_prefill=False)


@pytest.mark.parametrize("bad", [{"block_size": 0}, {"scheduling_policy": "lifo"},
                                 {"preemption_mode": "drop"}, {"dtype": "int8"}, {"device": "tpu"}])
def test_engine_options_validated(tiny_llama, bad):
    model, tokenizer, _ = tiny_llama
    with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
        LLMEngine(model, tokenizer, **bad)


def test_static_batching_baseline_waits_for_the_whole_batch(tiny_llama):
    model, tokenizer, hf = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=100, max_num_seqs=2,
                       scheduler_cls=StaticBatchScheduler)
    lens = [2, 12, 3]
    for i, n in enumerate(lens):
        engine.add_request(str(i), [1000 + i] * 5, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    admitted_at = {}
    step = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq, _ in engine.last_plan.scheduled:
            admitted_at.setdefault(seq.request_id, step)
        step += 1
    assert admitted_at["2"] >= 12             # had to wait for request 1, though request 0 ended at step 2


def test_llm_front_end(tiny_llama):
    model, tokenizer, hf = tiny_llama
    llm = LLM(model, tokenizer=tokenizer, block_size=8)
    text = "The capital of France is"
    outs = llm.generate([text, {"prompt_token_ids": tokenizer.encode(text)}], GREEDY, use_tqdm=False)
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)
    assert outs[0].prompt == text and outs[1].prompt is None
    assert outs[0].prompt_token_ids == outs[1].prompt_token_ids == tokenizer.encode(text)
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    compare_greedy(hf, outs[0].prompt_token_ids, outs[0].outputs[0].token_ids,
                   reference_greedy(hf, outs[0].prompt_token_ids, GREEDY.max_tokens))
    m = outs[0].metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time and m.num_preemptions == 0
    assert outs[0].outputs[0].finish_reason == "length"
    stats = llm.stats()
    for key in ("num_preemptions", "num_swapped_out_blocks", "num_swapped_in_blocks", "num_recomputed_tokens",
                "prefix_cache_hit_rate", "kv_blocks_used", "kv_blocks_total"):
        assert key in stats
    assert stats["kv_blocks_used"] == 0
    with pytest.raises(ValueError, match="unknown engine option"):
        LLM(model, tokenizer=tokenizer, block_sise=8)
    with pytest.raises(TypeError, match="prompt_token_ids"):
        llm.generate([{"tokens": [1]}], use_tqdm=False)


@pytest.mark.slow
def test_llm_chat_on_embedded_model():
    llm = LLM(block_size=16, num_kv_blocks=64)
    outs = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                    SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert "Paris" in outs[0].outputs[0].text
    assert outs[0].outputs[0].finish_reason == "stop"


def test_priority_request_takes_a_seat_when_max_num_seqs_is_full(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=400, max_num_seqs=2,
                       scheduling_policy="priority")
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"low{i}", [1000 + i] * 10, params, priority=5)
    engine.step()
    engine.add_request("urgent", [3000] * 10, params, priority=0)
    engine.step()
    assert any(s.request_id == "urgent" for s, _ in engine.last_plan.scheduled)
    assert engine.stats()["num_preemptions"] == 1
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished.index("urgent") < finished.index("low1")   # low1, the latest low, gave up its seat


def test_generate_never_takes_or_aborts_a_callers_request_id():
    """generate()'s own ids are checked against the engine's: a caller's "gen-3" (the id generate
    would pick first) keeps running and is delivered by step(), never aborted or lost."""
    from conftest import get_model
    model, tokenizer, _ = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for rid in ("gen-3", "gen-4", "gen-5"):     # the ids the counter reaches next (3 sequences taken)
        engine.add_request(rid, [7, 8, 9], params)
    outs = engine.generate([[7, 8, 9], [10, 11]], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5]
    assert not {o.request_id for o in outs} & {"gen-3", "gen-4", "gen-5"}
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert set(finished) == {"gen-3", "gen-4", "gen-5"}
    assert all(o.outputs[0].token_ids == outs[0].outputs[0].token_ids for o in finished.values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_abort_storm_of_300k_waiting_requests_drains_and_the_engine_serves_on(tiny_llama):
    """Finishing a waiting sequence is O(1) (the queue drops finished ones in one pass), so
    aborting 300k waiting requests takes about as long as adding them, not hours."""
    import time
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=1)
    ids = [f"r{i}" for i in range(300_000)]
    start = time.monotonic()
    for rid in ids:
        engine.add_request(rid, [5, 6, 7], params)
    added = time.monotonic() - start
    start = time.monotonic()
    for rid in reversed(ids):          # newest first: a queue scan would reach each at its end
        engine.abort_request(rid)
    aborted = time.monotonic() - start
    print(f"added 300k in {added:.1f} s, aborted them in {aborted:.1f} s")
    assert not engine.scheduler.waiting and not engine.has_unfinished_requests()
    assert not engine.output_processor.states
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_shutdown_ends_everything_and_frees_the_blocks(tiny_llama):
    model, tokenizer, _ = tiny_llama
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    with LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64) as engine:
        for i in range(3):
            engine.add_request(str(i), [5, 6, 7 + i], params)
        engine.step()
        assert engine.stats()["kv_blocks_used"] > 0
    assert not engine.has_unfinished_requests() and engine.stats()["kv_blocks_used"] == 0
    assert not engine.scheduler.waiting and not engine.scheduler.running and not engine.output_processor.states
    with LLM(model, tokenizer=tokenizer, block_size=4, num_kv_blocks=64) as llm:
        assert len(llm.generate([{"prompt_token_ids": [5, 6]}], params, use_tqdm=False)[0].outputs[0].token_ids) == 20
    assert llm.stats()["kv_blocks_used"] == 0


def test_a_logit_bias_id_outside_the_vocabulary_is_refused_at_the_door(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    with pytest.raises(ValueError, match="logit_bias names token id"):
        engine.add_request("r", [5, 6], SamplingParams(logit_bias={model.config.vocab_size: 1.0}))
    assert not engine.has_unfinished_requests()


# ---------------------------------------------------------------- a scheduler's plan, checked each step

SHORT = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

class BudgetsBeforeAllocate(ContinuousBatchingScheduler):
    """Lesson 05's classic mistake: a new prompt budgeted with seq.num_uncomputed_tokens read
    before allocate(); on a prefix-cache hit the plan feeds more tokens than are left."""

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
            n = seq.num_uncomputed_tokens                       # the mistake: the cached prefix counted
            if (n > budget and not self.chunked) or not self.bm.can_allocate(seq):
                break
            self.waiting.pop(0)
            self.bm.allocate(seq)
            self.bm.append_slots(seq, min(n, budget))
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, min(n, budget)))
            budget -= min(n, budget)
        return out


class NoAppendSlots(ContinuousBatchingScheduler):
    """Forgets append_slots for running sequences: a decode that crosses into a new block has no slot."""

    def schedule(self):
        real, self.bm.append_slots = self.bm.append_slots, lambda seq, n=1: None
        try:
            out = super().schedule()
        finally:
            self.bm.append_slots = real
        for seq, n in out.scheduled:
            if not seq.block_table:                               # a new prompt: allocate() gave its blocks
                real(seq, n)
        return out


@pytest.mark.parametrize("chunked", [False, True])
def test_a_plan_with_more_tokens_than_a_sequence_has_left_ends_that_request_naming_the_scheduler(tiny_llama,
                                                                                                 chunked):
    """Prefix-cache hits under the wrong scheduler: the engine refuses those plan entries (no shape error
    deep in attention), the message names the scheduler, and the other requests' tokens are exact."""
    model, tokenizer, _ = tiny_llama
    shared = list(range(1000, 1016))                              # 4 full blocks of 4
    prompts = {"0": shared + [7, 8, 9], "1": shared + [11, 12], "2": shared + [21, 22, 23, 24, 25],
               "3": list(range(3000, 3009))}
    options = dict(block_size=4, num_kv_blocks=64, max_num_seqs=4, enable_chunked_prefill=chunked,
                   max_num_batched_tokens=48, max_model_len=48)
    reference = LLMEngine(model, tokenizer, **options).generate(list(prompts.values()), SHORT)
    engine = LLMEngine(model, tokenizer, scheduler_cls=BudgetsBeforeAllocate, **options)
    engine.add_request("0", prompts["0"], SHORT)
    while engine.last_plan.scheduled == [] or engine.scheduler.running[0].num_computed_tokens < 16:
        engine.step()                                             # "0"'s prompt computed: its blocks cached
    final = {out.request_id: out for out in run_all_ids(engine, {k: v for k, v in prompts.items() if k != "0"})}
    for rid in ("1", "2"):
        out = final[rid].outputs[0]
        assert out.finish_reason == "error"
        assert (f"scheduler BudgetsBeforeAllocate planned {len(prompts[rid])} tokens for request '{rid}' but it "
                f"has only {len(prompts[rid]) - 16} left to compute") in final[rid].error
        assert "num_tokens_to_compute(seq)" in final[rid].error
    assert final["3"].outputs[0].token_ids == reference[3].outputs[0].token_ids
    assert final["3"].outputs[0].finish_reason == "length"
    assert_no_leak(engine)


def run_all_ids(engine, prompts: dict):
    for rid, p in prompts.items():
        engine.add_request(rid, p, SHORT)
    final, steps = [], 0
    while engine.has_unfinished_requests():
        final += [out for out in engine.step() if out.finished]
        steps += 1
        assert steps < 1000, "engine made no progress"
    return final


def test_a_plan_without_slots_for_its_tokens_ends_that_request_naming_the_scheduler(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, scheduler_cls=NoAppendSlots, block_size=4, num_kv_blocks=16)
    out, = engine.generate([list(range(1000, 1006))], SHORT)     # 6 tokens: 2 blocks, full at token 8
    assert out.outputs[0].finish_reason == "error"
    assert len(out.outputs[0].token_ids) == 3          # positions 6 and 7 had slots (8 in 2 blocks); 8 had none
    assert ("scheduler NoAppendSlots planned 1 token for request" in out.error
            and "after its 8 computed ones, but its block table has slots for 8: call "
                "block_manager.append_slots(seq, n)" in out.error)
    assert_no_leak(engine)
