"""A fault inside one request's work ends that request with an error and frees its blocks;
every other request gets exactly the tokens it gets in a run with no fault.

Each test injects a fault at one stage of `step()` (block moves, the model, the sampler,
the stop check, the computed-token bookkeeping, forking), on a pool small enough that
requests are preempted (swapped to CPU and back) and share cached prefixes, with greedy
and seeded sampling mixed in one batch.
"""
import pytest
import torch

import minillm.engine.engine as engine_module
from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams

from conftest import get_model

SHARED = list(range(2000, 2012))                 # a 12-token prefix, three blocks of 4
PROMPTS = {f"r{i}": SHARED[: 4 * (i % 3)] + list(range(3000 + 50 * i, 3000 + 50 * i + 5 + 3 * i))
           for i in range(6)}
PARAMS = {
    "r0": SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
    "r1": SamplingParams(temperature=0.9, seed=11, max_tokens=20, ignore_eos=True),
    "r2": SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
    "r3": SamplingParams(temperature=1.2, top_p=0.9, seed=13, max_tokens=18, ignore_eos=True),
    "r4": SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=12, ignore_eos=True),
    "r5": SamplingParams(temperature=0, max_tokens=22, ignore_eos=True),
}
OPTIONS = dict(block_size=4, num_kv_blocks=24, max_num_seqs=6, preemption_mode="swap",
               enable_prefix_caching=True)


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


def make_engine(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, **OPTIONS)
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, PARAMS[rid])
    return engine


def drain(engine) -> dict:
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
        assert steps < 2000, "the engine made no progress"
    return final


def tokens(out):
    return [o.token_ids for o in out.outputs]


@pytest.fixture(scope="module")
def clean_run(tiny_llama):
    engine = make_engine(tiny_llama)
    final = drain(engine)
    stats = engine.stats()
    assert stats["num_preemptions"] > 0 and stats["num_swapped_out_blocks"] > 0, stats   # the pool is tight
    assert all(o.error is None for o in final.values())
    return {rid: tokens(out) for rid, out in final.items()}


def assert_only_these_failed(engine, final, clean_run, failed: set, stage: str):
    assert set(final) == set(PROMPTS)
    for rid, out in final.items():
        if rid in failed:
            assert out.error is not None and stage in out.error, (rid, out.error)
            assert {o.finish_reason for o in out.outputs} == {"error"}
        else:
            assert out.error is None, (rid, out.error)
            assert tokens(out) == clean_run[rid], rid
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.allocator.num_blocks, "a failed request leaked device blocks"
    assert bm.cpu_allocator.num_free == bm.cpu_allocator.num_blocks, "a failed request leaked CPU blocks"
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.scheduler.swapped
    # and the engine still serves: a new request runs to the end with the clean run's tokens
    engine.add_request("after", PROMPTS["r0"], PARAMS["r0"])
    assert tokens(drain(engine)["after"]) == clean_run["r0"]


