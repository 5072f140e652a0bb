"""Validation at the door: every bad input is refused when it is given, with a TypeError or
ValueError naming the field, and nothing is left queued; settings are honoured or refused,
never silently changed; LLM and LLMEngine.generate behave under concurrent use."""
import dataclasses
import threading

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sample.sampler import sample_seed
from minillm.sampling_params import MAX_SEED, MIN_TEMPERATURE

from conftest import get_model

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


@pytest.fixture
def engine(tiny_llama):
    model, tokenizer, _ = tiny_llama
    return LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64, scheduling_policy="priority")


def run(engine):
    final = {}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            return final
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    raise AssertionError("no progress")


# -- SamplingParams -----------------------------------------------------------------------
@pytest.mark.parametrize("field, value, error", [
    ("top_k", True, TypeError), ("n", True, TypeError), ("max_tokens", True, TypeError),
    ("seed", True, TypeError), ("ignore_eos", 1, TypeError), ("temperature", True, TypeError),
    ("seed", 2**64, ValueError), ("seed", -1, ValueError), ("seed", 1.0, TypeError),
    ("temperature", float("nan"), ValueError), ("temperature", float("inf"), ValueError),
    ("top_p", float("nan"), ValueError), ("stop", 5, TypeError), ("stop", [None], TypeError),
    ("stop_token_ids", "12", TypeError), ("stop_token_ids", [True], TypeError),
])
def test_sampling_params_refuse_bad_types_and_values(field, value, error):
    with pytest.raises(error, match=f"SamplingParams.{field} must be"):
        SamplingParams(**{field: value})


def test_sampling_params_are_checked_again_when_changed():
    params = SamplingParams(temperature=0.5, top_k=5)
    with pytest.raises(TypeError, match="top_k"):
        params.top_k = True
    with pytest.raises(ValueError, match="temperature"):
        params.temperature = -1
    assert (params.top_k, params.temperature) == (5, 0.5)          # a refused value never lands
    params.stop = "END"
    assert params.stop == ["END"]                                  # normalised like at construction
    config = EngineConfig()
    with pytest.raises(TypeError, match="block_size"):
        config.block_size = True
    assert config.block_size == 16


def test_tiny_temperatures_are_raised_to_the_documented_minimum(engine):
    params = SamplingParams(temperature=1e-40, seed=0, max_tokens=4, ignore_eos=True)
    assert params.temperature == MIN_TEMPERATURE
    engine.add_request("cold", [1000, 1001, 1002], params)
    out = run(engine)["cold"]
    assert out.error is None and len(out.outputs[0].token_ids) == 4


def test_n_samples_seeds_never_overflow_nor_follow_the_seed(engine):
    assert sample_seed(MAX_SEED, 1) <= MAX_SEED and sample_seed(5, 1) != 6 and sample_seed(5, 0) == 5
    engine.add_request("max-seed", [1000, 1001], SamplingParams(n=3, seed=MAX_SEED, max_tokens=4,
                                                                   ignore_eos=True))
    out = run(engine)["max-seed"]
    assert out.error is None and [len(o.token_ids) for o in out.outputs] == [4, 4, 4]


# -- prompts, params and priorities at add_request -------------------------------------------
@pytest.mark.parametrize("prompt, error, words", [
    ([1.5], TypeError, "integers"), ([True, 5], TypeError, "integers"), (["1", "2"], TypeError, "integers"),
    (None, TypeError, "string or a list"), (42, TypeError, "string or a list"), ([], ValueError, "empty"),
    ("", ValueError, "empty"), ("\ud800 lone surrogate", ValueError, "not valid Unicode"),
    ([10**9], ValueError, "outside the vocabulary"), ([-1], ValueError, "outside the vocabulary"),
])
def test_bad_prompts_are_refused_and_nothing_is_queued(engine, prompt, error, words):
    with pytest.raises(error, match=words):
        engine.add_request("bad", prompt, GREEDY)
    assert not engine.has_unfinished_requests() and engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(params={"temperature": 0}), TypeError, "SamplingParams\\(\\*\\*d\\)"),
    (dict(priority=None), TypeError, "priority"), (dict(priority="high"), TypeError, "priority"),
    (dict(priority=1.5), TypeError, "priority"), (dict(request_id=7), TypeError, "request_id"),
    (dict(params=SamplingParams(n=65)), ValueError, "max_num_seqs"),
])
def test_bad_params_priorities_and_ids_are_refused(engine, kwargs, error, words):
    call = dict(request_id="x", prompt=[1000, 1001], params=GREEDY, priority=0) | kwargs
    with pytest.raises(error, match=words):
        engine.add_request(**call)
    # nothing stuck: the engine keeps serving, with priorities compared as ints
    engine.add_request("ok", [1000, 1001], GREEDY, priority=-3)
    engine.add_request("ok2", [1000, 1002], GREEDY, priority=2)
    assert set(run(engine)) == {"ok", "ok2"}


