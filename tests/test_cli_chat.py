"""`python -m minillm chat` and `generate` stream on the engine: what they print is the
engine's text for the same conversation, turn after turn."""
import argparse
import io

from minillm import LLM, SamplingParams
from minillm.cli.chat import cmd_chat, stream_engine

from conftest import get_model


def args(**kw):
    base = dict(model="tiny-llama", max_tokens=6, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=None,
                device="cpu", system=None, url=None, api_key=None)
    return argparse.Namespace(**(base | kw))


def test_chat_keeps_the_conversation_and_prints_the_engine_text():
    model, tokenizer, _ = get_model("tiny-llama")
    llm = LLM(model, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    out = io.StringIO()
    cmd_chat(args(system="Be brief."), stdin=io.StringIO("Hi there\nAnd then?\n\n"), out=out)
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    first = llm.chat(conversation, params, use_tqdm=False)[0].outputs[0].text
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
    second = llm.chat(conversation, params, use_tqdm=False)[0].outputs[0].text
    printed = out.getvalue()
    assert f"> {first}\n" in printed and f"> {second}\n" in printed, printed


def test_stream_engine_writes_exactly_the_final_text():
    model, tokenizer, _ = get_model("tiny-llama")
    llm = LLM(model, tokenizer=tokenizer)
    out = io.StringIO()
    final = stream_engine(llm.llm_engine, "x", "Once upon a time", SamplingParams(max_tokens=12, temperature=0), out)
    assert out.getvalue() == final.outputs[0].text and len(final.outputs[0].token_ids) == 12
