"""Structured outputs and tool calls through the official `openai` client and langchain-openai:
response_format (json_object, json_schema, the client's own `parse` with a pydantic model),
vLLM's structured_outputs extra, tool_choice naming a function or "required" (streamed too),
and "auto" refused by name. The embedded SmolLM2 answers (a real model closes its strings)."""
import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from minillm.engine.engine import LLMEngine
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 30},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Describe a person called Ada, aged 36, as JSON."}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(smol):
    srv = serve_in_thread(build_app(LLMEngine(smol[0], smol[1], num_kv_blocks=256, max_model_len=512),
                                    "SmolLM2-135M-Instruct"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "SmolLM2-135M-Instruct", "max_tokens": 80, "temperature": 0,
                                             **kw})


def test_response_format_json_schema_and_json_object(client):
    r = chat(client, messages=ASK, response_format={"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert r.choices[0].finish_reason == "stop"
    r = chat(client, messages=ASK, response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}, n=2,
             temperature=1.0, seed=3)
    for c in r.choices:                  # sampled, each sample its own matcher
        jsonschema.validate(json.loads(c.message.content), PERSON)
    r = chat(client, response_format={"type": "json_object"}, messages=[
        {"role": "user", "content": "Return a JSON object with one key, city, for the capital of France."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    completion = client.completions.create(model="SmolLM2-135M-Instruct", prompt="A person as JSON:", max_tokens=80,
                                           temperature=0, extra_body={"response_format": {
                                               "type": "json_schema", "json_schema": {"schema": PERSON}}})
    jsonschema.validate(json.loads(completion.choices[0].text), PERSON)


def test_the_openai_clients_parse_with_a_pydantic_model(client):
    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)
        mood: Literal["happy", "sad"]

    r = client.chat.completions.parse(model="SmolLM2-135M-Instruct", messages=ASK, response_format=Person,
                                      max_tokens=80, temperature=0)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and person.mood in ("happy", "sad")


def test_vllms_structured_outputs_extra(client):
    r = chat(client, messages=[{"role": "user", "content": "Is Paris in France?"}],
             extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in ("yes", "no")
    r = chat(client, messages=[{"role": "user", "content": "A US zip code?"}],
             extra_body={"structured_outputs": {"regex": "[0-9]{5}"}})
    assert len(r.choices[0].message.content) == 5 and r.choices[0].message.content.isdigit()


def test_a_named_tool_call_and_its_stream(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = chat(client, messages=WEATHER_ASK, tools=[WEATHER, TIME], tool_choice=choice)
    message = r.choices[0].message
    assert message.content is None and r.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    pieces, names, finish = [], set(), None
    for chunk in chat(client, messages=WEATHER_ASK, tools=[WEATHER, TIME], tool_choice=choice, stream=True):
        delta = chunk.choices[0].delta
        for c in delta.tool_calls or []:
            names.add(c.function.name)
            pieces.append(c.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert names - {None} == {"get_weather"} and "".join(pieces) == call.function.arguments
    assert finish == "tool_calls"


def test_tool_choice_required_picks_one_of_the_tools(client):
    for stream in (False, True):
        if not stream:
            (call,) = chat(client, messages=WEATHER_ASK, tools=[WEATHER, TIME], tool_choice="required").choices[
                0].message.tool_calls
        else:
            calls = [c for chunk in chat(client, messages=WEATHER_ASK, tools=[WEATHER, TIME], tool_choice="required",
                                         stream=True) for c in chunk.choices[0].delta.tool_calls or []]
            (call,) = calls
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_tool_choice_auto_is_refused_by_name_and_none_answers_in_text(client):
    with pytest.raises(openai.BadRequestError, match="auto") as e:
        chat(client, messages=WEATHER_ASK, tools=[WEATHER])
    assert e.value.body["param"] == "tool_choice"
    r = chat(client, messages=WEATHER_ASK, tools=[WEATHER], tool_choice="none", max_tokens=5)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_langchain_with_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")

    class City(BaseModel):
        """A city and its country."""
        city: str = Field(max_length=30)
        country: str = Field(max_length=30)

    llm = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="SmolLM2-135M-Instruct",
                                      temperature=0, max_tokens=60, max_retries=0)
    for method in ("json_schema", "function_calling"):
        answer = llm.with_structured_output(City, method=method).invoke("Name the capital of France.")
        assert isinstance(answer, City) and answer.city, method
