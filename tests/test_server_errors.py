"""Bad input gets an OpenAI-shaped error with the right status, and the server keeps serving.
Raw requests go through httpx (malformed bodies, wrong methods); a few go through the
`openai` client to check that it raises the matching exception."""
import asyncio
import json

import httpx
import openai
import pytest

import minillm.engine.engine as engine_step
from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import SamplingParams
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 64 * 1024
OPTIONS = dict(num_kv_blocks=64, max_model_len=128, max_num_seqs=8)
OK = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
CHAT_OK = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def server(tiny):
    srv = serve_in_thread(build_app(LLMEngine(*tiny, **OPTIONS), "tiny-llama", api_key=KEY,
                                    max_request_body_bytes=LIMIT))
    yield srv
    stop_server(srv)


def with_(base, **changes):
    return {**base, **changes}


def without(base, key):
    return {k: v for k, v in base.items() if k != key}


# (name, method, path, body: dict | bytes | None, headers, expected status, expected param or ...)
CASES = [
    ("malformed json", "POST", "/v1/completions", b'{"prompt": "x",', AUTH, 400, None),
    ("body is an array", "POST", "/v1/completions", b"[1, 2]", AUTH, 400, None),
    ("empty body", "POST", "/v1/completions", b"", AUTH, 400, None),
    ("NaN temperature", "POST", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', AUTH, 400,
     "temperature"),
    ("deeply nested JSON", "POST", "/v1/completions", b"[" * 30_000 + b"]" * 30_000, AUTH, 400, None),
    ("infinite temperature", "POST", "/v1/completions", b'{"prompt": "x", "temperature": 1e400}', AUTH, 400,
     "temperature"),
    ("body is not UTF-8", "POST", "/v1/completions", b"\xff\xfe{}", AUTH, 400, None),
    ("lone surrogate in prompt", "POST", "/v1/completions", b'{"prompt": "a\\ud800b"}', AUTH, 400, "prompt"),
    ("missing prompt", "POST", "/v1/completions", without(OK, "prompt"), AUTH, 400, "prompt"),
    ("prompt is a number", "POST", "/v1/completions", with_(OK, prompt=1.5), AUTH, 400, "prompt"),
    ("prompt is an empty list", "POST", "/v1/completions", with_(OK, prompt=[]), AUTH, 400, "prompt"),
    ("prompt is an empty id list", "POST", "/v1/completions", with_(OK, prompt=[[]]), AUTH, 400, "prompt"),
    ("prompt is an empty string", "POST", "/v1/completions", with_(OK, prompt=""), AUTH, 400, "prompt"),
    ("prompt mixes ids and text", "POST", "/v1/completions", with_(OK, prompt=[1, "a"]), AUTH, 400, "prompt"),
    ("token id outside the vocab", "POST", "/v1/completions", with_(OK, prompt=[10**9]), AUTH, 400, "prompt"),
    ("negative token id", "POST", "/v1/completions", with_(OK, prompt=[5, -1]), AUTH, 400, "prompt"),
    ("bool token id", "POST", "/v1/completions", with_(OK, prompt=[True, 5]), AUTH, 400, "prompt"),
    ("prompt longer than the context", "POST", "/v1/completions", with_(OK, prompt=[5] * 200), AUTH, 400, "prompt"),
    ("max_tokens past the context", "POST", "/v1/completions", with_(OK, max_tokens=1000), AUTH, 400, "max_tokens"),
    ("n = 0", "POST", "/v1/completions", with_(OK, n=0), AUTH, 400, "n"),
    ("n is a string", "POST", "/v1/completions", with_(OK, n="2"), AUTH, 400, "n"),
    ("n above max_num_seqs", "POST", "/v1/completions", with_(OK, n=50), AUTH, 400, "n"),
    ("max_tokens = 0", "POST", "/v1/completions", with_(OK, max_tokens=0), AUTH, 400, "max_tokens"),
    ("max_tokens is a float", "POST", "/v1/completions", with_(OK, max_tokens=1.5), AUTH, 400, "max_tokens"),
    ("negative temperature", "POST", "/v1/completions", with_(OK, temperature=-1), AUTH, 400, "temperature"),
    ("temperature is a string", "POST", "/v1/completions", with_(OK, temperature="hot"), AUTH, 400,
     "temperature"),
    ("top_p = 0", "POST", "/v1/completions", with_(OK, top_p=0), AUTH, 400, "top_p"),
    ("top_p above 1", "POST", "/v1/completions", with_(OK, top_p=1.5), AUTH, 400, "top_p"),
    ("top_k = -2", "POST", "/v1/completions", with_(OK, top_k=-2), AUTH, 400, "top_k"),
    ("negative seed", "POST", "/v1/completions", with_(OK, seed=-1), AUTH, 400, "seed"),
    ("seed beyond 64 bits", "POST", "/v1/completions", with_(OK, seed=2**70), AUTH, 400, "seed"),
    ("stop is a number", "POST", "/v1/completions", with_(OK, stop=5), AUTH, 400, "stop"),
    ("stop is an empty string", "POST", "/v1/completions", with_(OK, stop=[""]), AUTH, 400, "stop"),
    ("priority is a string", "POST", "/v1/completions", with_(OK, priority="high"), AUTH, 400, "priority"),
    ("ignore_eos is a string", "POST", "/v1/completions", with_(OK, ignore_eos="yes"), AUTH, 400, "ignore_eos"),
    ("logprobs over 20", "POST", "/v1/completions", with_(OK, logprobs=21), AUTH, 400, "logprobs"),
    ("logprobs negative", "POST", "/v1/completions", with_(OK, logprobs=-1), AUTH, 400, "logprobs"),
    ("suffix asked for", "POST", "/v1/completions", with_(OK, suffix="x"), AUTH, 400, "suffix"),
    ("prompt_logprobs streamed", "POST", "/v1/completions", with_(OK, prompt_logprobs=1, stream=True), AUTH, 400,
     "prompt_logprobs"),
    ("presence penalty out of range", "POST", "/v1/completions", with_(OK, presence_penalty=2.5), AUTH, 400,
     "presence_penalty"),
    ("unknown field", "POST", "/v1/completions", with_(OK, temprature=0.5), AUTH, 400, "temprature"),
    ("stream_options without stream", "POST", "/v1/completions",
     with_(OK, stream_options={"include_usage": True}), AUTH, 400, "stream_options"),
    ("unknown model", "POST", "/v1/completions", with_(OK, model="gpt-9"), AUTH, 404, "model"),
    ("chat: no messages", "POST", "/v1/chat/completions", with_(CHAT_OK, messages=[]), AUTH, 400, "messages"),
    ("chat: messages missing", "POST", "/v1/chat/completions", without(CHAT_OK, "messages"), AUTH, 400,
     "messages"),
    ("chat: messages is a string", "POST", "/v1/chat/completions", with_(CHAT_OK, messages="hi"), AUTH, 400,
     "messages"),
    ("chat: unknown role", "POST", "/v1/chat/completions",
     with_(CHAT_OK, messages=[{"role": "bot", "content": "x"}]), AUTH, 400, "messages.0.role"),
    ("chat: content is a number", "POST", "/v1/chat/completions",
     with_(CHAT_OK, messages=[{"role": "user", "content": 5}]), AUTH, 400, "messages.0.content"),
    ("chat: an image part", "POST", "/v1/chat/completions",
     with_(CHAT_OK, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     AUTH, 400, "messages.0.content"),
    ("chat: top_logprobs without logprobs", "POST", "/v1/chat/completions", with_(CHAT_OK, top_logprobs=2),
     AUTH, 400, "top_logprobs"),
    ("chat: top_logprobs over 20", "POST", "/v1/chat/completions",
     with_(CHAT_OK, logprobs=True, top_logprobs=21), AUTH, 400, "logprobs"),
    ("chat: max_completion_tokens = 0", "POST", "/v1/chat/completions",
     with_(CHAT_OK, max_completion_tokens=0), AUTH, 400, "max_tokens"),
    ("chat: unknown model", "POST", "/v1/chat/completions", with_(CHAT_OK, model="nope"), AUTH, 404, "model"),
    ("GET on a POST route", "GET", "/v1/completions", None, AUTH, 405, None),
    ("POST on a GET route", "POST", "/v1/models", OK, AUTH, 405, None),
    ("unknown /v1 route", "GET", "/v1/engines", None, AUTH, 404, None),
    ("unknown route", "GET", "/nope", None, {}, 404, None),
    ("body over the limit", "POST", "/v1/completions", with_(OK, prompt="x" * (LIMIT + 10)), AUTH, 413, None),
    ("no API key", "POST", "/v1/completions", OK, {}, 401, None),
    ("wrong API key", "POST", "/v1/completions", OK, {"Authorization": "Bearer nope"}, 401, None),
    ("key without Bearer", "GET", "/v1/models", None, {"Authorization": KEY}, 401, None),
    ("no key, malformed body", "POST", "/v1/completions", b"{", {}, 401, None),
]


def send(server, method, path, body, headers, **kw):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers} if content is not None else headers
    return httpx.request(method, server.url + path, content=content, headers=headers, timeout=60, **kw)


