"""The OpenAI-compatible server, through the official `openai` client over loopback, against
a real uvicorn server in a background thread. Every answer is compared with what the engine
gives for the same prompt offline (`LLMEngine.generate`)."""
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import SamplingParams
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colors:"]
OPTIONS = dict(num_kv_blocks=256, max_model_len=512)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def reference(tiny):
    """The engine offline, on the same model: what the server must answer."""
    engine = LLMEngine(*tiny, **OPTIONS)

    def generate(prompts, **params):
        return [[o.text for o in out.outputs] for out in engine.generate(prompts, SamplingParams(**params))]
    return generate


@pytest.fixture(scope="module")
def server(tiny):
    app = build_app(LLMEngine(*tiny, **OPTIONS), "tiny-llama")
    srv = serve_in_thread(app)
    yield srv
    stop_server(srv)
    assert not app.state.served.front.is_alive            # the engine loop thread stopped


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def stream_text(stream):
    """Concatenate a completion stream's deltas per choice; also return finish reasons and usage."""
    texts, finish, usage = {}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            delta = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + delta
            if c.finish_reason:
                assert c.index not in finish, "a choice finished twice"
                finish[c.index] = c.finish_reason
    return texts, finish, usage


def test_models_and_health(server, client):
    (card,) = client.models.list().data
    assert card.id == "tiny-llama" and card.max_model_len == 512
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_greedy_completions_equal_the_engine(client, tiny, reference):
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.text for c in r.choices] == [t[0] for t in reference(PROMPTS, temperature=0, max_tokens=12)]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in r.choices)
    prompt_tokens = sum(len(tiny[1].encode(p)) for p in PROMPTS)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (prompt_tokens, 48, prompt_tokens + 48)


def test_streamed_text_equals_the_whole_text(client, reference):
    stream = client.completions.create(model="tiny-llama", prompt=PROMPTS[:2], max_tokens=10, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    texts, finish, usage = stream_text(stream)
    assert [texts[0], texts[1]] == [t[0] for t in reference(PROMPTS[:2], temperature=0, max_tokens=10)]
    assert finish == {0: "length", 1: "length"}
    assert usage.completion_tokens == 20


def test_token_id_prompts(client, tiny, reference):
    ids = [tiny[1].encode(p) for p in PROMPTS[:2]]
    one = client.completions.create(model="tiny-llama", prompt=ids[0], max_tokens=6, temperature=0)
    two = client.completions.create(model="tiny-llama", prompt=ids, max_tokens=6, temperature=0)
    expected = [t[0] for t in reference(ids, temperature=0, max_tokens=6)]
    assert one.choices[0].text == expected[0]
    assert [c.text for c in two.choices] == expected


def test_chat_through_the_template_streamed_and_not(client, tiny, reference):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
    ids = tiny[1].apply_chat_template(messages)
    (expected,) = reference([ids], temperature=0, max_tokens=9)[0]
    r = client.chat.completions.create(model="tiny-llama", messages=messages, max_completion_tokens=9,
                                       temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 9
    stream = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=9, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n2_choices_are_prompt_major_and_seeded(client, reference):
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[:2], n=2, max_tokens=8, temperature=1.0,
                                  seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    expected = reference(PROMPTS[:2], n=2, temperature=1.0, seed=7, max_tokens=8)
    assert [c.text for c in r.choices] == expected[0] + expected[1]
    assert r.choices[0].text != r.choices[1].text                  # two different samples
    stream = client.completions.create(model="tiny-llama", prompt=PROMPTS[:2], n=2, max_tokens=8, temperature=1.0,
                                       seed=7, stream=True)
    texts, finish, _ = stream_text(stream)
    assert [texts[i] for i in range(4)] == expected[0] + expected[1] and len(finish) == 4


def test_seed_is_reproducible(client):
    def sample(seed):
        return client.completions.create(model="tiny-llama", prompt=PROMPTS[2], max_tokens=10, temperature=1.0,
                                         top_p=0.9, seed=seed, extra_body={"top_k": 50}).choices[0].text
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_stop_string_cuts_the_text_streamed_and_not(client, reference):
    (full,) = reference([PROMPTS[1]], temperature=0, max_tokens=16)[0]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip()
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=16, temperature=0, stop=stop)
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"
    stream = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                       stop=[stop], stream=True)
    texts, finish, _ = stream_text(stream)
    assert texts[0] == full[:full.index(stop)] and finish == {0: "stop"}


