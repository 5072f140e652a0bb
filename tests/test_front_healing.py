"""The data-parallel front as an orchestrator needs it (issue 32): it refuses a client's bad
request itself (never a replica failure), ends the requests of a replica gone silent within
--replica-timeout, restarts a replica that exited while its /health says "degraded", gives up
(exit 1) when no replica can be started, and leaves no process and no log directory behind.

One real front over two tiny-llama replicas; its tests run in file order (the last one stops
it). The give-up path runs in-process with replicas that exit at once.
"""
import json
import os
import signal
import sys
import threading
import time

import httpx
import pytest

from minillm.bench.server_process import ServerProcess, free_port

TIMEOUT = 8                          # --replica-timeout of the front under test
MARGIN = 12                          # seconds of slack on a loaded 2-core machine
BODY = {"model": "tiny-llama", "max_tokens": 1900, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    port = free_port()
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--data-parallel-size", "2",
               "--model", "tiny-llama", "--num-kv-blocks", "256", "--replica-timeout", str(TIMEOUT)]
    log = tmp_path_factory.mktemp("front") / "front.log"
    server = ServerProcess(command, port, log=str(log), ready_timeout=180).__enter__()
    server.pids = []                                    # every replica process it ever had
    yield server
    server.__exit__()
    for pid in server.pids:                             # a test that failed half-way: nothing stays stopped
        _signal(pid, signal.SIGCONT)


def replicas(front) -> list[dict]:
    states = httpx.get(front.url + "/replicas", timeout=10).json()["replicas"]
    front.pids += [r["pid"] for r in states if r["pid"] not in front.pids]
    return states


def counter(front, name: str) -> dict[str, float]:
    """A router counter's value per replica, from the front's /metrics."""
    values = {}
    for line in httpx.get(front.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"minillm:{name}_total{{"):
            values[line.split('replica="')[1].split('"')[0]] = float(line.split()[-1])
    return values


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (result := condition()):
        assert time.monotonic() < deadline, f"not {what} after {seconds} s"
        time.sleep(0.1)
    return result


