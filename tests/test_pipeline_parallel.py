"""Pipeline parallelism (minillm/distributed/pipeline_executor.py): the layer split balanced by
cost, the step cut into micro-batches, plans that cross to the ranks without pickle, and greedy
tokens equal to one process's on the tiny model with micro-batches in flight, at PP=2 (through
prefix hits, chunked prefill, preemption by swap, n > 1) and at TP=2 x PP=2 (preemption by
recompute); the ranks' trace shows the stages overlapping; combinations not supported are
refused by name."""
import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from minillm import LLMEngine, SamplingParams
from minillm.checks.harness import tiny_model
from minillm.checks.lesson10_partition import check_balanced_partition
from minillm.distributed import wire
from minillm.distributed.partition import balanced_partition, layer_costs, micro_batches

SHARED = "the quick brown fox jumps over the lazy dog and then " * 3
PROMPTS = [SHARED + "runs away", SHARED + "sleeps", "one two three four five", "hello", SHARED + "eats"]
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def test_balanced_partition_is_optimal_and_contiguous():
    assert balanced_partition([1, 1, 1, 1, 3], 2) == [range(0, 3), range(3, 5)]
    assert balanced_partition([1.0] * 30, 2) == [range(0, 15), range(15, 30)]
    assert balanced_partition([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    assert check_balanced_partition(balanced_partition)          # lesson 10's grader: 300 random cases too
    for stages in (0, 4):
        with pytest.raises(ValueError):
            balanced_partition([1.0, 2.0, 3.0], stages)


def test_layer_costs_put_the_head_on_the_last_layer():
    model, _ = tiny_model()
    costs = layer_costs(model)
    assert len(costs) == model.config.num_hidden_layers
    assert costs[-1] - costs[0] == model.lm_head.weight.numel()


def test_a_step_is_cut_into_contiguous_micro_batches_balanced_by_tokens():
    assert micro_batches([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert micro_batches([30, 1, 1], 2) == [range(0, 1), range(1, 3)]           # a prefill chunk travels alone
    assert micro_batches([1, 1, 30], 2) == [range(0, 2), range(2, 3)]
    assert micro_batches([1] * 9, 4) == [range(0, 3), range(3, 5), range(5, 7), range(7, 9)]
    assert micro_batches([5], 2) == [range(0, 1)] and micro_batches([], 2) == []
    assert micro_batches([3, 1, 1], 1) == [range(0, 3)]
    for tokens in ([1, 2, 3, 40, 1, 1, 7], [9] * 7, [1, 50, 1, 1]):
        for m in (1, 2, 3, 7, 9):
            parts = micro_batches(tokens, m)
            assert len(parts) == min(m, len(tokens)) and all(len(r) for r in parts)
            assert [i for r in parts for i in r] == list(range(len(tokens)))
    with pytest.raises(ValueError, match="micro-batches"):
        micro_batches([1, 1], 0)


def test_plans_cross_as_checked_plain_data_never_pickle():
    seqs = [{"id": 3, "start": 0, "tokens": [1, 2], "table": [7], "sample": True},
            {"id": 4, "start": 5, "tokens": [9], "table": [8], "sample": True}]
    data = wire.encode("step", seqs=seqs, micro=[1, 1])
    assert wire.decode(data) == ("step", {"seqs": seqs, "micro": [1, 1]})
    with pytest.raises(wire.WireError, match="pickled data"):
        wire.decode(pickle.dumps(("step", {"seqs": []})))
    for bad in (wire.MAGIC + b'{"kind": "exec", "code": "x"}', wire.MAGIC + b'{"kind": "step", "seqs": [{"id": "3"}]}',
                wire.MAGIC + b'{"kind": "block_ops", "swap_out": [[1]], "swap_in": [], "copies": []}', b"nonsense"):
        with pytest.raises(wire.WireError):
            wire.decode(bad)
    for micro in ([2, 1], [0, 2], [2.0]):                 # the micro-batches must cover the sequences exactly
        with pytest.raises(wire.WireError, match="micro-batch"):
            wire.decode(wire.encode("step", _checked=False, seqs=seqs, micro=micro))


@pytest.fixture(scope="module")
def reference():
    model, tokenizer = tiny_model()
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, max_num_batched_tokens=32)
    return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]


def run(engine):
    try:
        return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.runner.close()


def overlaps(reports: list[dict]) -> tuple[int, int]:
    """From the ranks' trace at PP=2 (TP rank 0 of each stage): (micro-batch pairs, pairs where stage
    0 took k+1 in before stage 1 let k out). Checks the causal order on the way: a micro-batch enters
    a stage before it leaves it and leaves stage 0 before it enters stage 1."""
    ticket = {(r["stage"], step, k, what): n for r in reports if r["rank"] in (1, 2) for n, step, k, what in r["events"]}
    pairs = overlapped = 0
    for (stage, step, k, what), n in ticket.items():
        if stage == 0 and what == "out":
            assert ticket[0, step, k, "in"] < n < ticket[1, step, k, "in"] < ticket[1, step, k, "out"]
            if (0, step, k + 1, "in") in ticket:
                pairs += 1
                overlapped += ticket[0, step, k + 1, "in"] < ticket[1, step, k, "out"]
    return pairs, overlapped


def test_pp2_micro_batches_equal_one_process_through_chunked_prefill_prefix_hits_swap_and_n(reference):
    model, tokenizer = tiny_model()
    # 10 blocks of 16 tokens hold few of these sequences at once: the scheduler preempts (swap mode)
    engine = LLMEngine(model, tokenizer, num_kv_blocks=10, max_num_batched_tokens=32, pipeline_parallel_size=2,
                       preemption_mode="swap")
    try:
        assert engine.runner.micro_batches == 2
        engine.runner.trace(True)
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == reference
        assert sum(o.metrics.num_preemptions for o in outs) > 0          # the swap road was taken
        reports = engine.runner.counters()
        assert all(r["micro_batches"] > r["steps"] for r in reports)     # steps went down the pipe in 2 pieces
        pairs, overlapped = overlaps(reports)
        # an ordering fact, not a timing: stage 0 was computing micro-batch k+1 while stage 1 still had k
        assert pairs > 10 and overlapped > 0, (pairs, overlapped)
        engine.runner.trace(False)
        two = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=6, temperature=0, n=2))[0]   # 2 samples, 2 micro-batches
        assert [c.token_ids for c in two.outputs] == [reference[0][:6]] * 2
        with pytest.raises(ValueError, match="micro_batches must be an int >= 1"):
            engine.runner.micro_batches = 0
        engine.runner.micro_batches = 1                                   # the stages take turns: the same tokens
        assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS[:3], GREEDY)] == reference[:3]
        assert engine.runner.counters()[0]["events"] == []                 # the trace was off
        assert engine.runner.failure() is None
    finally:
        engine.runner.close()