def test_max_tokens_defaults_to_the_rest_of_the_context(client, tiny):
    prompt_len = len(tiny[1].encode(PROMPTS[0]))
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 512 - prompt_len and r.choices[0].finish_reason == "length"


def test_repeated_system_prompt_is_served_from_the_prefix_cache(client):
    system = {"role": "system", "content": "You are a helpful assistant. " * 20}
    first = client.chat.completions.create(model="tiny-llama", max_tokens=2, temperature=0,
                                           messages=[system, {"role": "user", "content": "One?"}])
    second = client.chat.completions.create(model="tiny-llama", max_tokens=2, temperature=0,
                                            messages=[system, {"role": "user", "content": "Two?"}])
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert cached >= 100 and cached % 16 == 0 and cached < second.usage.prompt_tokens


def metrics(server) -> dict:
    """{sample name (+ labels): value} from /metrics, parsed as Prometheus text."""
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()) if k != "le")] = s.value
    return out


def test_metrics_parse_and_move(server, client):
    before = metrics(server)
    for name in ["minillm:num_requests_running", "minillm:num_requests_waiting", "minillm:num_requests_swapped",
                 "minillm:kv_cache_usage_perc", "minillm:kv_blocks_used", "minillm:prefix_cache_hit_rate",
                 "minillm:num_preemptions_total", "minillm:time_to_first_token_seconds_count",
                 "minillm:inter_token_latency_seconds_count", "minillm:e2e_request_latency_seconds_count"]:
        assert name in before, name
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[:2], max_tokens=5, temperature=0)
    after = metrics(server)

    def moved(name):
        return after.get(name, 0) - before.get(name, 0)
    assert moved("minillm:generation_tokens_total") == r.usage.completion_tokens == 10
    assert moved("minillm:prompt_tokens_total") == r.usage.prompt_tokens
    assert moved("minillm:request_success_total{finished_reason=length}") == 2
    assert moved("minillm:time_to_first_token_seconds_count") == 2
    assert moved("minillm:e2e_request_latency_seconds_count") == 2
    assert moved("minillm:inter_token_latency_seconds_count") == 8       # 4 gaps between 5 tokens, twice
    assert after["minillm:num_requests_running"] == after["minillm:kv_blocks_used"] == 0


@pytest.mark.slow
def test_smollm2_chat_answers_like_the_engine():
    model, tokenizer = load_model("SmolLM2-135M-Instruct", device="cpu")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    offline = LLMEngine(model, tokenizer, num_kv_blocks=64)
    (expected,) = offline.generate([tokenizer.apply_chat_template(messages)],
                                   SamplingParams(temperature=0, max_tokens=12))
    srv = serve_in_thread(build_app(LLMEngine(model, tokenizer, num_kv_blocks=64), "SmolLM2-135M-Instruct"))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0,
                                           max_tokens=12)
        stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0,
                                                max_tokens=12, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream)
    finally:
        stop_server(srv)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.content == streamed == expected.outputs[0].text


def test_logprobs_through_both_endpoints_match_the_engine(client, tiny):
    """The sampled tokens' logprobs and the top k, in OpenAI's shapes, equal the engine's
    (which tests/test_logprobs.py checks against the model's own log-softmax)."""
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, **OPTIONS)
    want = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=5, logprobs=2))[0].outputs[0]
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([s[t].logprob for s, t in zip(want.logprobs, want.token_ids)])
    assert lp.tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in want.token_ids]
    assert all(len(top) in (2, 3) and max(top.values()) == pytest.approx(lp.token_logprobs[i])
               for i, top in enumerate(lp.top_logprobs))                  # greedy: the sampled token is the best
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    streamed = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=5, temperature=0,
                                         logprobs=2, stream=True)
    got = [x for chunk in streamed for c in chunk.choices if c.logprobs for x in c.logprobs.token_logprobs]
    assert got == pytest.approx(lp.token_logprobs)

    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)     # greedy
    assert all(a.logprob >= b.logprob for c in content for a, b in zip(c.top_logprobs, c.top_logprobs[1:]))
    assert client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2).choices[0].logprobs is None