def test_model_fault_in_one_request_ends_only_that_request(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    marker = PROMPTS["r2"][-1]
    real = engine.runner.execute

    def execute(scheduled):
        # r2's work poisons any batch it is in (a kernel error on its input, say)
        if any(seq.request_id == "r2" and seq.num_computed_tokens > 8 for seq, _ in scheduled):
            raise RuntimeError(f"kernel error on token {marker}")
        return real(scheduled)

    engine.runner.execute = execute
    final = drain(engine)
    assert_only_these_failed(engine, final, clean_run, {"r2"}, "the model failed")


def test_transient_model_fault_is_retried_and_nobody_fails(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    real, calls = engine.runner.execute, [0]

    def execute(scheduled):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("a one-off fault in a batched forward")
        return real(scheduled)

    engine.runner.execute = execute
    final = drain(engine)
    assert calls[0] > 5
    assert_only_these_failed(engine, final, clean_run, set(), "")


def test_sampler_fault_in_one_row_keeps_the_seeded_rows_exact(tiny_llama, clean_run, monkeypatch):
    real, bad = engine_module.sample, PARAMS["r3"]
    calls = [0]

    def sample(logits, params, generators):
        calls[0] += 1
        if calls[0] >= 4 and any(p is bad for p in params):
            out = real(logits, params, generators)     # the draws happen (generators advance) ...
            raise FloatingPointError("overflow in r3's row")    # ... then the batch call fails
        return real(logits, params, generators)

    monkeypatch.setattr(engine_module, "sample", sample)
    engine = make_engine(tiny_llama)
    final = drain(engine)
    assert_only_these_failed(engine, final, clean_run, {"r3"}, "sampling failed")


def test_stop_check_fault_ends_its_request(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    stopper = engine.output_processor.stop_checker(engine.requests["r1"].seqs[0])
    real = stopper.check

    def check(ids):
        if len(ids) == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a tokenizer error")
        return real(ids)

    stopper.check = check
    final = drain(engine)
    assert_only_these_failed(engine, final, clean_run, {"r1"}, "checking stop conditions failed")


def test_block_move_fault_ends_the_requests_it_moved(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    real, hit = engine.kv_cache.apply, set()

    def apply(ops):
        if ops.swap_out and not hit:                   # the first swap-out copy fails
            hit.update(s.request_id for s in engine.last_plan.preempted)
            hit.update(s.request_id for s, _ in engine.last_plan.scheduled)
            raise RuntimeError("copy to host failed")
        return real(ops)

    engine.kv_cache.apply = apply
    final = drain(engine)
    assert hit and hit != set(PROMPTS), "the fault should hit some requests, not all"
    assert_only_these_failed(engine, final, clean_run, hit, "moving KV blocks failed")


def test_bookkeeping_and_fork_faults(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    real_mark, real_fork = engine.block_manager.mark_computed, engine.scheduler.add_fork

    def mark_computed(seq, n):
        if seq.request_id == "r5" and seq.num_computed_tokens > 10:
            raise KeyError("prefix cache corrupted")
        return real_mark(seq, n)

    def add_fork(parent, child):
        if parent.request_id == "r4":
            raise MemoryError("no room to fork")
        return real_fork(parent, child)

    engine.block_manager.mark_computed = mark_computed
    engine.scheduler.add_fork = add_fork
    final = drain(engine)
    assert final["r4"].error.startswith("forking failed")
    assert_only_these_failed(engine, final, clean_run, {"r4", "r5"}, "failed")


def test_an_interrupt_mid_step_leaves_a_consistent_engine(tiny_llama, clean_run):
    engine = make_engine(tiny_llama)
    real, calls = engine.runner.execute, [0]

    def execute(scheduled):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(scheduled)

    engine.runner.execute = execute
    engine.step()
    engine.step()
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    final = drain(engine)          # the interrupted step's outputs come with the next step()
    hit = {rid for rid, out in final.items() if out.error}
    assert hit, "the interrupted step's requests end with an error"
    assert_only_these_failed(engine, final, clean_run, hit, "the step failed")


def test_errors_reach_llm_generate_without_losing_the_others(tiny_llama, clean_run, monkeypatch):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, **OPTIONS)
    real = engine_module.sample

    def sample(logits, params, generators):
        if any(p.seed == 13 for p in params):
            raise ValueError("bad parameter slipped through")
        return real(logits, params, generators)

    monkeypatch.setattr(engine_module, "sample", sample)
    outs = engine.generate(list(PROMPTS.values()), list(PARAMS.values()))
    for rid, out in zip(PROMPTS, outs):
        if rid == "r3":
            assert out.outputs[0].finish_reason == "error" and "bad parameter" in out.error
        else:
            assert tokens(out) == clean_run[rid]
    assert engine.stats()["kv_blocks_used"] == 0
    assert torch.is_tensor(engine.kv_cache.k[0])
