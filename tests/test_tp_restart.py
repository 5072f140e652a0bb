"""A tensor-parallel server heals a dead rank (issue 32): `kill -9` one rank of a real
`serve --tensor-parallel-size 2` process → /health answers 503 with the reason within 5 s, the
request in flight ends with an error, a new request gets 503 with Retry-After, the group starts
again and serves the same greedy tokens as before (tensor_parallel_size=1's), the restart is
counted in /metrics and logged once at ERROR, and probes are not in the access log. A group that
cannot be started again makes the engine give up (the server stops; the CLI exits 1)."""
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from minillm import LLMEngine, SamplingParams
from minillm.bench.server_process import ServerProcess, free_port, minillm_command

from conftest import get_model

PROMPTS = [[1, 15, 27, 300, 42, 7, 99], [5, 6, 7, 8, 9, 10, 11, 12]]


def rank_pids(server_pid: int) -> list[int]:
    """The server's tensor-parallel ranks: its children spawned by multiprocessing (not its resource tracker)."""
    children = psutil.Process(server_pid).children()
    return sorted(p.pid for p in children if "spawn_main" in " ".join(p.cmdline()))


def greedy(url: str) -> list[str]:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS, "max_tokens": 12, "temperature": 0,
                                                   "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    return [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def wait_for(predicate, seconds: float, step: float = 0.1):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("tp") / "server.log")
    command = minillm_command("tiny-llama", free_port(), ["--tensor-parallel-size", "2", "--num-kv-blocks", "64"])
    with ServerProcess(command, int(command[command.index("--port") + 1]), log=log, ready_timeout=300) as srv:
        srv.log_path = log
        yield srv


def test_a_killed_rank_is_reported_and_the_group_restarts_with_the_same_tokens(server):
    url = server.url
    before = greedy(url)
    model, tokenizer, _ = get_model("tiny-llama")                 # tensor_parallel_size=1's tokens
    one = LLMEngine(model, tokenizer, num_kv_blocks=64).generate(
        [list(p) for p in PROMPTS], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert before == [o.outputs[0].text for o in one]

    pids = rank_pids(server.process.pid)
    assert len(pids) == 2
    events, streaming = [], threading.Event()

    def stream_in_flight():                 # no max_tokens: it runs to max_model_len, long after the kill
        body = {"prompt": PROMPTS[0], "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    streaming.set()

    thread = threading.Thread(target=stream_in_flight)
    thread.start()
    assert streaming.wait(60)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    health = wait_for(lambda: (r := httpx.get(f"{url}/health", timeout=5)).status_code == 503 and r, 5.0)
    assert health, "/health did not turn 503 within 5 s of the kill"
    assert "rank 1 died" in health.json()["error"]["message"]
    print(f"/health 503 {time.monotonic() - killed:.1f} s after the kill")
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 2}, timeout=30)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
    assert httpx.get(f"{url}/live", timeout=5).status_code == 200        # healing: alive, not ready
    thread.join(60)
    assert not thread.is_alive() and events[-1] == "[DONE]"
    assert '"error"' in events[-2] and "rank 1 died" in events[-2]          # the stream ended with the error

    assert wait_for(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, 240, 0.5), \
        "the group did not come back"
    print(f"serving again {time.monotonic() - killed:.1f} s after the kill")
    assert greedy(url) == before
    new = rank_pids(server.process.pid)
    assert len(new) == 2 and not set(new) & set(pids)
    metrics = httpx.get(f"{url}/metrics").text
    assert "minillm:engine_restarts_total 1.0" in metrics and "minillm:engine_ready 1.0" in metrics
    log = open(server.log_path).read()
    assert log.count("the engine cannot serve: tensor-parallel rank 1 died") == 1
    assert "POST /v1/completions" in log and "GET /health" not in log


def failing_shard(layer, rank, n, group):
    raise RuntimeError("this shard cannot be built")


def test_a_group_that_cannot_start_again_makes_the_server_give_up():
    from minillm.distributed.executor import pickled_by_value
    from minillm.server.app import build_app
    from minillm.server.run import serve_in_thread, stop_server
    model, tokenizer, _ = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=32, tensor_parallel_size=2)
    app = build_app(engine, "tiny-llama")
    front = app.state.served.front
    front.restart_attempts, front.restart_backoff = 2, 0.1
    server = serve_in_thread(app)
    try:
        engine.runner.shard_layer = pickled_by_value(failing_shard)    # every new rank fails to start
        os.kill(engine.runner.pids[0], signal.SIGKILL)
        assert wait_for(lambda: front.fatal, 240, 0.5), "the engine did not give up"
        assert "could not be started again after 2 attempts" in front.failure
        server.thread.join(30)
        assert not server.thread.is_alive()                          # on_fatal stopped the server
    finally:
        stop_server(server)
        engine.runner.close()
