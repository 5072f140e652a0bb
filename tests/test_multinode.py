"""Two "nodes" on one machine as separate process trees (their own sessions and working
directories, addresses 127.0.0.1 and 127.0.0.2): `serve --node-rank 0` (the engine, the API and
stage 0) and `worker --node-rank 1` (stage 1), pipeline_parallel_size 2 on the embedded SmolLM2,
answer the openai client with one process's greedy text; then node 1's whole tree is killed in
the middle of a stream, which ends with an error naming node 1 within 30 s, the head exits 1
(an orchestrator starts the group again) and no process of either tree is left."""
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from openai import OpenAI

from minillm import LLMEngine, SamplingParams
from minillm.utils.ports import free_port

from conftest import get_model

CHATS = [[{"role": "user", "content": q}] for q in ("What is the capital of France?", "Say hello in Spanish.")]


def tree(pid: int) -> list[int]:
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def start(argv, cwd, log):
    env = dict(os.environ, MINILLM_DIST_TOKEN="test-token-35", OMP_NUM_THREADS="1",
               PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "minillm", *argv], cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, head, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert head.poll() is None, "the head exited before it was ready"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the two-node group was not ready")


def test_two_nodes_serve_one_process_tokens_and_a_killed_node_ends_requests(tmp_path):
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")
    ids = [tokenizer.apply_chat_template(c) for c in CHATS]
    one = LLMEngine(model, tokenizer, num_kv_blocks=64).generate(ids, SamplingParams(max_tokens=24, temperature=0))
    dist_port, port = free_port(), free_port()
    group = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist_port}"]
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in (0, 1)]
    node1 = start(["worker", *group, "--node-rank", "1", "--node-addr", "127.0.0.2"], tmp_path / "node1", logs[1])
    head = start(["serve", "--port", str(port), "--num-kv-blocks", "64", *group, "--node-rank", "0"],
                 tmp_path / "node0", logs[0])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, head)
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        served = [client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=c, max_tokens=24,
                                                 temperature=0).choices[0].message.content for c in CHATS]
        assert served == [o.outputs[0].text for o in one]
        node1_pids, head_pids = tree(node1.pid), tree(head.pid)
        assert len(node1_pids) == 2 and len(head_pids) == 2          # a launcher and its rank; the head and its rank
        stream = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count slowly:", max_tokens=1000,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        os.killpg(node1.pid, signal.SIGKILL)                         # node 1's whole tree
        killed = time.monotonic()
        with pytest.raises(Exception, match="node 1") as caught:
            for _ in stream:
                pass
        assert time.monotonic() - killed < 30, caught.value
        head.wait(30)
        assert head.returncode == 1
        assert alive(node1_pids + head_pids) == []
    finally:
        for proc in (head, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()
        print((tmp_path / "node0.log").read_text()[-3000:], (tmp_path / "node1.log").read_text()[-2000:])