SCRIPT = """
from minillm import LLMEngine, SamplingParams
from minillm.checks.harness import tiny_model
from tests.test_pipeline_parallel import PROMPTS, GREEDY
model, tokenizer = tiny_model()
engine = LLMEngine(model, tokenizer, num_kv_blocks=10, max_num_batched_tokens=32, pipeline_parallel_size=2,
                   tensor_parallel_size=2)
print("ranks", len(engine.runner.pids))
outs = engine.generate(PROMPTS, GREEDY)
print("tokens", [o.outputs[0].token_ids for o in outs])
print("preempted", sum(o.metrics.num_preemptions for o in outs))
print("pieces", min(r["micro_batches"] - r["steps"] for r in engine.runner.counters()))
engine.runner.close()
"""


def test_tp2_x_pp2_from_a_script_without_a_main_guard_equals_one_process(reference, tmp_path):
    """The ranks start with `python -m`, not multiprocessing's spawn, so a script with no
    `if __name__ == "__main__":` (what a learner writes) runs, at TP=2 x PP=2 with micro-batches
    in flight and preemption by recompute (10 blocks)."""
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith(("ranks", "tokens", "preempted", "pieces")))
    assert lines["ranks"] == "4"
    assert ast.literal_eval(lines["tokens"]) == reference
    assert int(lines["preempted"]) > 0 and int(lines["pieces"]) > 0     # recompute taken; steps cut in 2 on every rank


@pytest.mark.parametrize("option, name", [({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
                                           "speculative_config"), ({"compile": True}, "compile"),
                                          ({"quantization": "int8"}, "quantization")])
def test_unsupported_combinations_are_refused_by_name(option, name):
    model, tokenizer = tiny_model()
    with pytest.raises(ValueError, match=f"{name} .*not supported with pipeline_parallel_size"):
        LLMEngine(model, tokenizer, num_kv_blocks=16, pipeline_parallel_size=2, **option)


@pytest.mark.parametrize("rank_token", ["the-secret", "a-guess"])
def test_only_a_rank_that_knows_the_token_is_admitted(rank_token):
    """The rendezvous (world.py): the driver admits a rank only with an HMAC of its nonce under the
    shared token; a stranger is refused by name, and told so (it never joins a group)."""
    import threading

    from minillm.distributed.world import PipelineError, admit, host_store, join_store, prove
    from minillm.utils.ports import free_port
    port = free_port()
    store = host_store("127.0.0.1", port, 10.0)
    seen = {}

    def rank():
        try:
            prove(join_store("127.0.0.1", port, 10.0), 1, rank_token)
            seen["rank"] = "admitted"
        except PipelineError as e:
            seen["rank"] = str(e)
    thread = threading.Thread(target=rank)
    thread.start()
    if rank_token == "the-secret":
        admit(store, [1], "the-secret", 10.0)
    else:
        with pytest.raises(PipelineError, match="rank 1 presented a wrong token"):
            admit(store, [1], "the-secret", 10.0)
    thread.join(10)
    if rank_token == "the-secret":
        assert seen["rank"] == "admitted"
    else:
        assert "does not know our MINILLM_DIST_TOKEN" in seen["rank"]
