"""Replicas given by URL behind the data-parallel front (issue 35, item 5): `serve
--data-parallel-size 1 --replica-url URL` routes to its own replica and to a `minillm serve`
someone else started, with the same greedy texts through the `openai` client; the URL replica's
model is checked at startup; killed, it leaves the rotation (never restarted by the front, which
says so) while requests go on on the other; started again at its URL, it comes back.

One front (round-robin, so both replicas are used in turn) over one tiny-llama replica of its
own and one started here; its tests run in file order (the last kills and revives the URL one).
"""
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from minillm import LLM, SamplingParams
from minillm.bench.server_process import ServerProcess, free_port
from minillm.checks.harness import tiny_model

PROMPTS = [[1, 1597, 314, 2048, 21, 5, 99, 1000, 44], [1, 17, 23, 4000, 560, 2], [1, 9, 8, 7, 600]]
MAX_TOKENS = 8


def start_url_replica(port: int, log) -> ServerProcess:
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--model", "tiny-llama",
               "--num-kv-blocks", "128"]
    return ServerProcess(command, port, log=str(log), ready_timeout=180).__enter__()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(front, the URL replica, its port, the log folder, reference texts per prompt)."""
    model, tok = tiny_model()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    refs = [o.outputs[0].text for o in LLM(model, tokenizer=tok, num_kv_blocks=64).generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)]
    logs = tmp_path_factory.mktemp("replica-url")
    port = free_port()
    outside = start_url_replica(port, logs / "outside-1.log")
    front_port = free_port()
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(front_port), "--data-parallel-size", "1",
               "--model", "tiny-llama", "--num-kv-blocks", "128", "--router-policy", "round-robin",
               "--replica-url", f"http://127.0.0.1:{port}/v1"]          # an OpenAI base URL works too
    try:
        front = ServerProcess(command, front_port, log=str(logs / "front.log"), ready_timeout=180).__enter__()
    except BaseException:
        outside.__exit__()
        raise
    state = {"outside": outside}
    yield front, state, port, logs, refs
    front.__exit__()
    state["outside"].__exit__()


def complete(url: str, prompt) -> tuple[str, str]:
    """(the replica that answered, the text)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.completions.with_raw_response.create(model="tiny-llama", prompt=prompt, max_tokens=MAX_TOKENS,
                                                      temperature=0, extra_body={"ignore_eos": True})
    return raw.headers["x-minillm-replica"], raw.parse().choices[0].text


def served_by_both(front, refs) -> None:
    """Each prompt twice in a row (round-robin: once on each replica), each time the reference text."""
    for i, prompt in enumerate(PROMPTS):
        answers = [complete(front.url, prompt) for _ in range(2)]
        assert sorted(r for r, _ in answers) == ["0", "1"], answers
        assert [t for _, t in answers] == [refs[i]] * 2, (i, answers)


def test_own_and_url_replicas_serve_the_same_greedy_texts(setup):
    front, _, port, _, refs = setup
    served_by_both(front, refs)
    states = httpx.get(front.url + "/replicas", timeout=10).json()["replicas"]
    assert [(s["external"], s["pid"] is None) for s in states] == [(False, False), (True, True)]
    assert states[1]["url"] == f"http://127.0.0.1:{port}"
    assert httpx.get(front.url + "/health").json() == {"status": "ok", "replicas": 2, "replicas_up": 2,
                                                       "restarting": [], "failed": [], "external": [1]}


def test_a_url_replica_must_serve_the_fronts_model(setup):
    _, _, port, _, _ = setup
    serve = [sys.executable, "-m", "minillm", "serve", "--port", str(free_port()), "--data-parallel-size", "0",
             "--replica-url", f"http://127.0.0.1:{port}"]
    r = subprocess.run(serve + ["--served-model-name", "other-model"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "lists 'tiny-llama', not 'other-model'" in r.stderr, r.stderr[-800:]
    r = subprocess.run(serve[:-1] + ["ftp://nowhere"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--replica-url 'ftp://nowhere'" in r.stderr, r.stderr[-800:]


def test_a_url_replica_leaves_the_rotation_when_killed_and_comes_back(setup):
    front, state, port, logs, refs = setup
    os.killpg(state["outside"].process.pid, signal.SIGKILL)
    state["outside"].process.wait(10)
    health = wait_for(lambda: (h := httpx.get(front.url + "/health").json())["replicas_up"] == 1 and h, 30)
    assert health["status"] == "degraded" and health["restarting"] == [] and health["external"] == [1], health
    for prompt, ref in zip(PROMPTS, refs):                  # every request still served, by the front's own
        assert complete(front.url, prompt) == ("0", ref)
    (own, outside) = httpx.get(front.url + "/replicas", timeout=10).json()["replicas"]
    assert outside["state"] == "down" and outside["restarts"] == 0 and own["state"] == "up"
    with open(logs / "front.log") as f:
        assert "never restarts it" in f.read()              # the front says whose job it is
    state["outside"] = start_url_replica(port, logs / "outside-2.log")     # whoever started it, starts it again
    wait_for(lambda: httpx.get(front.url + "/health").json()["status"] == "ok", 30)
    served_by_both(front, refs)


def wait_for(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while not (result := condition()):
        assert time.monotonic() < deadline, f"not after {seconds} s"
        time.sleep(0.1)
    return result