def assert_openai_error(r, status, param=...):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in r.text
    if param is not ...:
        assert body["error"]["param"] == param, body
    return body["error"]


def assert_serves(server):
    """A good request, right after: correct text (the engine's greedy output)."""
    r = send(server, "POST", "/v1/completions", OK, AUTH)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_at_least_thirty_bad_inputs():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,method,path,body,headers,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_an_openai_error(server, name, method, path, body, headers, status, param):
    assert_openai_error(send(server, method, path, body, headers), status, param)


def test_server_answers_correctly_after_all_the_bad_inputs(server, tiny):
    for _, method, path, body, headers, _, _ in CASES:
        send(server, method, path, body, headers)
    (expected,) = LLMEngine(*tiny, **OPTIONS).generate(["Hello"], SamplingParams(max_tokens=4, temperature=0))
    assert assert_serves(server) == expected.outputs[0].text
    assert send(server, "GET", "/health", None, {}).json() == {"status": "ok"}     # open without a key


def test_chunked_body_over_the_limit_is_refused(server):
    def chunks():                                   # no Content-Length: the server must count
        for _ in range(LIMIT // 1024 + 8):
            yield b" " * 1024
    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers=AUTH, timeout=60)
    assert_openai_error(r, 413)


def test_the_openai_client_raises_the_matching_exceptions(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="tiny-llama", prompt="x", top_p=2.0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="bad", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.completions.create(model="tiny-llama", prompt="x", suffix="y")


def test_full_waiting_queue_is_a_503(tiny):
    """One seat, one waiting place: a long request runs, a second waits, a third is refused."""
    app = build_app(LLMEngine(*tiny, num_kv_blocks=64, max_model_len=1024, max_num_seqs=1), "tiny-llama",
                    max_waiting_requests=1)
    srv = serve_in_thread(app)

    async def scenario():
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        long = dict(model="tiny-llama", messages=[{"role": "user", "content": "Go"}], max_tokens=900,
                    stream=True, extra_body={"ignore_eos": True})
        running = await client.chat.completions.create(**long)
        await running.__anext__()                                      # accepted
        await running.__anext__()                                      # and generating
        waiting = await client.chat.completions.create(**long)
        await waiting.__anext__()                                      # accepted: it waits for the seat
        with pytest.raises(openai.APIStatusError) as refused:
            await client.completions.create(model="tiny-llama", prompt="x", max_tokens=2)
        await running.close()
        await waiting.close()
        return refused.value

    try:
        refused = asyncio.run(scenario())
        assert refused.status_code == 503 and refused.body["code"] == "queue_full"
        assert assert_serves_plain(srv) > 0
    finally:
        stop_server(srv)


def assert_serves_plain(srv) -> int:
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["completion_tokens"]


def test_an_engine_fault_is_a_500_and_the_other_requests_go_on(tiny, monkeypatch):
    """Fault injection: the sampler fails for one request (temperature 0.5); the engine ends
    that request with an error, the server answers 500 in OpenAI's shape (or an error event
    in a stream), and a request beside it is unaffected."""
    real_sample = engine_step.sample

    def faulty_sample(logits, params, generators):
        if any(p.temperature == 0.5 for p in params):
            raise RuntimeError("injected sampler fault")
        return real_sample(logits, params, generators)
    monkeypatch.setattr(engine_step, "sample", faulty_sample)
    srv = serve_in_thread(build_app(LLMEngine(*tiny, **OPTIONS), "tiny-llama"))
    try:
        bad = {"prompt": "Hello", "max_tokens": 4, "temperature": 0.5}
        error = assert_openai_error(httpx.post(srv.url + "/v1/completions", json=bad, timeout=60), 500)
        assert "injected sampler fault" in error["message"] and error["code"] == "engine_error"
        r = httpx.post(srv.url + "/v1/completions", json={**bad, "stream": True}, timeout=60)
        events = [line[len("data: "):] for line in r.text.split("\n\n") if line]
        assert r.status_code == 200 and events[-1] == "[DONE]"
        assert "injected sampler fault" in json.loads(events[-2])["error"]["message"]
        assert assert_serves_plain(srv) == 3
    finally:
        stop_server(srv)
