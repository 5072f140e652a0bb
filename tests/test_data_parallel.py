"""`serve --data-parallel-size N`: replicas behind a routing front (minillm/server/data_parallel/).

The routing pieces are tested alone (the decision, the prefix tree, the router, the routing
text, the metrics' totals); then real fronts with real replica processes, through the `openai`
client: the embedded SmolLM2 where the texts matter (they equal one engine's), tiny-llama
where the mechanism does (cache-aware beats round-robin on the prefix-cache hit rate measured
by the replicas; a killed replica's requests fail and the rest go on; no replica outlives its
front). The tiny front's tests run in file order: the last two kill a replica, then the front.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from minillm.bench.server_process import ServerProcess, free_port
from minillm.bench.shared_prefix import shared_prefix_workload
from minillm.server.data_parallel.choice import choose_replica
from minillm.server.data_parallel.metrics import hit_rate_between, merge, prefix_cache_tokens
from minillm.server.data_parallel.prefix_tree import PrefixTree, chunk_keys
from minillm.server.data_parallel.prompts import routing_text
from minillm.server.data_parallel.router import NoReplica, Router

KEY = "dp-key"


# -- the decision (lesson 10's exercise) ------------------------------------------------------
def test_the_longest_match_wins_within_the_load_bound():
    assert choose_replica([0, 48, 16], [0, 3, 0], load_bound=4) == 1
    assert choose_replica([0, 48, 16], [0, 4, 0], load_bound=4) == 1          # 4 ahead: still within
    assert choose_replica([0, 48, 16], [2, 6, 3], load_bound=4) == 1          # measured from the least loaded


def test_past_the_load_bound_the_least_loaded_gets_it():
    assert choose_replica([0, 48, 16], [0, 5, 0], load_bound=4) == 0          # least loaded, lowest index
    assert choose_replica([0, 48, 16], [1, 6, 2], load_bound=4) == 0
    assert choose_replica([64, 0, 0], [9, 3, 1], load_bound=4) == 2
    assert choose_replica([64, 0], [1, 0], load_bound=0) == 1


def test_ties_go_to_the_least_loaded_then_the_lowest_index():
    assert choose_replica([0, 0, 0], [2, 1, 1], load_bound=8) == 1            # no match: the least loaded
    assert choose_replica([32, 32, 0], [3, 2, 0], load_bound=8) == 1          # equal matches: fewer in flight
    assert choose_replica([32, 32], [1, 1], load_bound=8) == 0
    with pytest.raises(ValueError):
        choose_replica([1, 2], [0], load_bound=1)


# -- the prefix tree, the router, the routing text ---------------------------------------------
def test_prefix_tree_matches_whole_chunks_and_forgets_leaves_first():
    tree = PrefixTree(max_chunks=6, chunk_chars=4)
    a = "abcdefghijklmnop"                                   # 4 chunks
    tree.insert(chunk_keys(a, 4))
    assert tree.match(chunk_keys(a + "XYZW", 4)) == 16
    assert tree.match(chunk_keys("abcdefgXijkl", 4)) == 4    # diverges in the second chunk
    assert tree.match(chunk_keys("Xbcdefgh", 4)) == 0
    assert tree.match(chunk_keys("abc", 4)) == 0             # no whole chunk
    tree.insert(chunk_keys("qrstuvwx", 4))                   # 2 more: 6, at the bound
    tree.insert(chunk_keys("abcdQQQQ", 4))                   # 1 new chunk: the oldest leaf goes
    assert len(tree) == 6
    assert tree.match(chunk_keys(a, 4)) == 12                # a's deepest chunk, not its first ones
    assert tree.match(chunk_keys("abcdQQQQ", 4)) == 8 and tree.match(chunk_keys("qrstuvwx", 4)) == 8


def test_round_robin_takes_turns_among_replicas_up():
    router = Router(3, "round-robin")
    assert [router.route("x").replica for _ in range(4)] == [0, 1, 2, 0]
    router.set_up(2, False)
    assert [router.route("x").replica for _ in range(3)] == [1, 0, 1]
    assert router.in_flight == [3, 3, 1] and router.routed == [3, 3, 1]
    router.done(0)
    assert router.in_flight[0] == 2


def test_cache_aware_keeps_a_prefix_on_its_replica_until_the_load_bound():
    router = Router(2, "cache-aware", load_bound=1)
    system = "You are a helpful assistant. " * 4
    first = router.route(system + "Q1")
    assert first.replica == 0 and first.matched_chars == 0
    other = router.route("A different prompt entirely, long enough to be chunked.")
    assert other.replica == 1                                # no match anywhere: the least loaded
    again = [router.route(system + f"Q{i}") for i in range(2, 5)]
    assert [r.replica for r in again] == [0, 0, 1]           # 0 would be 2 ahead of 1 by the third: bound 1
    assert again[0].matched_chars >= len(system) - 16
    router.set_up(0, False)
    assert router.route(system).replica == 1
    with pytest.raises(NoReplica):
        router.route(system, exclude=frozenset({1}))


def test_routing_text_of_completions_and_chats():
    assert routing_text("/v1/completions", b'{"prompt": "Hello", "max_tokens": 3}') == "Hello"
    assert routing_text("/v1/completions", b'{"prompt": ["A", "B"]}') == "A"
    assert routing_text("/v1/completions", b'{"prompt": [1, 2, 3]}') == "1 2 3 "
    chat = routing_text("/v1/chat/completions", b'{"messages": [{"role": "system", "content": "Be brief."}, '
                                                b'{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}')
    assert chat == "system: Be brief.\nuser: Hi\n"
    assert routing_text("/v1/completions", b"not json") is None
    assert routing_text("/v1/chat/completions", b'{"messages": 3}') is None


def test_metrics_are_relabelled_and_totalled():
    def replica(rate, prompt_tokens, running):
        return (f"# TYPE minillm:prefix_cache_hit_rate gauge\nminillm:prefix_cache_hit_rate {rate}\n"
                f"# TYPE minillm:prompt_tokens counter\nminillm:prompt_tokens_total {prompt_tokens}\n"
                f"# TYPE minillm:num_requests_running gauge\nminillm:num_requests_running {running}\n"
                f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} {rate}\n")
    text = merge({0: replica(0.5, 100, 2), 1: replica(0.0, 300, 1)}).decode()
    assert 'minillm:num_requests_running{replica="1"} 1.0' in text
    assert 'minillm:num_requests_running{replica="total"} 3.0' in text
    assert 'minillm:prompt_tokens_total{replica="total"} 400.0' in text
    assert 'minillm:prefix_cache_hit_rate{replica="total"} 0.125' in text     # 50 hits of 400 tokens
    assert 'vllm:kv_cache_usage_perc{model_name="m",replica="total"} 0.25' in text     # a ratio: averaged
    tokens = prefix_cache_tokens(text)
    assert tokens == {"0": (50.0, 100.0), "1": (0.0, 300.0)}
    later = prefix_cache_tokens(merge({0: replica(0.75, 200, 0), 1: replica(0.0, 300, 0)}).decode())
    assert hit_rate_between(tokens, later) == 1.0            # the 100 new tokens: all hits (150 - 50)


def test_router_policy_needs_replicas():
    from minillm.__main__ import main
    assert main(["serve", "--router-policy", "round-robin"]) == 2
    assert main(["serve", "--data-parallel-size", "0"]) == 2


def test_a_replica_gets_the_fronts_flags():
    from minillm.__main__ import build_parser
    from minillm.server.data_parallel.replicas import replica_argv

    args = build_parser().parse_args(["serve", "--data-parallel-size", "2", "--model", "tiny-llama", "--max-num-seqs",
                                      "8", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    argv = replica_argv(args, 1234)
    for flags in (["--port", "1234"], ["--model", "tiny-llama"], ["--max-num-seqs", "8"], ["--enable-auto-tool-choice"],
                  ["--tool-call-parser", "hermes"], ["--exit-with-parent"]):
        assert any(argv[i:i + len(flags)] == flags for i in range(len(argv))), (flags, argv)
    assert "--data-parallel-size" not in argv


def test_the_lifeline_ends_a_replica_whose_front_is_gone():
    script = ("import signal, sys, time\n"
              "from minillm.server.data_parallel.lifeline import exit_with_parent\n"
              "signal.signal(signal.SIGTERM, lambda *_: (print('SIGTERM', flush=True), sys.exit(0)))\n"
              "exit_with_parent()\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    child.stdin.close()                                      # what the kernel does when the front dies
    assert child.wait(20) == 0 and child.stdout.read() == "SIGTERM\n"


# -- real fronts, real replicas ----------------------------------------------------------------
def start_front(log_dir, *flags) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--data-parallel-size", "2", *flags]
    return ServerProcess(command, port, log=str(log_dir / f"front-{port}.log"), ready_timeout=180).__enter__()


def replica_states(url: str) -> list[dict]:
    return httpx.get(url + "/replicas", timeout=10).json()["replicas"]


@pytest.fixture(scope="module")
def smol_front(tmp_path_factory):
    front = start_front(tmp_path_factory.mktemp("smol"), "--router-policy", "round-robin", "--num-kv-blocks", "96")
    yield front
    front.__exit__()


@pytest.mark.slow
def test_replicas_answer_the_texts_of_one_engine(smol_front):
    from minillm.engine.engine import LLMEngine
    from minillm.models import load_model
    from minillm.sampling_params import SamplingParams

    model, tokenizer = load_model("SmolLM2-135M-Instruct", device="cpu")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colors:"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0, max_tokens=10)
    expected = [o.outputs[0].text for o in engine.generate(prompts + [tokenizer.apply_chat_template(messages)],
                                                           params)]
    client = openai.OpenAI(base_url=smol_front.url + "/v1", api_key="unused", max_retries=0)
    answered_by, texts = [], []
    for prompt in prompts:                                   # round-robin: replicas 0, 1, 0, 1
        raw = client.completions.with_raw_response.create(model="SmolLM2-135M-Instruct", prompt=prompt,
                                                          max_tokens=10, temperature=0)
        answered_by.append(raw.headers["x-minillm-replica"])
        texts.append(raw.parse().choices[0].text)
    assert answered_by == ["0", "1", "0", "1"]
    assert texts == expected[:4]
    chat = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=10,
                                          temperature=0)
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=10,
                                            temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert chat.choices[0].message.content == streamed == expected[4]
    assert "Paris" in streamed
    stream = client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompts[0], max_tokens=10,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected[0]
    assert chunks[-1].usage.completion_tokens == 10


@pytest.mark.slow
def test_a_front_killed_outright_takes_its_replicas_along(smol_front):
    states = replica_states(smol_front.url)
    pids, log_dir = [r["pid"] for r in states], os.path.dirname(states[0]["log"])
    smol_front.process.kill()                                # SIGKILL: no cleanup code of the front runs
    smol_front.process.wait(10)
    deadline = time.monotonic() + 30
    while [pid for pid in pids if alive(pid)]:               # each replica reads EOF on its lifeline
        assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
        time.sleep(0.1)
    assert not os.path.exists(log_dir)                       # the last replica out removed it


@pytest.fixture(scope="module")
def tiny_front(tmp_path_factory):
    front = start_front(tmp_path_factory.mktemp("tiny"), "--model", "tiny-llama", "--num-kv-blocks", "256",
                        "--api-key", KEY, "--max-replica-restarts", "0")      # a dead replica stays dead here
    yield front
    front.__exit__()


def test_cache_aware_routing_hits_the_prefix_cache_more_than_round_robin(tiny_front):
    """The same shared-prefix workload (fresh system prompts each time) through a front of each
    policy over the same two replicas; the hit rate is the replicas' own, from /metrics."""
    from minillm.server.data_parallel.app import build_front_app
    from minillm.server.data_parallel.replicas import Replica
    from minillm.server.run import serve_in_thread, stop_server

    replicas = [Replica(r["index"], r["url"]) for r in replica_states(tiny_front.url)]
    rates = {}
    for seed, policy in enumerate(["round-robin", "cache-aware"]):
        router = Router(2, policy)
        server = serve_in_thread(build_front_app(replicas, router, api_key=KEY))
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
            before = prefix_cache_tokens(httpx.get(server.url + "/metrics").text)
            for prompt, _ in shared_prefix_workload(3, 4, 60, 1, seed=100 + seed):
                client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1, temperature=0)
            after = prefix_cache_tokens(httpx.get(server.url + "/metrics").text)
        finally:
            stop_server(server)
        rates[policy] = hit_rate_between(before, after)
        assert sum(router.routed) == 12 and router.in_flight == [0, 0]
    assert rates["cache-aware"] > rates["round-robin"] > 0, rates


