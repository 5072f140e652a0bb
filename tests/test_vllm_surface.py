"""vLLM's utility surface on a real server with the embedded SmolLM2: /tokenize -> /detokenize
round trips (a prompt, and messages through the chat template), /version, /v1/models/{id}
(404 in OpenAI's shape for another id), /ping (GET and POST, as /health), and /metrics under
vLLM's names with the model_name label (parsed by prometheus_client), equal to ours."""
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import minillm
from minillm.engine.engine import LLMEngine
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, héllo ✓"}]


@pytest.fixture(scope="module")
def server(smol):
    srv = serve_in_thread(build_app(LLMEngine(smol[0], smol[1], num_kv_blocks=128, max_model_len=512), MODEL))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_tokenize_detokenize_round_trip(http, smol):
    text = "The quick brown fox, héllo ✓ 123"
    r = http.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert r["tokens"] == smol[1].encode(text) and r["count"] == len(r["tokens"]) and r["max_model_len"] == 512
    assert len(r["token_strs"]) == r["count"] and r["token_strs"][1] == "Ġquick"
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": text}
    chat = http.post("/tokenize", json={"messages": CHAT, "model": MODEL}).json()
    assert chat["tokens"] == smol[1].apply_chat_template(CHAT, True) and chat["token_strs"] is None
    decoded = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert CHAT[1]["content"] in decoded and decoded.rstrip().endswith("assistant")
    without = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    assert without["count"] < chat["count"]


def test_tokenize_counts_what_the_server_sees(server, http):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    assert r.usage.prompt_tokens == http.post("/tokenize", json={"messages": CHAT}).json()["count"]


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": "x" * ((1 << 20) + 1)}, "prompt"),
    ("/tokenize", {"prompt": "hi", "model": "other"}, "model"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_input_is_refused_by_name(http, path, body, param):
    r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})   # \ud800 escaped
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"].split(".")[0] == param, r.text


def test_version_model_card_and_ping(http):
    assert http.get("/version").json() == {"version": minillm.__version__}
    card = http.get(f"/v1/models/{MODEL}").json()
    assert card == http.get("/v1/models").json()["data"][0]
    r = http.get("/v1/models/gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
    assert http.get("/ping").json() == http.get("/health").json()


def test_metrics_under_vllm_names_with_model_name(server, http):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_success",
                 "vllm:num_preemptions"):
        assert name in families, name
        assert families[name].samples and all(s.labels["model_name"] == MODEL for s in families[name].samples)

    def value(family, sample):
        return next(s.value for s in families[family].samples if s.name == sample)
    assert value("vllm:generation_tokens", "vllm:generation_tokens_total") == \
        value("minillm:generation_tokens", "minillm:generation_tokens_total") >= 5
    assert value("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == \
        value("minillm:e2e_request_latency_seconds", "minillm:e2e_request_latency_seconds_count") >= 1
    assert any(s.labels.get("finished_reason") == "length" and s.value >= 1
               for s in families["vllm:request_success"].samples)
