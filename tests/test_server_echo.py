"""echo, max_tokens 0 and prompt_logprobs through the official `openai` client and raw HTTP:
lm-eval's loglikelihood request (token ids, echo, logprobs 1, max_tokens 0 or 1) answered
with the model's own log-softmax over the prompt (transformers' twin computes it here)."""
import httpx
import openai
import pytest
import torch

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

from conftest import get_model

OPTIONS = dict(num_kv_blocks=128, max_model_len=256)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny():
    return get_model("tiny-llama")


@pytest.fixture(scope="module")
def server(tiny):
    srv = serve_in_thread(build_app(LLMEngine(tiny[0], tiny[1], **OPTIONS), "tiny-llama"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def scores(twin, ids: list[int]) -> list[float]:
    """log p(ids[p] | ids[:p]) for p >= 1, by transformers."""
    with torch.no_grad():
        logp = torch.log_softmax(twin(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [float(logp[p - 1, ids[p]]) for p in range(1, len(ids))]


def test_lm_evals_loglikelihood_request(tiny, client):
    """As lm-eval's local-completions sends it: two token-id prompts, echo, logprobs 1, max_tokens 1;
    it sums token_logprobs[ctxlen:-1] and calls a continuation greedy if each token is the top one."""
    tokenizer, twin = tiny[1], tiny[2]
    contexts = [tokenizer.encode(PROMPT), tokenizer.encode("Once upon a time")]
    continuations = [tokenizer.encode(" Paris"), tokenizer.encode(" there lived")]
    prompts = [c + x for c, x in zip(contexts, continuations)]
    r = client.completions.create(model="tiny-llama", prompt=prompts, echo=True, logprobs=1, max_tokens=1,
                                  temperature=0, seed=1234)
    for choice, prompt, ctx in zip(sorted(r.choices, key=lambda c: c.index), prompts, contexts):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(prompt) + 1          # the prompt, then the one generated token
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:-1] == pytest.approx(scores(twin, prompt), abs=1e-4)
        assert choice.text.startswith(tokenizer.decode(prompt))
        assert lp.tokens[:len(prompt)] == [tokenizer.decode([t], skip_special_tokens=False) for t in prompt]
        for token_lp, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert max(top.values()) >= token_lp and len(top) in (1, 2)
        loglikelihood = sum(lp.token_logprobs[len(ctx):-1])
        assert loglikelihood == pytest.approx(sum(scores(twin, prompt)[len(ctx) - 1:]), abs=1e-3)
        offsets = lp.text_offset
        assert offsets[0] == 0 and all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], lp.tokens))
    assert r.usage.completion_tokens == 2


def test_echo_with_max_tokens_zero_scores_the_prompt_only(tiny, client):
    twin = tiny[2]
    r = client.completions.create(model="tiny-llama", prompt=PROMPT, echo=True, logprobs=0, max_tokens=0)
    (choice,) = r.choices
    ids = tiny[1].encode(PROMPT)
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(scores(twin, ids), abs=1e-4)
    assert len(choice.logprobs.tokens) == len(ids)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)


def test_echo_without_logprobs_and_streamed(tiny, client):
    plain = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=5, temperature=0)
    echoed = client.completions.create(model="tiny-llama", prompt=PROMPT, echo=True, max_tokens=5, temperature=0)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text and echoed.choices[0].logprobs is None
    stream = client.completions.create(model="tiny-llama", prompt=PROMPT, echo=True, logprobs=1, max_tokens=5,
                                       temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text
    assert chunks[0].choices[0].text.startswith(PROMPT)
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert len(tokens) == len(tiny[1].encode(PROMPT)) + 5
    assert offsets[0] == 0 and all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], tokens))


def test_prompt_logprobs_field_on_both_endpoints(tiny, server):
    tokenizer = tiny[1]
    engine = LLMEngine(tiny[0], tokenizer, **OPTIONS)
    ids = tokenizer.encode(PROMPT)
    want = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=2))[0].prompt_logprobs
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 2})
    got = r.json()["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for entry, expected in zip(got[1:], want[1:]):
        assert set(map(int, entry)) == set(expected)
        for t, lp in expected.items():
            e = entry[str(t)]
            assert (e["rank"], e["decoded_token"]) == (lp.rank, lp.decoded_token)
            assert e["logprob"] == pytest.approx(lp.logprob, abs=1e-5)
    chat = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 2
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])       # k = 0: the prompt token alone
    assert httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}).json()[
        "choices"][0]["prompt_logprobs"] is None