def test_front_serves_models_health_and_metrics(tiny_front):
    url = tiny_front.url
    assert httpx.get(url + "/v1/models").status_code == 401                  # the key, at the door
    (card,) = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    assert card["id"] == "tiny-llama"
    assert httpx.get(url + "/health").json()["status"] == "ok"
    r = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 3, "temperature": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"   # the replica's answer
    text = httpx.get(url + "/metrics").text
    for line in ('minillm:num_requests_running{replica="0"}', 'minillm:num_requests_running{replica="1"}',
                 'minillm:prompt_tokens_total{replica="total"}', 'minillm:router_requests_total{policy="cache-aware"',
                 'minillm:router_replica_up{replica="1"} 1.0'):
        assert line in text, line


def test_a_client_that_leaves_frees_the_replica(tiny_front):
    """The front closes its connection to the replica, which aborts the request: streamed or
    not (a non-streamed answer sends nothing before it is complete)."""
    url = tiny_front.url

    def total(name: str) -> float:
        (value,) = [float(line.split()[-1]) for line in httpx.get(url + "/metrics").text.splitlines()
                    if line.startswith(name + '{replica="total"}')]
        return value

    body = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True}
    for stream in (False, True):
        generated = total("minillm:generation_tokens_total")
        try:                                                 # the client gives up after a second
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": stream}, timeout=1.0,
                              headers={"Authorization": f"Bearer {KEY}"}) as r:
                start = time.monotonic()
                for _ in r.iter_lines():
                    if time.monotonic() - start > 1.0:
                        break
        except httpx.ReadTimeout:
            assert not stream
        deadline = time.monotonic() + 10
        while total("minillm:num_requests_running") or sum(r["in_flight"] for r in replica_states(url)):
            assert time.monotonic() < deadline, replica_states(url)
            time.sleep(0.05)
        assert total("minillm:generation_tokens_total") - generated < 1900