def test_the_front_refuses_a_clients_bad_request_itself(front):
    failures = counter(front, "router_replica_failures")
    assert failures == {"0": 0.0, "1": 0.0}
    deep = b"[" * 100_000 + b"]" * 100_000                         # a replica answers 400; Python's parser recurses
    r = httpx.post(front.url + "/v1/completions", content=deep, headers={"content-type": "application/json"},
                   timeout=60)                                     # 200 KB: read by the worker process it starts
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    r = httpx.post(front.url + "/v1/completions", json={**BODY, "prompt": "Hi", "max_tokens": 2},
                   headers={"x-padding": "a" * 100_000})
    assert r.status_code == 431 and r.json()["error"]["code"] == "request_header_fields_too_large", r.text
    r = httpx.post(front.url + "/v1/completions", json={**BODY, "prompt": "Hi", "temperature": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"     # the replica's own 400
    assert counter(front, "router_replica_failures") == failures
    assert all(r["up"] for r in replicas(front))
    assert httpx.get(front.url + "/health").json() == {"status": "ok", "replicas": 2, "replicas_up": 2,
                                                       "restarting": [], "failed": [], "external": []}
    assert httpx.get(front.url + "/live").status_code == 200
    time.sleep(2)                                                  # two rounds of the front's health checks
    for state in replicas(front):                                 # none of them in a replica's access log
        with open(state["log"]) as f:
            assert "GET /health" not in f.read()


def test_a_silent_replica_fails_its_requests_within_the_timeout(front):
    """SIGSTOP a replica with a stream and a plain request open: both end with an error within
    --replica-timeout (the stream with an error event and [DONE]); SIGCONT brings it back."""
    prompt, plain = "The lighthouse keeper wrote in his log that", {}

    def non_streamed():                               # the same prompt: the same replica (its prefix)
        r = httpx.post(front.url + "/v1/completions", json={**BODY, "prompt": prompt}, timeout=120)
        plain.update(status=r.status_code, body=r.json(), at=time.monotonic())

    with httpx.stream("POST", front.url + "/v1/completions", json={**BODY, "prompt": prompt, "stream": True},
                      timeout=120) as stream:
        victim = int(stream.headers["x-minillm-replica"])
        events = (line for line in stream.iter_lines() if line.startswith("data: "))
        assert '"text"' in next(events)
        thread = threading.Thread(target=non_streamed)
        thread.start()
        wait_for(lambda: replicas(front)[victim]["in_flight"] == 2, 30, "two requests on the replica")
        pid = replicas(front)[victim]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            rest = list(events)
            ended = time.monotonic() - stopped
            thread.join(TIMEOUT + MARGIN)
            assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["error"]["code"] == "replica_timeout"
            assert TIMEOUT / 2 < ended < TIMEOUT + MARGIN, ended       # silence counts, from its last answer
            assert plain["status"] == 504 and plain["body"]["error"]["code"] == "replica_timeout", plain
            assert plain["at"] - stopped < TIMEOUT + MARGIN
            health = httpx.get(front.url + "/health").json()
            assert health["status"] == "degraded" and health["replicas_up"] == 1, health
            assert counter(front, "router_replica_failures")[str(victim)] == 2.0
        finally:
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: httpx.get(front.url + "/health").json()["status"] == "ok", 30, "back in rotation")
    assert replicas(front)[victim]["pid"] == pid and replicas(front)[victim]["in_flight"] == 0


def test_a_replica_that_exited_is_restarted_and_health_says_degraded_meanwhile(front):
    pid = replicas(front)[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    degraded = wait_for(lambda: r if (r := httpx.get(front.url + "/health")).json()["status"] == "degraded" else None,
                        15, "degraded")
    assert degraded.status_code == 200                      # replica 1 serves: still ready
    assert degraded.json()["replicas_up"] == 1 and degraded.json()["restarting"] == [0], degraded.json()
    wait_for(lambda: httpx.get(front.url + "/health").json()["status"] == "ok", 120, "restarted")
    state = replicas(front)[0]
    assert state["pid"] != pid and state["restarts"] == 1 and state["state"] == "up"
    assert counter(front, "router_replica_restarts") == {"0": 1.0, "1": 0.0}
    r = httpx.post(front.url + "/v1/completions", json={**BODY, "prompt": "A fresh prompt", "max_tokens": 3},
                   timeout=60)
    assert r.status_code == 200 and r.headers["x-minillm-replica"] == "0"     # both idle: the lower index
    assert r.json()["usage"]["completion_tokens"] == 3


def test_stopping_the_front_leaves_no_process_and_no_logs(front):
    log_dir = os.path.dirname(replicas(front)[0]["log"])
    assert os.path.isdir(log_dir) and os.path.basename(log_dir).startswith("minillm-replicas-")
    front.process.send_signal(signal.SIGTERM)
    assert front.process.wait(60) == 0
    assert not [pid for pid in front.pids if alive(pid)]
    assert not os.path.exists(log_dir)


def test_a_front_whose_replicas_cannot_start_gives_up():
    """Replicas that exit at once: each is restarted max_restarts times with backoff, counted;
    then /health answers 503 (no Retry-After: nothing is restarting) and on_all_failed runs."""
    from minillm.server.data_parallel.app import build_front_app
    from minillm.server.data_parallel.healing import backoff
    from minillm.server.data_parallel.replicas import Launcher, stop_replicas
    from minillm.server.data_parallel.router import Router
    from minillm.server.run import serve_in_thread, stop_server

    assert [backoff(a) for a in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]

    class Crashing(Launcher):
        def argv(self, port):
            return [sys.executable, "-c", "import sys; print('cannot start'); sys.exit(3)"]

        def env(self, index):
            return dict(os.environ)

    launcher = Crashing(None, 2)
    replicas_ = [launcher.start(i) for i in range(2)]
    gave_up = threading.Event()
    server = serve_in_thread(build_front_app(replicas_, Router(2), health_interval=0.05, max_restarts=2,
                                             restart_backoff=0.05, on_all_failed=gave_up.set))
    try:
        assert gave_up.wait(30)
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503 and "retry-after" not in r.headers
        assert r.json() == {"status": "unavailable", "replicas": 2, "replicas_up": 0, "restarting": [],
                            "failed": [0, 1], "external": []}
        assert [s["state"] for s in httpx.get(server.url + "/replicas").json()["replicas"]] == ["failed"] * 2
        assert 'minillm:router_replica_restarts_total{replica="1"} 2.0' in httpx.get(server.url + "/metrics").text
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"
        with open(replicas_[0].log) as f:
            assert f.read().count("cannot start") == 3          # the first start and two restarts, one log
    finally:
        stop_server(server)
        stop_replicas(replicas_)
    assert not os.path.exists(launcher.log_dir)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def test_a_big_body_is_read_for_routing_off_the_event_loop():
    """Above 64 KB the routing text is read in a worker process (a parse holds the GIL, so a
    thread would stop the loop too): the loop keeps ticking; a body nested too deeply is still
    refused, and a small one is read on a thread."""
    import asyncio

    from minillm.server.data_parallel.off_loop import RoutingText
    from minillm.server.data_parallel.prompts import TooDeep

    big = json.dumps({"model": "m", "prompt": [[7]] * 300_000}).encode()       # 1.5 MB
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    async def run():
        reader, gaps, done = RoutingText(), [], asyncio.Event()

        async def ticker():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()
        tick = asyncio.create_task(ticker())
        try:
            assert await reader("/v1/completions", b'{"prompt": "Hi"}') == "Hi" and reader.pool is None
            assert await asyncio.gather(*(reader("/v1/completions", big) for _ in range(3))) == ["m\n7 "] * 3
            assert reader.pool is not None
            with pytest.raises(TooDeep):
                await reader("/v1/completions", deep)
        finally:
            done.set()
            await tick
            reader.close()
        return max(gaps)

    assert asyncio.run(run()) < 0.5                         # on a thread: seconds (one GIL-bound parse after another)
