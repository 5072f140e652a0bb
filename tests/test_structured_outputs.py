"""Structured outputs in the engine: every output of hypothesis-generated JSON schemas parses
and validates (jsonschema), greedy and sampled, on the tiny random Llama (a model that would
never follow a schema by itself); regex, choice and Lark grammars; unconstrained requests
batched beside constrained ones keep exactly their tokens; n > 1 and preemption; bad specs
refused at the door."""
import json
import re

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.structured import StructuredOutputsParams

from conftest import get_model

PROMPTS = ["The capital of France is", "Here is the record as JSON:", "List three colors:", "Answer:"]


@pytest.fixture(scope="module")
def tiny():
    return get_model("tiny-llama")


@pytest.fixture(scope="module")
def engine(tiny):
    return LLMEngine(tiny[0], tiny[1], num_kv_blocks=512, max_model_len=512, max_num_seqs=64)


# -- JSON schemas, small enough that any answer fits max_tokens --------------------------------
names = st.text("abcdefghij_", min_size=1, max_size=6)
leaves = st.one_of(
    st.just({"type": "boolean"}),
    st.tuples(st.integers(-1000, 1000), st.integers(0, 1000)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.integers(0, 8).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.text("xyz ", min_size=1, max_size=5), min_size=1, max_size=4, unique=True).map(
        lambda values: {"enum": values}),
    st.just({"type": "null"}),
)


def objects(children):
    return st.dictionaries(names, children, min_size=1, max_size=4).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props))).map(lambda required: {
            "type": "object", "properties": props, "required": sorted(required), "additionalProperties": False}))


schemas = st.recursive(leaves, lambda children: st.one_of(
    objects(children), children.map(lambda items: {"type": "array", "items": items, "maxItems": 3})), max_leaves=8)


@given(st.lists(schemas, min_size=55, max_size=55))
@settings(max_examples=2, deadline=None)
def test_every_output_of_generated_schemas_validates(engine, batch):
    params = [SamplingParams(max_tokens=400, temperature=0 if i % 2 else 1.0, seed=i,
                             structured_outputs=StructuredOutputsParams(json=schema)) for i, schema in enumerate(batch)]
    outs = engine.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(batch))], params)
    for schema, out in zip(batch, outs):
        o = out.outputs[0]
        assert o.finish_reason == "stop", (schema, o.text)
        jsonschema.validate(json.loads(o.text), schema)


def test_unconstrained_neighbours_keep_their_exact_tokens(engine):
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=7, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in engine.generate(PROMPTS[:2], [greedy, sampled])]
    constrained = SamplingParams(max_tokens=30, temperature=0.9, seed=3, structured_outputs={"json_object": True})
    mixed = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                            [greedy, constrained, sampled, SamplingParams(max_tokens=5, structured_outputs={
                                "regex": "[0-9]{3}"})])
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    assert re.fullmatch(r"[0-9]{3}", mixed[3].outputs[0].text)


def test_regex_choice_and_lark_grammar(engine):
    specs = [{"regex": r"(yes|no), [a-z]{2,5}\."}, {"choice": ["red", "green", "light blue"]},
             {"grammar": 'start: "(" item ("," item)* ")"\nitem: /[0-9]/'}]
    for temperature in (0, 1.0):
        outs = engine.generate(PROMPTS[:3], [SamplingParams(max_tokens=40, temperature=temperature, seed=1,
                                                            structured_outputs=s) for s in specs])
        texts = [o.outputs[0].text for o in outs]
        assert re.fullmatch(r"(yes|no), [a-z]{2,5}\.", texts[0])
        assert texts[1] in ("red", "green", "light blue")
        assert re.fullmatch(r"\([0-9](,[0-9])*\)", texts[2]), texts[2]
        assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_n_samples_and_preemption_keep_the_grammar(tiny):
    engine = LLMEngine(tiny[0], tiny[1], num_kv_blocks=12, block_size=4, max_num_batched_tokens=8)
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "b": {"enum": ["x", "yy"]}}, "required": ["a", "b"], "additionalProperties": False}
    params = SamplingParams(n=3, max_tokens=30, temperature=1.0, seed=5, structured_outputs={"json": schema})
    outs = engine.generate(PROMPTS[:2], params)
    assert engine.stats()["num_preemptions"] > 0
    for out in outs:
        assert len(out.outputs) == 3
        for o in out.outputs:
            jsonschema.validate(json.loads(o.text), schema)


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(engine):
    out = engine.generate(["x"], SamplingParams(max_tokens=4, structured_outputs={"regex": "a{40}"}))[0].outputs[0]
    assert out.finish_reason == "length" and re.fullmatch("a+", out.text)


@pytest.mark.parametrize("spec, words", [
    ({"json": {"type": "foo"}}, "Invalid type"),
    ({"regex": "(("}, "unclosed group"),
    ({"grammar": "start: x"}, "unknown name"),
    ({"json": "{not json"}, "not JSON"),
    ({"regex": "a", "choice": ["b"]}, "exactly one"),
    ({"choice": []}, "choice"),
    ({"jsn": {}}, "unknown field"),
])
def test_bad_specs_are_refused_at_the_door(engine, spec, words):
    with pytest.raises((ValueError, TypeError), match=words) as e:
        engine.add_request("bad", "x", SamplingParams(structured_outputs=spec))
    assert getattr(e.value, "param", None) in ("structured_outputs", "json", "choice")
    assert "bad" not in engine.requests
