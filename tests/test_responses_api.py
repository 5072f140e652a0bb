"""The Responses API (POST /v1/responses) through the official `openai` client against a real
server on the embedded SmolLM2, with the tool template and hermes parser `minillm serve` gives
it: plain and streamed (the events in order, the text equal to the non-streamed greedy answer),
previous_response_id continuation and a gone id (400 naming the field), function tools (a call
comes out as a function_call item), a function_call_output as input, and bad input (limits)."""
import json

import httpx
import openai
import pytest

from minillm.engine.engine import LLMEngine
from minillm.server.app import build_app
from minillm.server.chat_setup import EMBEDDED_TOOLS_TEMPLATE, ChatSettings
from minillm.server.responses_api.store import ResponseStore
from minillm.server.run import serve_in_thread, stop_server
from minillm.server.tool_parsers import get_tool_parser

MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}


@pytest.fixture(scope="module")
def server(smol):
    app = build_app(LLMEngine(smol[0], smol[1], num_kv_blocks=256, max_model_len=1024), MODEL)
    app.state.served.chat = ChatSettings(tool_parser=get_tool_parser("hermes"),
                                         chat_template=EMBEDDED_TOOLS_TEMPLATE.read_text())
    app.state.response_store = ResponseStore(max_entries=3)      # small, to see eviction
    srv = serve_in_thread(app)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def create(client, **kw):
    return client.responses.create(**{"model": MODEL, "max_output_tokens": 24, "temperature": 0, **kw})


def test_plain_and_streamed_agree(client):
    r = create(client, input="What is the capital of France?", instructions="Answer in one short sentence.")
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and r.output_text.strip()
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events = list(create(client, input="What is the capital of France?", instructions="Answer in one short sentence.",
                         stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if r.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == r.output_text == events[-4].text
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens == \
        r.usage.output_tokens


def test_previous_response_id_continues_and_a_gone_id_is_a_400(client):
    first = create(client, input="My name is Ada. Please remember it.", max_output_tokens=8)
    alone = create(client, input="What is my name?", max_output_tokens=8, store=False)
    follow = create(client, input="What is my name?", max_output_tokens=8, previous_response_id=first.id)
    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens   # the history is in
    assert client.responses.retrieve(follow.id).output_text == follow.output_text
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="again", previous_response_id=alone.id)         # store=false: never stored
    assert e.value.body["param"] == "previous_response_id" and alone.id in e.value.body["message"]
    for _ in range(3):                                                        # the store keeps 3: first is evicted
        create(client, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="again", previous_response_id=follow.id)
    assert e.value.body["param"] == "previous_response_id"


def test_a_function_call_is_an_output_item_and_its_output_an_input_item(client):
    ask = "Reply with a <tool_call> to get_weather for Paris."
    r = create(client, input=ask, tools=[WEATHER], max_output_tokens=40, parallel_tool_calls=False)
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[0].call_id.startswith("call_") and r.tools[0].name == "get_weather"
    events = list(create(client, input=ask, tools=[WEATHER], max_output_tokens=40, parallel_tool_calls=False,
                         stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == calls[0].arguments
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
        calls[0].arguments
    # the second turn: the call and its output as input items; the model answers in text
    history = [{"role": "user", "content": ask},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 degrees"}]
    r2 = create(client, input=history, tools=[WEATHER], tool_choice="none", max_output_tokens=30)
    assert r2.output[0].type == "message" and r2.output_text.strip()
    # the same turn by previous_response_id: only the output is sent
    r3 = create(client, previous_response_id=r.id, tools=[WEATHER], tool_choice="none", max_output_tokens=30,
                input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 degrees"}])
    assert r3.usage.input_tokens == r2.usage.input_tokens and r3.output_text == r2.output_text


def post(server, body):
    return httpx.post(server.url + "/v1/responses", json=body, timeout=60)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": "hi"}] * 1025}, "input"),
    ({"input": "hi", "instructions": "x" * (1 << 20 + 1)}, "instructions"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 65}]}, "input"),
    ({"input": "hi", "tools": [WEATHER] * 129}, "tools"),
    ({"input": "hi", "previous_response_id": "r" * 129}, "previous_response_id"),
    ({"input": "hi", "previous_response_id": "resp_never"}, "previous_response_id"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "hi", "surprise": 1}, "surprise"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input"),
    ({"input": "hi", "model": "gpt-4o"}, "model"),
])
def test_bad_input_is_refused_by_name(server, body, param):
    r = post(server, body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"].split(".")[0] == param, r.text


def test_null_options_take_their_defaults(server):
    r = post(server, {"input": "Hi", "max_output_tokens": 2, "store": None, "stream": None, "temperature": None})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["store"] is True and body["output"][0]["type"] == "message"
    assert httpx.get(f"{server.url}/v1/responses/{body['id']}").json()["id"] == body["id"]


def test_text_format_and_a_named_tool_choice(client):
    r = create(client, input="Name the capital of France as JSON.", max_output_tokens=30,
               text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    assert set(json.loads(r.output_text)) == {"city"} and r.text.format.type == "json_schema"
    r = create(client, input="Hello!", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
               max_output_tokens=30)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
