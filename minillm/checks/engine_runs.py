"""What the graders of lessons 03-06 share: runs of the real engine on the tiny random
Llama with the learner's piece plugged in, compared with the reference engine's runs of
the same prompts (computed once per session), and Sequences driven through a
BlockManager the way the engine would, without a model. Engine runs go through
`engine.step()` with a step limit, so a scheduler that never schedules fails with a
message instead of hanging the notebook; a request the engine ended with an error (a plan
the engine refused: it names the scheduler) fails with the engine's message.
"""
from __future__ import annotations

import itertools

from ..sampling_params import SamplingParams
from .harness import Grader, expect, greedy_tie, tiny_model


# Prompts of 1, 5, 15, 4 and 7 tokens: with block_size 4 and 8 blocks, running them
# together for 8 tokens each forces preemption (the pool holds 32 slots).
PROMPTS = ["Hi", "The capital of France is", "Once upon a time, in a small village by the sea, there lived",
           "List three colors:", "def f(x):\n    return"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SMALL_POOL = dict(num_kv_blocks=8, block_size=4, max_num_seqs=4)
AMPLE_POOL = dict(num_kv_blocks=64, block_size=4)
_request_ids = itertools.count()


def make_engine(g, label: str, **kwargs):
    from ..engine.engine import LLMEngine
    model, tokenizer = tiny_model()
    with g.case(f"constructing LLMEngine({label})"):
        return LLMEngine(model, tokenizer, **kwargs)


def drive(g, engine, prompts, params, label: str, stuck_hint: str, max_steps: int = 400):
    """Run prompts to the end with engine.step(); fail (not hang) if they never finish."""
    ids, final = [], {}
    with g.case(f"running LLMEngine({label})"):
        for p in prompts:
            ids.append(f"check-{next(_request_ids)}")
            engine.add_request(ids[-1], p, params)
        for _ in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out
    if engine.has_unfinished_requests():
        s, bm = engine.scheduler, engine.block_manager
        raise AssertionError(
            f"LLMEngine({label}) did not finish {len(prompts)} short requests in {max_steps} steps "
            f"({len(s.waiting)} waiting, {len(s.running)} running, {len(s.swapped)} swapped, "
            f"{bm.num_free_blocks} of {bm.allocator.num_blocks} blocks free): {stuck_hint}")
    failed = next((final[r] for r in ids if final[r].error is not None), None)
    expect(failed is None, f"LLMEngine({label}) ended a request with an error instead of tokens: "
                           f"{failed.error if failed else ''}")
    return [final[r] for r in ids]


_REFERENCE_RUNS: dict = {}


def reference_run(prompts, params, **options):
    """The reference engine's outputs for the same prompts (no learner class involved),
    computed once per session: they are deterministic and several graders share them."""
    key = (repr(prompts), repr(params), repr(sorted(options.items())))
    if key not in _REFERENCE_RUNS:
        g = Grader("reference", "the reference engine")
        _REFERENCE_RUNS[key] = drive(g, make_engine(g, "reference", **options), prompts, params, "reference",
                                     "reference bug")
    return _REFERENCE_RUNS[key]


def compare_runs(prompts, ours, reference, label: str, hint: str, greedy: bool = True) -> None:
    """Same tokens as the reference run; for greedy decoding a float-rounding tie at the first
    difference is accepted (the course's rule: "Correctness contract", in the README's Tests
    section)."""
    model, _ = tiny_model()
    for prompt, a, b in zip(prompts, ours, reference):
        expect(len(a.outputs) == len(b.outputs), f"LLMEngine({label}) returned {len(a.outputs)} samples for "
                                                 f"{_short(prompt)}, expected {len(b.outputs)}")
        for ca, cb in zip(a.outputs, b.outputs):
            mine, ref = list(ca.token_ids), list(cb.token_ids)
            if mine == ref:
                continue
            if greedy and greedy_tie(model, list(b.prompt_token_ids), mine, ref):
                continue
            which = f" (sample {ca.index})" if len(a.outputs) > 1 else ""
            raise AssertionError(f"LLMEngine({label}) generated {mine} for {_short(prompt)}{which}; the reference "
                                 f"gives {ref}: {hint}")


def _short(prompt) -> str:
    if isinstance(prompt, str):
        return repr(prompt if len(prompt) < 40 else prompt[:37] + "...")
    return f"a {len(prompt)}-token prompt"


def expect_no_leak(engine, label: str, hint: str) -> None:
    bm = engine.block_manager
    for name, a in (("device", bm.allocator), ("CPU", bm.cpu_allocator)):
        if a is None:
            continue
        held = [b for b in range(a.num_blocks) if a.ref_counts[b] != 0]
        expect(not held and a.num_free == a.num_blocks,
               f"after LLMEngine({label}) finished every request, {name} blocks are leaked: num_free is "
               f"{a.num_free} of {a.num_blocks}, ref counts not 0 at blocks {held[:8]}: {hint}")


class Seqs:
    """Deterministic Sequences for driving a BlockManager or a Scheduler without a model."""

    def __init__(self):
        self.ids = itertools.count()

    def new(self, prompt, max_tokens: int = 16, priority: int = 0, arrival: float | None = None, output=()):
        from ..engine.sequence import Sequence
        i = next(self.ids)
        return Sequence(i, f"r{i}", list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens),
                        output_token_ids=list(output), priority=priority,
                        arrival=float(i) if arrival is None else arrival)


def compute(bm, seq, outputs=()) -> None:
    """Allocate `seq` and run it like the engine would: its prompt computed, then one decode
    step per output token but the last (which waits for the next step, as in a running decode)."""
    bm.allocate(seq)
    bm.append_slots(seq, seq.num_uncomputed_tokens)
    bm.mark_computed(seq, seq.num_uncomputed_tokens)
    for i, t in enumerate(outputs):
        seq.output_token_ids.append(t)
        if i < len(outputs) - 1:
            bm.append_slots(seq, 1)
            bm.mark_computed(seq, 1)
    bm.take_ops()
