"""Each tool-call parser against answers in its family's format (as Qwen2.5/Qwen3, Llama 3.1 and
Mistral write them), its lazy grammar against the same answers (text passes, a call that breaks
the tool's schema is refused), and JSON schemas closed as vLLM/OpenAI strict read them."""
import json

import pytest

from minillm.server.tool_parsers import TOOL_PARSERS, get_tool_parser
from minillm.structured import StructuredOutputsParams
from minillm.structured.grammar import grammar_text
from minillm.structured.schema import close_objects

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}},
         {"name": "get_time", "parameters": None}]
PARIS, NOW = ("get_weather", {"city": "Paris"}), ("get_time", {})
ANSWERS = {     # family -> [(answer, content, calls)]
    "hermes": [("The sky is blue.", "The sky is blue.", []),
               ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [PARIS]),
               ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Let me check.", [PARIS, NOW])],
    "llama3_json": [("The sky is blue.", "The sky is blue.", []),
                    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
                    ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}',
                     None, [PARIS, NOW])],
    "mistral": [("The sky is blue.", "The sky is blue.", []),
                ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
                ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
                 '"arguments": {}}]', None, [PARIS, NOW])],
}


@pytest.fixture(scope="module")
def ll_tokenizer():
    import llguidance.hf

    from minillm.models.loader import load_tokenizer
    return load_tokenizer(), llguidance.hf.from_tokenizer(load_tokenizer().hf, n_vocab=49152)


def accepts(ll_tokenizer, grammar: str, text: str) -> bool:
    from llguidance import LLMatcher
    tok, ll = ll_tokenizer
    m = LLMatcher(ll, grammar)
    return all(m.consume_token(t) for t in tok.hf.encode(text)) and m.is_accepting()


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_parser_reads_its_family_and_its_grammar_holds_it(family, ll_tokenizer):
    parser = get_tool_parser(family)
    grammar = parser.grammar(TOOLS, parallel=True)
    for answer, content, calls in ANSWERS[family]:
        got_content, got = parser.parse(answer)
        assert (got_content, [(c.name, json.loads(c.arguments)) for c in got]) == (content, calls)
        assert accepts(ll_tokenizer, grammar, answer), answer
    one_call = parser.grammar(TOOLS, parallel=False)
    assert accepts(ll_tokenizer, one_call, ANSWERS[family][1][0])
    assert not accepts(ll_tokenizer, one_call, ANSWERS[family][2][0])              # two calls: not allowed
    bad = ANSWERS[family][1][0].replace('{"city": "Paris"}', '{"city": "Paris", "x": 1}')
    assert not accepts(ll_tokenizer, grammar, bad)                                  # a key the tool lacks
    assert not accepts(ll_tokenizer, grammar, bad.replace("get_weather", "rm_rf"))  # a tool that is not there
    assert parser.parse(ANSWERS[family][1][0][:-20])[1] == []                     # cut inside its JSON


def test_a_cut_off_answer_and_odd_shapes():
    hermes = get_tool_parser("hermes")
    cut = ANSWERS["hermes"][2][0][:-20]                     # max_tokens ran out inside the second call
    assert [c.name for c in hermes.parse(cut)[1]] == ["get_weather"]
    assert hermes.parse('<tool_call>\n{"name": "get_weather", "argu')[1] == []
    assert get_tool_parser("llama3_json").parse('<|python_tag|>{"name": "get_time", "parameters": {}}')[1][0].name \
        == "get_time"
    (call,) = get_tool_parser("mistral").parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')[1]
    assert (call.name, json.loads(call.arguments)) == PARIS
    assert hermes.held_back("Sure <tool") == 5 and hermes.held_back("Sure") == 0
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral"):
        get_tool_parser("nope")
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral"}


def test_objects_without_additional_properties_are_closed(ll_tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
              "required": ["a"]}
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert close_objects({"type": "object"}) == {"type": "object"}          # lists no keys: any object
    assert "additionalProperties" not in close_objects({"allOf": [{"properties": {"a": {}}}]})["allOf"][0]
    spec = StructuredOutputsParams(json=schema)
    extra = '{"a": {"b": 1}, "c": 2}'
    assert not accepts(ll_tokenizer, grammar_text(spec), extra)
    assert accepts(ll_tokenizer, grammar_text(spec), '{"a": {"b": 1}}')
    assert accepts(ll_tokenizer, grammar_text(spec, allow_additional_properties=True), extra)


def test_a_streamed_auto_answer_sends_text_then_whole_calls():
    """Text goes out as content except what may be the trigger's start; each call goes out whole
    (index, id, name, arguments) once closed; the finish reason says tool_calls."""
    from minillm.server.chat_setup import ChatSettings
    from minillm.server.protocol import ChatCompletionRequest
    from minillm.server.tool_calls import ToolCallStream

    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[
        {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}} for t in TOOLS])
    req._chat = ChatSettings(tool_parser=get_tool_parser("hermes"))
    stream = ToolCallStream(req)
    pieces = ["Let me ", "check.\n<tool", '_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_',
              'call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>']
    deltas = [stream.delta(0, p, "stop" if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)]
    assert [d.content for d in deltas] == ["Let me", " check.", None, None]      # spaces wait for what follows
    calls = [(c.index, c.function.name, json.loads(c.function.arguments)) for d in deltas for c in d.tool_calls or []]
    assert calls == [(0, *PARIS), (1, *NOW)] and deltas[3].tool_calls[0].id.startswith("call_")
    assert stream.finish_reason("stop") == "tool_calls"
    text = ToolCallStream(req)
    assert text.delta(0, "Fine, thanks.", "stop").content == "Fine, thanks." and text.finish_reason("stop") == "stop"


def test_a_special_token_trigger_is_named_by_id(ll_tokenizer):
    """Mistral's [TOOL_CALLS] is one special token in its tokenizer: the grammar takes that token
    (not the text spelled out), and free text before it still passes."""
    import copy

    import llguidance.hf
    from llguidance import LLMatcher

    hf = copy.deepcopy(ll_tokenizer[0].hf)
    hf.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    parser = get_tool_parser("mistral").bind_tokenizer(hf)
    assert parser.trigger_token == hf.convert_tokens_to_ids("[TOOL_CALLS]")
    assert get_tool_parser("mistral").bind_tokenizer(ll_tokenizer[0]).trigger_token is None     # text there
    ll = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))
    grammar = parser.grammar(TOOLS, parallel=True)
    call = hf.encode('[{"name": "get_time", "arguments": {}}]', add_special_tokens=False)
    for ids in ([parser.trigger_token] + call, hf.encode("Sure. ", add_special_tokens=False) + [parser.trigger_token] + call):
        m = LLMatcher(ll, grammar)
        assert all(m.consume_token(t) for t in ids) and m.is_accepting()
    m = LLMatcher(ll, grammar)                   # a call whose arguments break the schema, after the token
    bad = hf.encode('[{"name": "get_weather", "arguments": {"town": "Paris"}}]', add_special_tokens=False)
    assert not all(m.consume_token(t) for t in [parser.trigger_token] + bad)
