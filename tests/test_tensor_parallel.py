"""Tensor parallelism (minillm/distributed/): ranks in their own processes on gloo, each holding
a shard of every layer. Greedy tokens equal tensor_parallel_size=1 (a first difference only as a
rounding tie, judged by transformers' logits, with the gap reported) on the tiny models through
prefix hits, chunked prefill and preemption in both modes, and seeded sampling gives the same
tokens; the embedded model at TP=3 in `LLM` and behind `serve` with the `openai` client; a
killed rank ends every request with an error and leaves no process behind, nor does the
engine's own process dying."""
import os
import signal
import subprocess
import sys
import time

import pytest

from openai import OpenAI

from minillm import LLM, LLMEngine, SamplingParams
from minillm.bench.server_process import ServerProcess, free_port
from minillm.config import EngineConfig
from minillm.models.reference import compare_greedy, transformers_twin

from conftest import get_model

SHARED = "You are a helpful assistant. Answer briefly and politely. " * 2
PROMPTS = [SHARED + "What is the capital of France?", SHARED + "Name three colours.", "one two three four five",
           SHARED + "Count to five."]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:                     # a zombie is dead, waiting to be reaped
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_gone(pids, seconds=15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def assert_same_greedy(model, prompt_ids_list, ours, reference):
    """TP tokens equal TP=1's, or differ first at a rounding tie (printed with its gap)."""
    twin = None
    for ids, a, b in zip(prompt_ids_list, ours, reference):
        if a != b:
            twin = twin or transformers_twin(model)
            print("first difference:", compare_greedy(twin, list(ids), a, b))     # raises if no tie


def test_a_size_that_does_not_divide_the_kv_heads_is_refused():
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")                      # 9 heads, 3 KV heads
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 must divide the model's 3 key/value heads.*\[1, 3\]"):
        LLMEngine(model, tokenizer, num_kv_blocks=16, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=0)


@pytest.mark.parametrize("name, mode", [("tiny-llama", "recompute"), ("tiny-qwen2", "swap")])
def test_greedy_and_seeded_tokens_equal_one_rank(name, mode):
    model, tokenizer, _ = get_model(name)
    options = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=24, preemption_mode=mode, max_num_seqs=4)
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.9, seed=5, ignore_eos=True, n=2),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, prompt_logprobs=2),
              SamplingParams(max_tokens=22, temperature=0, ignore_eos=True)]
    one = LLMEngine(model, tokenizer, **options)
    want = [[c.token_ids for c in o.outputs] for o in one.generate(PROMPTS, params)]
    tp = LLMEngine(model, tokenizer, tensor_parallel_size=2, **options)
    try:
        for _ in range(2):                                 # the second time the shared prefix is cached
            outs = tp.generate(PROMPTS, params)
            got = [[c.token_ids for c in o.outputs] for o in outs]
            assert got[1] == want[1]                       # seeded sampling: the same tokens
            assert_same_greedy(model, [o.prompt_token_ids for o in outs], [g[0] for g in got[::2]],
                               [w[0] for w in want[::2]])
        stats = tp.stats()
        assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_rate"] > 0
        assert stats["tensor_parallel_size"] == 2
        assert tp.block_manager.allocator.num_free == 24
        counters = tp.runner.counters()
        assert len(counters) == 2 and all(c["comm_calls"] > 0 and c["comm_bytes"] > 0 for c in counters)
    finally:
        tp.runner.close()


def test_each_rank_quantizes_its_shard():
    model, tokenizer, _ = get_model("tiny-llama")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    one = LLMEngine(model, tokenizer, num_kv_blocks=32, quantization="int8").generate(PROMPTS[:2], params)
    with LLM("tiny-llama", tensor_parallel_size=2, num_kv_blocks=32, quantization="int8") as llm:
        two = llm.generate(PROMPTS[:2], params, use_tqdm=False)
        pids = llm.llm_engine.runner.pids
    assert [o.outputs[0].token_ids[:8] for o in two] == [o.outputs[0].token_ids[:8] for o in one]
    assert not wait_gone(pids)                             # leaving the `with` stopped the ranks


def test_the_embedded_model_at_three_ranks_answers_chat_prompts_as_one():
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")
    chats = [[{"role": "user", "content": q}] for q in ("What is the capital of France?", "Say hello in Spanish.")]
    params = SamplingParams(max_tokens=24, temperature=0)
    ids = [tokenizer.apply_chat_template(c) for c in chats]
    one = LLMEngine(model, tokenizer, num_kv_blocks=64).generate(ids, params)
    with LLM(tensor_parallel_size=3, num_kv_blocks=64) as llm:
        three = llm.chat(chats, params, use_tqdm=False)
    assert_same_greedy(model, ids, [o.outputs[0].token_ids for o in three], [o.outputs[0].token_ids for o in one])
    port = free_port()                                     # the same over HTTP, with the openai client
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--tensor-parallel-size", "3",
               "--num-kv-blocks", "64"]
    with ServerProcess(command, port, ready_timeout=180) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        served = [client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=c, max_tokens=24,
                                                 temperature=0).choices[0].message.content for c in chats]
    assert served == [o.outputs[0].text for o in three]      # the same ranks, the same sums: the same text


def test_a_killed_rank_ends_every_request_with_an_error_and_leaves_no_process():
    model, tokenizer, _ = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4, tensor_parallel_size=2, max_num_seqs=2)
    pids = engine.runner.pids
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):                   # two run, two wait
        engine.add_request(f"r{i}", prompt, params)
    engine.step()
    os.kill(pids[1], signal.SIGKILL)
    start, finished = time.monotonic(), {}
    while engine.has_unfinished_requests() and time.monotonic() - start < 30:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert time.monotonic() - start < 30 and sorted(finished) == ["r0", "r1", "r2", "r3"]
    for out in finished.values():
        assert out.outputs[0].finish_reason == "error" and "rank 1 died" in out.error
    assert not wait_gone(pids)
    assert engine.block_manager.allocator.num_free == 64


ORPHAN = """
import sys, time
from minillm import LLMEngine
from minillm.models import load_model
model, tokenizer = load_model("tiny-llama", device="cpu")
engine = LLMEngine(model, tokenizer, num_kv_blocks=16, tensor_parallel_size=2)
print(*engine.runner.pids, flush=True)
time.sleep(600)
"""


def test_the_ranks_die_with_the_engines_process():
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    assert not wait_gone(pids), "a rank outlived the engine's process"


def test_bench_tp_splits_the_step_and_its_bytes_match_the_formula(tmp_path):
    from minillm.__main__ import main
    out = tmp_path / "tp.json"
    assert main(["bench", "tp", "--model", "tiny-llama", "--sizes", "1", "2", "--batch", "2", "--quick",
                 "--json", str(out)]) == 0
    import json
    report = json.loads(out.read_text())
    one, two = report["sizes"]
    assert one["tensor_parallel_size"] == 1 and two["tensor_parallel_size"] == 2
    assert two["comm_bytes_per_step"] == two["formula_bytes_per_step"]        # 2 all-reduces a layer, embedding, head
    assert two["collectives_per_step"] == 2 * 2 + 2 and 0 < two["comm_ms"] < two["step_ms"]
    assert report["plan_transport"]["pipe_us"] > 0 and report["plan_transport"]["gloo_broadcast_us"] > 0