def test_a_dead_replica_fails_its_requests_and_the_other_serves_on(tiny_front):
    url, auth = tiny_front.url, {"Authorization": f"Bearer {KEY}"}
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    pids = {r["index"]: r["pid"] for r in replica_states(url)}
    prompt = "Tell me a long story about a lighthouse keeper and the sea."
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1900, "temperature": 0}
    failure = {}

    def non_streamed():
        try:
            client.completions.create(**body, extra_body={"ignore_eos": True})
        except openai.APIStatusError as e:
            failure["status"], failure["error"] = e.status_code, e.body

    with httpx.stream("POST", url + "/v1/completions", json={**body, "ignore_eos": True, "stream": True}, headers=auth,
                      timeout=60) as stream:
        victim = int(stream.headers["x-minillm-replica"])
        events = (line for line in stream.iter_lines() if line.startswith("data: "))
        assert '"text"' in next(events)
        thread = threading.Thread(target=non_streamed)
        thread.start()                                       # same prompt: the same replica (its prefix)
        deadline = time.monotonic() + 20
        while replica_states(url)[victim]["in_flight"] < 2:
            assert time.monotonic() < deadline, replica_states(url)
            time.sleep(0.05)
        os.kill(pids[victim], signal.SIGKILL)
        rest = list(events)
    thread.join(30)
    assert rest[-1] == "data: [DONE]" and '"code": "replica_failed"' in rest[-2], rest[-3:]
    assert failure["status"] == 502 and failure["error"]["code"] == "replica_failed", failure
    for _ in range(3):                                       # its prefix was on the dead one: no matter
        raw = client.completions.with_raw_response.create(model="tiny-llama", prompt=prompt, max_tokens=3)
        assert raw.headers["x-minillm-replica"] == str(1 - victim)
        assert raw.parse().usage.completion_tokens == 3
    states = replica_states(url)
    assert not states[victim]["up"] and states[1 - victim]["up"] and states[victim]["state"] == "failed"
    health = httpx.get(url + "/health")                     # --max-replica-restarts 0: no restart
    assert health.status_code == 200 and health.json()["status"] == "degraded", health.json()


def test_stopping_the_front_stops_every_replica(tiny_front):
    pids = [r["pid"] for r in replica_states(tiny_front.url)]
    tiny_front.process.send_signal(signal.SIGTERM)
    assert tiny_front.process.wait(60) == 0
    assert not [pid for pid in pids if alive(pid)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"          # a zombie has exited
    except OSError:
        return True
