"""Tool calls in "auto" through a real `python -m minillm serve` on the embedded SmolLM2 (which
the server gives minillm's hermes-style tool template and the hermes parser by default), with
the official `openai` client and langchain-openai: a text answer and a call answer (tool_choice
absent and "auto", streamed too), a two-turn tool loop, two calls in one answer, langchain's
bind_tools agent loop and with_structured_output(method="function_calling"), and bad input
(each a 400 naming the field, or a startup error naming the flag). One server for the module.
The model is greedy: the prompts below were picked to make it call or not; once it opens a call,
the grammar holds the call to a tool's schema, so every call checked here must be valid."""
import json
import os
import re
import subprocess
import sys
import time

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": CITY}}
TOOLS = [WEATHER, TIME]
CALL_ASK = [{"role": "user", "content": "Reply with a <tool_call> to get_weather for Paris."}]
TEXT_ASK = [{"role": "user", "content": "Hello! How are you?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", "0", "--num-kv-blocks", "128",
                                 "--max-model-len", "1024"], stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 180
        while not (url := re.search(r"serving on (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def chat(client, **kw):
    return client.chat.completions.create(**{"model": MODEL, "max_tokens": 40, "temperature": 0, "tools": TOOLS, **kw})


def valid(call):
    """A call names one of the tools and its arguments match that tool's schema."""
    tool = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, {**tool, "additionalProperties": False})
    return call.function.name, arguments


def test_auto_answers_text_or_a_valid_call(client):
    r = chat(client, messages=TEXT_ASK)                        # tool_choice absent: "auto"
    (c,) = r.choices
    assert c.finish_reason == "stop" and c.message.tool_calls is None and c.message.content.strip()
    r = chat(client, messages=CALL_ASK, tool_choice="auto", parallel_tool_calls=False)
    (c,) = r.choices
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert valid(call) == ("get_weather", {"city": "Paris"}) and call.id.startswith("call_")
    chunks = list(chat(client, messages=CALL_ASK, parallel_tool_calls=False, stream=True))
    deltas = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (0, "get_weather", call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks).strip()


def test_two_turn_tool_loop(client):
    first = chat(client, messages=CALL_ASK, parallel_tool_calls=False).choices[0].message
    (call,) = first.tool_calls
    history = CALL_ASK + [first.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    r = chat(client, messages=history, parallel_tool_calls=False)
    (c,) = r.choices
    assert r.usage.prompt_tokens > 60                          # the call and its result are in the prompt
    if c.message.tool_calls:                                   # a second call is fine, if valid
        assert c.finish_reason == "tool_calls" and valid(c.message.tool_calls[0])
    else:
        assert c.message.content.strip() and c.finish_reason in ("stop", "length")


def test_history_takes_the_answer_back_as_clients_send_it(client):
    """The common agent loop appends the answer object itself (openai: `messages.append(message)`;
    litellm dumps it whole, with `index`, `function_call` and `provider_specific_fields` set to
    null): the next turn must take it back. The answer's own calls carry no `index`."""
    first = chat(client, messages=CALL_ASK, parallel_tool_calls=False).choices[0].message
    (call,) = first.tool_calls
    assert "index" not in first.model_dump(exclude_unset=True)["tool_calls"][0]
    tool = {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}
    litellm_style = dict(first.model_dump(), function_call=None, provider_specific_fields=None,
                         tool_calls=[dict(c.model_dump(), index=None) for c in first.tool_calls])
    for echoed in (first, litellm_style):
        r = chat(client, messages=CALL_ASK + [echoed, tool], parallel_tool_calls=False, max_tokens=8)
        assert r.usage.prompt_tokens > 60 and r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError, match="function_call"):    # echoed fields must be empty
        chat(client, messages=CALL_ASK + [dict(litellm_style, function_call={"name": "x"}), tool])


def test_two_calls_in_one_answer(client):
    r = chat(client, messages=[{"role": "user", "content": "Reply with a <tool_call> to get_weather for Paris and "
                                                           "a <tool_call> to get_time for Tokyo."}], max_tokens=72)
    (c,) = r.choices
    calls = c.message.tool_calls
    assert c.finish_reason in ("tool_calls", "length") and len(calls) >= 2, c     # (it may go on calling)
    assert [valid(x) for x in calls[:2]] == [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo"})]
    assert len({x.id for x in calls}) == len(calls)


def test_tools_reach_the_template(client):
    bare = client.chat.completions.create(model=MODEL, messages=TEXT_ASK, max_tokens=1)
    with_tools = chat(client, messages=TEXT_ASK, max_tokens=1)
    assert with_tools.usage.prompt_tokens > bare.usage.prompt_tokens + 50


def test_bad_input_is_a_400_naming_the_field_and_stalls_nothing(client):
    with pytest.raises(openai.BadRequestError) as e:            # a tool schema llguidance refuses
        chat(client, messages=TEXT_ASK, tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)a"}}}}}])
    assert e.value.body["param"] == "tools" and "look-around" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:            # a request's own template: not trusted here
        chat(client, messages=TEXT_ASK, extra_body={"chat_template": "{{ messages[0]['content'] }}"})
    assert e.value.body["param"] == "chat_template" and "--trust-request-chat-template" in e.value.body["message"]
    assert chat(client, messages=TEXT_ASK, max_tokens=3).choices[0].message.content


def test_langchain_agent_loop_and_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"18 degrees and sunny in {city}"

    llm = langchain_openai.ChatOpenAI(base_url=server + "/v1", api_key="unused", model=MODEL, temperature=0,
                                      max_tokens=40, max_retries=0)
    agent = llm.bind_tools([get_weather])                      # no tool_choice: "auto"
    messages = [HumanMessage("Reply with a <tool_call> to get_weather for Paris.")]
    for _ in range(3):                                         # call, result, ... until a text answer
        answer = agent.invoke(messages)
        messages.append(answer)
        if not answer.tool_calls:
            break
        for call in answer.tool_calls:
            assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
            messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    assert any(getattr(m, "tool_calls", None) for m in messages) and isinstance(messages[-1].content, str)

    class City(BaseModel):
        """A city and its country."""
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    city = llm.with_structured_output(City, method="function_calling").invoke("Name the capital of France.")
    assert isinstance(city, City) and city.name


def test_bad_flags_are_startup_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "minillm", "serve", "--tool-call-parser", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tool-call-parser" in r.stderr and "hermes" in r.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}")
    r = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", "tiny-llama", "--chat-template", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--chat-template" in r.stderr and "nosuchfilter" in r.stderr


def test_request_templates_and_auto_without_the_flags():
    """In-process on a tiny model: a server without --enable-auto-tool-choice refuses "auto" by the
    flag's name; a trusted request template is the one rendered, and one that fails is a 400."""
    from minillm.engine.engine import LLMEngine
    from minillm.models.loader import load_tokenizer
    from minillm.models.tiny import build_tiny
    from minillm.server.app import build_app
    from minillm.server.chat_setup import ChatSettings
    from minillm.server.run import serve_in_thread, stop_server

    tokenizer = load_tokenizer()
    app = build_app(LLMEngine(build_tiny("tiny-llama"), tokenizer, num_kv_blocks=32, max_model_len=256), "tiny")
    app.state.served.chat = ChatSettings(trust_request_chat_template=True)
    srv = serve_in_thread(app)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        ask = dict(model="tiny", messages=TEXT_ASK, max_tokens=2, temperature=0)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**ask, tools=TOOLS)
        assert e.value.body["param"] == "tool_choice" and "--enable-auto-tool-choice" in e.value.body["message"]
        template = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
        r = c.chat.completions.create(**ask, extra_body={"chat_template": template})
        assert r.usage.prompt_tokens == len(tokenizer.encode("<<Hello! How are you?>>"))
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**ask, extra_body={"chat_template": "{{ messages | nosuchfilter }}"})
        assert e.value.body["param"] == "chat_template" and "nosuchfilter" in e.value.body["message"]
        assert c.chat.completions.create(**ask).usage.completion_tokens == 2
    finally:
        stop_server(srv)
