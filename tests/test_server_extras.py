"""vLLM's extras through the official `openai` client: each field accepted and honoured (the
answer equals the engine's offline for the same SamplingParams, and shows the effect), usage in
every chunk, chat history with tool calls, the chat template's options, and what is still
refused, by name."""
import copy
import json

import httpx
import openai
import pytest

from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import SamplingParams
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server
from minillm.text.tokenizer import Tokenizer

OPTIONS = dict(num_kv_blocks=128, max_model_len=256)
PROMPT = "The capital of France is"
EOS, IM_START = 2, 1            # <|im_end|> (the tiny models' EOS) and <|im_start|>, both special
CHAT = [{"role": "user", "content": "Hi there"}]
TOOL_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor -%}"
    "{% if greeting %}{{ greeting }}{% endif %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
TOOL_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def tool_tokenizer(tiny):
    hf = copy.deepcopy(tiny[1].hf)
    hf.chat_template = TOOL_TEMPLATE
    return Tokenizer(hf, sorted(tiny[1].eos_token_ids))


@pytest.fixture(scope="module")
def offline(tiny):
    engine = LLMEngine(*tiny, **OPTIONS)

    def generate(prompt, **params):
        return engine.generate([prompt], SamplingParams(**params))[0].outputs[0]
    return generate


def serve(model, tokenizer):
    srv = serve_in_thread(build_app(LLMEngine(model, tokenizer, **OPTIONS), "tiny-llama"))
    return srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def client(tiny):
    srv, c = serve(*tiny)
    c.url = srv.url
    yield c
    stop_server(srv)


@pytest.fixture(scope="module")
def tool_client(tiny, tool_tokenizer):
    srv, c = serve(tiny[0], tool_tokenizer)
    yield c
    stop_server(srv)


def complete(client, **kw):
    extra = {k: kw.pop(k) for k in list(kw) if k not in ("max_tokens", "temperature", "seed", "stop", "n", "stream",
                                                         "stream_options", "presence_penalty", "frequency_penalty",
                                                         "logit_bias")}
    return client.completions.create(model="tiny-llama", prompt=kw.pop("prompt", PROMPT), extra_body=extra, **kw)


