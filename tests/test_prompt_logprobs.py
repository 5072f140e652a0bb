"""Prompt logprobs (SamplingParams(prompt_logprobs=k), vLLM's shape), checked against
transformers' log-softmax over the whole prompt, through chunked prefill, a cached prefix,
a preemption and a batch of other requests whose tokens must not change."""
import pytest
import torch

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams

from conftest import get_model

PROMPT = [1000 + 37 * i for i in range(23)]       # 23 tokens: several blocks of 4, a partial last one


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


def reference(twin, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, V]: position p's log-softmax, which scores prompt token p + 1."""
    with torch.no_grad():
        logits = twin(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def assert_matches(prompt_logprobs, prompt, want, k):
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(prompt)
    for p, (entry, row) in enumerate(zip(prompt_logprobs[1:], want), start=1):
        token = prompt[p]
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        surely_above, maybe_above = int((row > row[token] + 1e-4).sum()), int((row > row[token] - 1e-4).sum())
        assert surely_above + 1 <= entry[token].rank <= maybe_above + 1     # a rounding tie may go either way
        top = [t for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank) if lp.rank <= k]
        assert top == torch.topk(row, k).indices.tolist()
        assert len(entry) in (k, k + 1)


def engine(tiny_llama, **options):
    model, tokenizer, _ = tiny_llama
    return LLMEngine(model, tokenizer, **{"block_size": 4, "num_kv_blocks": 64, **options})


@pytest.mark.parametrize("budget", [2048, 5])        # whole prompt in one step, or chunks of 5
def test_prompt_logprobs_match_transformers(tiny_llama, budget):
    _, tokenizer, twin = tiny_llama
    e = engine(tiny_llama, max_num_batched_tokens=budget, max_num_seqs=4)
    out = e.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))[0]
    assert_matches(out.prompt_logprobs, PROMPT, reference(twin, PROMPT), 3)
    entry = out.prompt_logprobs[5]
    assert all(lp.decoded_token == tokenizer.decode([t], skip_special_tokens=False) for t, lp in entry.items())
    plain = e.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0))[0]
    assert plain.prompt_logprobs is None and plain.outputs[0].token_ids == out.outputs[0].token_ids


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(tiny_llama):
    _, _, twin = tiny_llama
    e = engine(tiny_llama)
    first = e.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0))[0]
    assert first.num_cached_tokens == 0
    again = e.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0))[0]
    assert again.num_cached_tokens == 20                 # five full blocks reused by a plain request
    scored = e.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    assert scored.num_cached_tokens == 0                 # ... but recomputed when the prompt is scored
    assert_matches(scored.prompt_logprobs, PROMPT, reference(twin, PROMPT), 0)
    assert scored.outputs[0].token_ids == first.outputs[0].token_ids


def test_scoring_one_request_leaves_the_others_tokens_alone(tiny_llama):
    _, _, twin = tiny_llama
    prompts = [PROMPT, PROMPT[:7], [5, 6, 7, 8, 9, 10, 11, 12, 13]]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    alone = [engine(tiny_llama).generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    mixed = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, prompt_logprobs=p) for p in (2, None, 1)]
    outs = engine(tiny_llama, max_num_batched_tokens=8).generate(prompts, mixed)
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert outs[1].prompt_logprobs is None
    assert_matches(outs[0].prompt_logprobs, prompts[0], reference(twin, prompts[0]), 2)
    assert_matches(outs[2].prompt_logprobs, prompts[2], reference(twin, prompts[2]), 1)


def test_prompt_logprobs_survive_a_preemption_and_come_once_for_n_samples(tiny_llama):
    _, _, twin = tiny_llama
    e = engine(tiny_llama, num_kv_blocks=14, max_num_batched_tokens=6, preemption_mode="recompute")
    params = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=1, ignore_eos=True, prompt_logprobs=1)
    outs = e.generate([PROMPT, PROMPT[3:]], params)
    assert e.stats()["num_preemptions"] > 0
    for prompt, out in zip([PROMPT, PROMPT[3:]], outs):
        assert len(out.outputs) == 2
        assert_matches(out.prompt_logprobs, prompt, reference(twin, prompt), 1)


def test_a_one_token_prompt_has_nothing_to_score(tiny_llama):
    out = engine(tiny_llama).generate([[42]], SamplingParams(max_tokens=2, prompt_logprobs=5))[0]
    assert out.prompt_logprobs == [None]


@pytest.mark.parametrize("bad", [-1, 21, 1.5, "3"])
def test_prompt_logprobs_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
