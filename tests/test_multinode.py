"""Two "nodes" on one machine as separate process trees (their own sessions and working
directories, addresses 127.0.0.1 and 127.0.0.2): `serve --node-rank 0` (the engine, the API and
stage 0) and `worker --node-rank 1` (stage 1), pipeline_parallel_size 2 on the embedded SmolLM2,
answer the openai client with one process's greedy text; then node 1's whole tree is killed in
the middle of a stream, which ends with an error naming node 1 within 30 s; the head stays up,
its /health answering 503 with the node and the operator's next step, a new request a 503, and
no rank of either tree is left. Then the same group of the tiny model started by torchrun (one
torchrun per node, env://) gives one process's tokens, and killing node 0's whole tree (the head)
makes node 1's processes exit by themselves within a bounded time."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
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


def kill_tree(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def start(argv, cwd, log, program=(sys.executable, "-m", "minillm")):
    env = dict(os.environ, MINILLM_DIST_TOKEN="test-token-35", OMP_NUM_THREADS="1",
               PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([*program, *argv], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def torchrun() -> tuple[str, ...]:
    script = Path(sys.executable).with_name("torchrun")           # ships with torch
    return (str(script),) if script.exists() else (sys.executable, "-m", "torch.distributed.run")


def wait_ready(url: str, head, seconds: float = 300.0) -> None:
    start = deadline = time.monotonic()
    deadline += seconds
    while time.monotonic() < deadline:
        assert head.poll() is None, "the head exited before it was ready"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                print(f"the group was ready after {time.monotonic() - start:.1f} s")
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the two-node group was not ready")


def test_two_nodes_serve_one_process_tokens_and_a_killed_node_leaves_the_head_saying_so(tmp_path):
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
        assert wait_gone(node1_pids + head_pids[1:], 30) == []       # no rank left on either node
        assert head.poll() is None                                   # the head stays up, saying why
        health = httpx.get(f"{url}/health", timeout=10)
        error = health.json()["error"]
        assert health.status_code == 503 and error["code"] == "group_failed", error
        assert 1 in error["failed_nodes"] and "node 1" in error["message"], error
        assert error["action"].startswith("restart the group") and "every node" in error["action"]
        assert httpx.get(f"{url}/live", timeout=10).status_code == 503       # it can never serve again
        with pytest.raises(openai.APIStatusError, match="node 1") as refused:
            client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHATS[0], max_tokens=4)
        assert refused.value.status_code == 503
        head.send_signal(signal.SIGTERM)                             # the operator stops it
        assert head.wait(30) == 1 and alive(head_pids) == []
    finally:
        for proc in (head, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()
        print((tmp_path / "node0.log").read_text()[-3000:], (tmp_path / "node1.log").read_text()[-2000:])


def test_torchrun_starts_the_group_and_a_dead_head_leaves_nothing_on_node_1(tmp_path):
    model, tokenizer, _ = get_model("tiny-llama")
    prompts = [tokenizer.encode(p) for p in ("The capital of France is", "1, 2, 3,")]
    one = LLMEngine(model, tokenizer, num_kv_blocks=32).generate(prompts, SamplingParams(max_tokens=8, temperature=0))
    master, port = free_port(), free_port()
    run = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(master)]
    serve = ["-m", "minillm", "serve", "--model", "tiny-llama", "--pipeline-parallel-size", "2", "--num-kv-blocks", "32"]
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in (0, 1)]
    node1 = start([*run, "--node-rank", "1", *serve, "--node-addr", "127.0.0.2"], tmp_path / "node1", logs[1], torchrun())
    head = start([*run, "--node-rank", "0", *serve, "--port", str(port)], tmp_path / "node0", logs[0], torchrun())
    url, pids = f"http://127.0.0.1:{port}", []
    try:
        wait_ready(url, head)
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        served = [client.completions.create(model="tiny-llama", prompt=p, max_tokens=8, temperature=0).choices[0].text
                  for p in prompts]
        assert served == [o.outputs[0].text for o in one]
        head_pids, node1_pids = tree(head.pid), tree(node1.pid)
        pids = head_pids + node1_pids
        assert len(head_pids) == 3 and len(node1_pids) == 3        # torchrun, the node's process, its rank
        kill_tree(head_pids)                                         # node 0 dies: torchrun, the head, its rank
        killed = time.monotonic()
        assert wait_gone(node1_pids, 60) == [], "node 1's processes outlived the head"
        print(f"node 1's processes were gone {time.monotonic() - killed:.1f} s after the head died")
        assert time.monotonic() - killed < 30
        assert node1.wait(5) != 0
    finally:
        kill_tree(alive(pids + tree(head.pid) + tree(node1.pid)))
        for proc in (head, node1):
            proc.wait(10)
        for log in logs:
            log.close()
        print((tmp_path / "node0.log").read_text()[-3000:], (tmp_path / "node1.log").read_text()[-3000:])


def test_env_variables_name_the_group_and_torchruns_store_is_shared(monkeypatch):
    """torchrun's (env://) variables -> the node's flags; a disagreeing flag and several processes
    per node are refused; under torchrun our keys live in its agent's store, under a prefix."""
    import argparse

    from torch.distributed import TCPStore

    from minillm.distributed.launch import from_env
    from minillm.distributed.recovery import lost_group
    from minillm.distributed.world import host_store, join_store

    def args(**given):
        return argparse.Namespace(**{"nnodes": None, "node_rank": None, "dist_init_addr": None, **given})

    port = free_port()
    for k, v in dict(TORCHELASTIC_RUN_ID="none", TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GROUP_RANK="1", GROUP_WORLD_SIZE="2",
                     RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NODE_RANK", raising=False)
    monkeypatch.delenv("NNODES", raising=False)
    a = args()
    from_env(a)
    assert (a.nnodes, a.node_rank, a.dist_init_addr) == (2, 1, f"127.0.0.1:{port}")
    b = args(dist_init_addr="10.0.0.1:29500")                    # an explicit address: the flags stand
    from_env(b)
    assert (b.nnodes, b.node_rank) == (None, None)
    with pytest.raises(ValueError, match="--node-rank 0 disagrees with \\$GROUP_RANK=1"):
        from_env(args(node_rank=0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="one process per node"):
        from_env(args())
    agent = TCPStore("127.0.0.1", port, None, True)              # what torchrun's agent on node 0 serves
    ours, theirs = host_store("127.0.0.1", port, 10.0), join_store("127.0.0.1", port, 10.0)
    ours.set("minillm/nonce", "x")
    assert theirs.get("minillm/nonce") == b"x" and agent.check(["/minillm/attempt_0/minillm/nonce"])
    engine = argparse.Namespace(config=argparse.Namespace(nnodes=2))
    assert lost_group(engine, "node 1, 2 stopped answering: rank 3 ...")["failed_nodes"] == [1, 2]
    assert lost_group(engine, "rank 2 (stage 1, node 1 at 10.0.0.2) failed: ...")["failed_nodes"] == [1]
    assert lost_group(argparse.Namespace(config=argparse.Namespace(nnodes=1)), "node 1 ...") is None