@pytest.mark.parametrize("fields", [
    dict(presence_penalty=1.5, frequency_penalty=-0.5, temperature=0.9, seed=3),
    dict(repetition_penalty=0.3, temperature=0),
    dict(min_p=0.2, temperature=1.5, seed=9),
    dict(logit_bias={"4000": 9.0, "4001": 8.5}, presence_penalty=2.0, temperature=0),
    dict(top_k=40, min_p=0.05, repetition_penalty=1.4, temperature=0.8, seed=1),
], ids=["presence+frequency", "repetition", "min_p", "logit_bias", "mixed"])
def test_sampling_extras_give_the_engines_tokens(client, offline, fields):
    r = complete(client, max_tokens=12, ignore_eos=True, **fields)
    params = {k: v for k, v in fields.items() if k != "logit_bias"}
    if "logit_bias" in fields:
        params["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
    assert r.choices[0].text == offline(PROMPT, max_tokens=12, ignore_eos=True, **params).text


def test_logit_bias_and_repetition_penalty_show_their_effect(client, offline, tiny):
    tokenizer = tiny[1]
    forced = complete(client, max_tokens=4, temperature=0, logit_bias={"4000": 100})
    assert forced.choices[0].text == tokenizer.decode([4000] * 4)
    plain = offline(PROMPT, max_tokens=12, temperature=0, ignore_eos=True).token_ids
    penalised = complete(client, max_tokens=12, temperature=0, ignore_eos=True, repetition_penalty=0.3)
    tokens = offline(PROMPT, max_tokens=12, temperature=0, ignore_eos=True, repetition_penalty=0.3).token_ids
    assert len(set(plain)) == 12 and len(set(tokens)) < 12          # a penalty < 1 makes seen tokens come back
    assert penalised.choices[0].text == tokenizer.decode(tokens) != tokenizer.decode(plain)


def test_min_tokens_holds_eos_back_and_skip_special_tokens(client, tiny):
    pushed = dict(temperature=0, logit_bias={str(EOS): 100})
    assert complete(client, max_tokens=10, **pushed).usage.completion_tokens == 1
    r = complete(client, max_tokens=10, min_tokens=5, **pushed)
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "stop"
    shown = complete(client, max_tokens=3, temperature=0, logit_bias={str(IM_START): 100}, skip_special_tokens=False,
                     spaces_between_special_tokens=False)
    assert shown.choices[0].text == "<|im_start|>" * 3
    hidden = complete(client, max_tokens=3, temperature=0, logit_bias={str(IM_START): 100})
    assert hidden.choices[0].text == ""
    eos_hidden = complete(client, max_tokens=10, min_tokens=1, skip_special_tokens=False, **pushed)
    assert eos_hidden.choices[0].finish_reason == "stop" and "<|im_end|>" not in eos_hidden.choices[0].text
    eos_kept = complete(client, max_tokens=10, min_tokens=1, skip_special_tokens=False,
                        include_stop_str_in_output=True, **pushed)
    assert eos_kept.choices[0].text.endswith("<|im_end|>")


def test_stop_token_ids_and_include_stop_str_in_output(client, offline):
    free = offline(PROMPT, max_tokens=16, temperature=0, ignore_eos=True)
    third = free.token_ids[2]
    r = complete(client, max_tokens=16, temperature=0, ignore_eos=True, stop_token_ids=[third])
    assert r.usage.completion_tokens == free.token_ids.index(third) + 1 and r.choices[0].finish_reason == "stop"
    stop = free.text[len(free.text) // 2:len(free.text) // 2 + 3]
    kept = complete(client, max_tokens=16, temperature=0, ignore_eos=True, stop=stop, include_stop_str_in_output=True)
    assert kept.choices[0].text == free.text[:free.text.index(stop) + len(stop)]
    streamed = complete(client, max_tokens=16, temperature=0, ignore_eos=True, stop=stop,
                        include_stop_str_in_output=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == kept.choices[0].text


def test_max_completion_tokens_on_completions(client):
    r = complete(client, max_completion_tokens=3, temperature=0, ignore_eos=True)
    assert r.usage.completion_tokens == 3


def test_continuous_usage_stats_put_usage_in_every_chunk(client):
    for create in (lambda **kw: complete(client, ignore_eos=True, **kw),
                   lambda **kw: client.chat.completions.create(model="tiny-llama", messages=CHAT,
                                                               extra_body={"ignore_eos": True}, **kw)):
        chunks = list(create(max_tokens=6, temperature=0, stream=True, n=2,
                             stream_options={"include_usage": True, "continuous_usage_stats": True}))
        assert all(c.usage is not None for c in chunks)
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 12 and chunks[-1].choices == []
        assert len({c.usage.prompt_tokens for c in chunks}) == 1
        plain = list(create(max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}))
        assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 6


def test_chat_template_options(tool_client, tool_tokenizer, tiny, offline):
    prefill = CHAT + [{"role": "assistant", "content": "Well"}]
    ids = tool_tokenizer.apply_chat_template(prefill, add_generation_prompt=False, continue_final_message=True)
    r = tool_client.chat.completions.create(model="tiny-llama", messages=prefill, max_tokens=5, temperature=0,
                                            extra_body={"continue_final_message": True})
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == offline(
        ids, max_tokens=5, temperature=0).text
    assert tool_tokenizer.decode(ids).endswith("assistant\nWell")
    ids = tool_tokenizer.apply_chat_template(CHAT, add_generation_prompt=False)
    r = tool_client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=5, temperature=0,
                                            extra_body={"add_generation_prompt": False})
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == offline(
        ids, max_tokens=5, temperature=0).text
    ids = tool_tokenizer.apply_chat_template(CHAT, template_kwargs={"greeting": "HELLO"})
    r = tool_client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=5, temperature=0,
                                            extra_body={"chat_template_kwargs": {"greeting": "HELLO"}})
    assert "HELLO" in tool_tokenizer.decode(ids) and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == offline(ids, max_tokens=5, temperature=0).text


