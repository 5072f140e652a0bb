"""Log-probabilities from the engine (SamplingParams(logprobs=k)), checked against the model's
own log-softmax at each position, computed independently by the no-cache loop of lesson 01."""
import math

import pytest
import torch

from minillm.engine.engine import LLMEngine
from minillm.baselines.naive_generation import next_token_logits_naive
from minillm.sampling_params import SamplingParams

from conftest import get_model


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_logprobs_match_the_models_log_softmax(tiny_llama, temperature):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    prompt = [1000, 1200, 1400, 1600, 1800]
    params = SamplingParams(temperature=temperature, seed=3, max_tokens=6, logprobs=3, ignore_eos=True)
    out = engine.generate([prompt], params)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 6
    for i, (token, step) in enumerate(zip(out.token_ids, out.logprobs)):
        want = torch.log_softmax(next_token_logits_naive(model, prompt + out.token_ids[:i]).float(), -1)
        top = torch.topk(want, 3)
        assert token in step and len(step) in (3, 4)
        ranked = sorted((lp.rank, t) for t, lp in step.items() if lp.rank <= 3)
        assert [t for _, t in ranked] == top.indices.tolist()          # the top 3, in order
        for t, lp in step.items():
            assert lp.logprob == pytest.approx(float(want[t]), abs=1e-4)   # before temperature
            assert lp.decoded_token == tokenizer.decode([t], skip_special_tokens=False)
        assert step[token].rank == int((want > want[token]).sum()) + 1
        if temperature == 0:
            assert step[token].rank == 1
    assert out.cumulative_logprob == pytest.approx(sum(s[t].logprob for s, t in zip(out.logprobs, out.token_ids)))
    assert math.exp(max(lp.logprob for lp in out.logprobs[0].values())) <= 1.0


def test_no_logprobs_unless_asked_and_zero_gives_the_sampled_token_only(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    plain, zero = engine.generate([[1000, 1001], [1000, 1001]], [
        SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0, max_tokens=3, logprobs=0)])
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None
    assert [list(step) for step in zero.outputs[0].logprobs] == [[t] for t in zero.outputs[0].token_ids]
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
