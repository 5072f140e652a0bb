"""Nothing a request sends may cost unbounded work: each limit gets a request just over it (a
clear 4xx), then a normal request that is answered. Slow clients are cut off; a shutdown ends
within its deadline with every client told."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import MAX_STOP_STRINGS
from minillm.server.app import build_app
from minillm.server.limits import MAX_PROMPTS_PER_REQUEST, longest_token
from minillm.server.run import Timeouts, serve_in_thread, stop_server

OPTIONS = dict(num_kv_blocks=64, max_model_len=128, max_num_seqs=4)
OK = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def server(tiny):
    srv = serve_in_thread(build_app(LLMEngine(*tiny, **OPTIONS), "tiny-llama", max_waiting_requests=6,
                                    body_timeout=1.0), timeouts=Timeouts(header=1.0, keep_alive=1.0))
    yield srv
    stop_server(srv)


def post(server, body, path="/v1/completions", timeout=60):
    return httpx.post(server.url + path, json=body, timeout=timeout)


def answered_normally(server):
    r = post(server, OK)
    assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text


def test_300k_prompts_are_refused_before_any_work(server):
    r = post(server, {**OK, "prompt": ["a b c"] * 300_000, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert f"at most {MAX_PROMPTS_PER_REQUEST}" in r.json()["error"]["message"]
    r = post(server, {**OK, "prompt": [[1, 2]] * (MAX_PROMPTS_PER_REQUEST + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    answered_normally(server)


def test_a_prompt_that_can_never_fit_is_refused_without_tokenizing(server, tiny):
    bound = longest_token(tiny[1]) * OPTIONS["max_model_len"]
    for path, body in [("/v1/completions", {**OK, "prompt": "x" * (bound + 1)}),
                       ("/v1/chat/completions", {"model": "tiny-llama", "max_tokens": 2, "messages": [
                           {"role": "user", "content": "x" * (bound // 2 + 1)}] * 2})]:
        r = post(server, body, path)
        assert r.status_code == 400 and "can ever hold" in r.json()["error"]["message"], r.text
    answered_normally(server)


def test_stop_strings_past_the_limit_are_a_400_naming_stop(server):
    r = post(server, {**OK, "stop": ["s"] * (MAX_STOP_STRINGS + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    answered_normally(server)


def test_prompts_times_n_count_against_the_waiting_queue(server):
    """9 sequences > 6 waiting places: it could never be admitted, so a 400 (not a 503, which
    tells a client to retry); a full queue's 503 is test_server_errors' test."""
    r = post(server, {**OK, "prompt": ["a", "b", "c"], "n": 3})
    error = r.json()["error"]
    assert r.status_code == 400 and "adds 9" in error["message"] and error["param"] == "n", r.text
    r = post(server, {**OK, "prompt": ["a"] * 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    answered_normally(server)


def test_a_client_sending_headers_a_byte_at_a_time_is_cut_off(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        closed_after = None
        for i, byte in enumerate(request):
            try:
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
                sock.setblocking(False)
                if sock.recv(1024) == b"":
                    closed_after = i
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed_after = i
                break
            finally:
                sock.setblocking(True)
        assert closed_after is not None and closed_after < len(request) - 1, "the slow client was never cut off"
    answered_normally(server)


def test_a_body_that_never_arrives_gets_a_408(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\":")
        answer = b""
        while b"request_timeout" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer
    answered_normally(server)


# -- shutdown with a deadline ------------------------------------------------------------------

def start_server(shutdown_timeout: float):
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "tiny-llama", "--port", "0",
                             "--max-model-len", "512", "--shutdown-timeout", str(shutdown_timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "serving on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[3]


async def open_streams(url: str, count: int):
    """`count` streams that would run far past the deadline; each returns how it ended."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

    async def one(i):
        stream = await client.completions.create(model="tiny-llama", prompt=f"story {i}", max_tokens=480,
                                                 stream=True, extra_body={"ignore_eos": True})
        try:
            async for _ in stream:
                pass
            return "done"
        except openai.APIError as e:
            return f"error: {e}"
    return [asyncio.ensure_future(one(i)) for i in range(count)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_every_stream_within_the_deadline_and_exits_0(sig):
    proc, url = start_server(shutdown_timeout=2)

    async def scenario():
        tasks = await open_streams(url, 8)
        await asyncio.sleep(1.5)                       # every stream is generating
        start = time.monotonic()
        proc.send_signal(sig)
        results = await asyncio.gather(*tasks)
        return results, time.monotonic() - start

    try:
        results, took = asyncio.run(scenario())
        code = proc.wait(timeout=2 + 2 + 5)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert code == 0, stderr[-2000:]
    assert all(r == "done" or "shutting down" in r for r in results), results
    assert any("shutting down" in r for r in results), results
    assert took < 2 + 2, took
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("ended: ") >= sum("shutting down" in r for r in results)


@pytest.mark.slow
def test_a_second_signal_exits_at_once_without_tracebacks():
    proc, url = start_server(shutdown_timeout=30)

    async def scenario():
        tasks = await open_streams(url, 2)
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(scenario())
        code = proc.wait(timeout=5)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert code == 1 and "second signal" in stderr and "Traceback" not in stderr, stderr[-3000:]
