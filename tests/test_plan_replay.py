"""A step's plan is plain data: Sequence and SchedulerOutput pickle, and a runner in a fresh
process that replays the pickled plans of a real run (prefix hits, n > 1 forks, swaps out and
in, copy-on-write) computes the same logits. The tensor-parallel workers receive exactly this."""
import pickle
import subprocess
import sys

import torch

from minillm import LLMEngine, SamplingParams
from minillm.engine.sequence import Sequence

from conftest import get_model

OPTIONS = dict(block_size=4, num_kv_blocks=20, max_num_seqs=6, preemption_mode="swap", enable_prefix_caching=True)
SHARED = list(range(300, 312))
PROMPTS = [SHARED + [400 + i] * (2 + i) for i in range(5)]
PARAMS = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
          SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=10, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)]

REPLAY = """
import pickle, sys, torch
from minillm import LLMEngine
from minillm.models import load_model
torch.set_num_threads(1)
options, steps = pickle.load(open(sys.argv[1], "rb"))
model, tokenizer = load_model("tiny-llama", device="cpu")
runner = LLMEngine(model, tokenizer, **options).runner       # a fresh runner: its own pool, all zeros
results = []
for blob in steps:
    plan = pickle.loads(blob)
    runner.apply_block_ops(plan.block_ops)
    if plan.scheduled:
        seqs, logits, *_ = runner.execute(plan.scheduled)
        results.append(([s.seq_id for s in seqs], logits))
    else:
        results.append(None)
pickle.dump(results, open(sys.argv[2], "wb"))
"""


def test_a_sequence_pickles_as_plain_data():
    seq = Sequence(seq_id=3, request_id="r", prompt_token_ids=[1, 2, 3], params=SamplingParams(seed=1, stop=["x"]))
    seq.block_table, seq.output_token_ids = [4, 5], [9]
    copy = pickle.loads(pickle.dumps(seq))
    assert (copy.token_ids, copy.block_table, copy.params) == ([1, 2, 3, 9], [4, 5], seq.params)


def test_pickled_plans_replay_in_a_fresh_process_to_the_same_logits(tmp_path):
    model, tokenizer, _ = get_model("tiny-llama")
    torch.set_num_threads(1)
    engine = LLMEngine(model, tokenizer, **OPTIONS)
    steps, results = [], []
    plan_step, execute = engine.scheduler.plan_step, engine.runner.execute

    def recording_plan_step():
        plan = plan_step()
        steps.append(pickle.dumps(plan))          # as it leaves the scheduler, before the step runs
        results.append(None)
        return plan

    def recording_execute(scheduled):
        out = execute(scheduled)
        results[-1] = ([s.seq_id for s in out.samplers], out.logits.clone())
        return out

    engine.scheduler.plan_step, engine.runner.execute = recording_plan_step, recording_execute
    outs = engine.generate(PROMPTS, PARAMS)
    assert all(o.error is None for o in outs) and len(outs[1].outputs) == 2
    stats = engine.stats()
    assert stats["num_swapped_out_blocks"] and stats["num_swapped_in_blocks"], stats   # swaps happened
    assert stats["prefix_cache_hit_rate"] > 0 and stats["num_cow_copies"] > 0, stats   # hits and forks' copies
    (tmp_path / "in.pkl").write_bytes(pickle.dumps((OPTIONS, steps)))
    done = subprocess.run([sys.executable, "-c", REPLAY, str(tmp_path / "in.pkl"), str(tmp_path / "out.pkl")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    replayed = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert len(replayed) == len(results) > 10
    for i, (want, got) in enumerate(zip(results, replayed)):
        assert (want is None) == (got is None), i
        if want is not None:
            assert want[0] == got[0], i
            assert torch.allclose(want[1], got[1], atol=1e-5, rtol=0), (i, (want[1] - got[1]).abs().max())