def test_tool_history_is_rendered_by_a_template_that_supports_it(tool_client, tool_tokenizer, offline):
    r = tool_client.chat.completions.create(model="tiny-llama", messages=TOOL_HISTORY, max_tokens=5, temperature=0)
    as_template = [dict(m) for m in TOOL_HISTORY]
    as_template[1] = {**TOOL_HISTORY[1], "tool_calls": [
        {**TOOL_HISTORY[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    ids = tool_tokenizer.apply_chat_template(as_template)
    assert '<tool_call>get_weather {"city": "Paris"}</tool_call>' in tool_tokenizer.decode(ids)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == offline(ids, max_tokens=5, temperature=0).text


def test_the_embedded_template_takes_tool_results_but_refuses_tool_calls(client, tiny):
    """SmolLM2's template renders any role as <|im_start|>role (so a "tool" message goes through)
    but never reads tool_calls: an assistant turn with them would be dropped, so it is a 400."""
    answer = [CHAT[0], {"role": "assistant", "content": "Let me check."},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = client.chat.completions.create(model="tiny-llama", messages=answer, max_tokens=2, temperature=0)
    ids = tiny[1].apply_chat_template([{k: v for k, v in m.items() if k != "tool_call_id"} for m in answer])
    assert r.usage.prompt_tokens == len(ids) and "<|im_start|>tool\nsunny" in tiny[1].decode(ids, False)
    for history in (TOOL_HISTORY, [TOOL_HISTORY[0], {**TOOL_HISTORY[1], "content": "Checking."}]):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny-llama", messages=history, max_tokens=2)
        assert e.value.body["param"] == "messages"
        assert "need a chat template that supports them" in e.value.body["message"]
        assert "is not valid; expected one of" not in e.value.body["message"]


def test_a_template_that_raises_on_tool_messages_says_so(tiny):
    hf = copy.deepcopy(tiny[1].hf)
    hf.chat_template = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}"
                        "{% endif %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match="no tools here.*need a chat template that supports them"):
        Tokenizer(hf).apply_chat_template(TOOL_HISTORY[:1] + TOOL_HISTORY[2:])


def post(client, path, body):
    return httpx.post(client.url + path, json=body, timeout=60)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"-3": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"49152": 1}}, "logit_bias"),           # the vocabulary is 49152
    ("/v1/completions", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"min_p": 1.5}, "min_p"),
    ("/v1/completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("/v1/completions", {"skip_special_tokens": "no"}, "skip_special_tokens"),
    ("/v1/completions", {"stop_token_ids": [1.5]}, "stop_token_ids.0"),
    ("/v1/completions", {"stream": True, "stream_options": {"continuous_usage_stats": "yes"}},
     "stream_options.continuous_usage_stats"),
    ("/v1/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/chat/completions", {"prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"suffix": "x"}, "suffix"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"add_generation_prompt": True, "continue_final_message": True},
     "add_generation_prompt"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}},
     "response_format"),
    ("/v1/chat/completions", {"structured_outputs": {"regex": "(("}}, "structured_outputs"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages.0"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]},
     "messages.0.tool_calls.0.function.arguments"),
])
def test_bad_extras_and_unsupported_fields_are_a_400_by_name(client, path, body, param):
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": CHAT}
    r = post(client, path, {**base, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    if param in ("suffix", "best_of"):
        assert "not supported" in error["message"]
    assert "is not valid; expected one of" not in error["message"]


def test_the_server_still_serves_after_the_refusals(client, offline):
    r = post(client, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == offline(PROMPT, max_tokens=4,
                                                                               temperature=0).text
    assert json.loads(r.text)["usage"]["completion_tokens"] <= 4
