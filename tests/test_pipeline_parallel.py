"""Pipeline parallelism (minillm/distributed/pipeline_executor.py): the layer split balanced by
cost, plans that cross to the ranks without pickle, and greedy tokens equal to one process's
on the tiny model at PP=2 (through prefix hits, chunked prefill, preemption by swap, n > 1) and
at TP=2 x PP=2; combinations not supported are refused by name."""
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
from minillm.distributed.partition import balanced_partition, layer_costs

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


def test_plans_cross_as_checked_plain_data_never_pickle():
    data = wire.encode("step", seqs=[{"id": 3, "start": 0, "tokens": [1, 2], "table": [7], "sample": True}])
    assert wire.decode(data) == ("step", {"seqs": [{"id": 3, "start": 0, "tokens": [1, 2], "table": [7], "sample": True}]})
    with pytest.raises(wire.WireError, match="pickled data"):
        wire.decode(pickle.dumps(("step", {"seqs": []})))
    for bad in (wire.MAGIC + b'{"kind": "exec", "code": "x"}', wire.MAGIC + b'{"kind": "step", "seqs": [{"id": "3"}]}',
                wire.MAGIC + b'{"kind": "block_ops", "swap_out": [[1]], "swap_in": [], "copies": []}', b"nonsense"):
        with pytest.raises(wire.WireError):
            wire.decode(bad)


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


def test_pp2_equals_one_process_through_chunked_prefill_prefix_hits_swap_and_n(reference):
    model, tokenizer = tiny_model()
    # 10 blocks of 16 tokens hold few of these sequences at once: the scheduler preempts (swap mode)
    engine = LLMEngine(model, tokenizer, num_kv_blocks=10, max_num_batched_tokens=32, pipeline_parallel_size=2,
                       preemption_mode="swap")
    try:
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == reference
        assert sum(o.metrics.num_preemptions for o in outs) > 0          # the swap road was taken
        two = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=6, temperature=0, n=2))[0]
        assert [c.token_ids for c in two.outputs] == [reference[0][:6]] * 2
        assert engine.runner.failure() is None
    finally:
        engine.runner.close()


SCRIPT = """
from minillm import LLMEngine, SamplingParams
from minillm.checks.harness import tiny_model
from tests.test_pipeline_parallel import PROMPTS, GREEDY
model, tokenizer = tiny_model()
engine = LLMEngine(model, tokenizer, num_kv_blocks=64, max_num_batched_tokens=32, pipeline_parallel_size=2,
                   tensor_parallel_size=2)
print("ranks", len(engine.runner.pids))
print("tokens", [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)])
engine.runner.close()
"""


def test_tp2_x_pp2_from_a_script_without_a_main_guard_equals_one_process(reference, tmp_path):
    """The ranks start with `python -m`, not multiprocessing's spawn, so a script with no
    `if __name__ == "__main__":` (what a learner writes) runs, at TP=2 x PP=2."""
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("ranks", "tokens")))
    assert lines["ranks"] == "4"
    assert ast.literal_eval(lines["tokens"]) == reference


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