def test_llm_front_refuses_bad_prompts_messages_and_params(tiny_llama):
    model, tokenizer, _ = tiny_llama
    llm = LLM(model, tokenizer=tokenizer, num_kv_blocks=64, block_size=4)
    for prompts in (None, 42, [None], [{"prompt_token_ids": "123"}], [{"prompt_token_ids": [1.5]}]):
        with pytest.raises(TypeError):
            llm.generate(prompts, GREEDY, use_tqdm=False)
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate("Hi", {"temperature": 0}, use_tqdm=False)
    for messages, words in (([{}], "role"), ([{"role": "user"}], "content"), ([{"role": "user", "content": 5}],
                            "content"), ([], "messages"), (None, "messages"), (["hi"], "messages")):
        with pytest.raises((TypeError, ValueError), match=words):
            llm.chat(messages, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="not valid Unicode"):
        llm.chat([{"role": "user", "content": "\udcff"}], GREEDY, use_tqdm=False)
    assert llm.llm_engine.stats()["kv_blocks_used"] == 0
    out = llm.chat([{"role": "user", "content": "Hi"}], GREEDY, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 6


# -- settings: honoured, or refused with the fix -------------------------------------------------
def test_config_and_options_together_are_refused(tiny_llama):
    model, tokenizer, _ = tiny_llama
    with pytest.raises(TypeError, match="not both"):
        LLMEngine(model, tokenizer, EngineConfig(), num_kv_blocks=4)
    engine = LLMEngine(model, tokenizer, dataclasses.replace(EngineConfig(), num_kv_blocks=4, block_size=4))
    assert engine.stats()["kv_blocks_total"] == 4


@pytest.mark.parametrize("bad", [dict(block_size=True), dict(max_num_seqs=2.0), dict(num_kv_blocks="8"),
                                 dict(enable_prefix_caching="yes"), dict(attention_backend="flash"),
                                 dict(device=0), dict(device="cuda:x"), dict(dtype=torch.float16)])
def test_engine_config_types_are_strict(bad):
    with pytest.raises((TypeError, ValueError), match=f"EngineConfig.{next(iter(bad))}"):
        EngineConfig(**bad)


def test_device_and_dtype_are_honoured_by_the_engine():
    model, tokenizer = load_model("tiny-llama", device="cpu")          # our own copy: it is converted
    engine = LLMEngine(model, tokenizer, dtype="bfloat16", num_kv_blocks=16, block_size=4, device="cpu")
    assert engine.model.dtype == torch.bfloat16 and engine.kv_cache.k[0].dtype == torch.bfloat16
    assert engine.stats()["attention_backend"] == "cpu-kernel"         # the C kernel reads bfloat16 caches too
    engine.add_request("a", [1000, 1001, 1002], GREEDY)
    assert len(run(engine)["a"].outputs[0].token_ids) == 6


def test_max_model_len_is_refused_not_lowered(tiny_llama):
    model, tokenizer, _ = tiny_llama
    with pytest.raises(ValueError, match="raise num_kv_blocks to at least 128"):
        LLMEngine(model, tokenizer, num_kv_blocks=2, block_size=16, max_model_len=2048)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine(model, tokenizer, max_model_len=10**7)
    engine = LLMEngine(model, tokenizer, num_kv_blocks=8, block_size=4, max_model_len=12)
    with pytest.raises(ValueError, match="lower max_tokens to at most 4"):
        engine.add_request("a", list(range(1000, 1008)), SamplingParams(max_tokens=8))
    engine.add_request("b", list(range(1000, 1008)), SamplingParams(max_tokens=4, ignore_eos=True))
    out = run(engine)["b"].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_forks_count_against_max_num_seqs(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, num_kv_blocks=256, block_size=4, max_num_seqs=4)
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8, ignore_eos=True)
    for i in range(5):
        engine.add_request(f"r{i}", [1000 + i, 1001, 1002], params)
    most, final = 0, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            final[out.request_id] = out
        most = max(most, len(engine.scheduler.running))
    assert most <= 4 and most == 3                    # one request's 3 samples at a time: 3 + 3 > 4
    assert all(len(o.token_ids) == 8 for out in final.values() for o in out.outputs)


# -- threads ---------------------------------------------------------------------------------
def test_llm_generate_from_two_threads(tiny_llama):
    model, tokenizer, _ = tiny_llama
    llm = LLM(model, tokenizer=tokenizer, num_kv_blocks=128, block_size=4)
    prompts = [{"prompt_token_ids": [1000 + i, 1001, 1002]} for i in range(6)]
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    results, errors = {}, []

    def worker(k):
        try:
            results[k] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        except Exception as e:       # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == {0: want, 1: want, 2: want}


def test_engine_generate_returns_its_own_requests_and_leaves_others_to_step(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, num_kv_blocks=128, block_size=4)
    engine.add_request("mine-earlier", [1000, 1001, 1002], SamplingParams(temperature=0, max_tokens=3))
    outs = engine.generate([[1000, 1005]], GREEDY)
    assert len(outs) == 1 and outs[0].request_id.startswith("gen-")
    assert engine.has_unfinished_requests()                           # the earlier request's output waits
    delivered = {o.request_id: o for o in engine.step()}
    assert delivered["mine-earlier"].finished and len(delivered["mine-earlier"].outputs[0].token_ids) == 3
    assert not engine.has_unfinished_requests()


def test_stop_strings_and_stop_token_ids_are_bounded():
    """Searched at every token of every sequence: past the limits is refused at the door."""
    from minillm.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
    SamplingParams(stop=["s"] * MAX_STOP_STRINGS, stop_token_ids=list(range(MAX_STOP_TOKEN_IDS)))
    SamplingParams(stop="x" * MAX_STOP_STRING_CHARS)
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_STRINGS} strings"):
        SamplingParams(stop=["s"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_STRING_CHARS} characters"):
        SamplingParams(stop="x" * (MAX_STOP_STRING_CHARS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_TOKEN_IDS} token ids"):
        SamplingParams(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS + 1)))
