"""The draft-model proposer (spec/draft_model.py): a second checkpoint with the same tokenizer
drafts, in its own paged pool on the target's block tables. Greedy output is token-identical to
no speculation whether the draft is good (the target itself: every draft accepted, the bonus
token each step) or poor (a tiny random model: most drafts rejected), through prefix hits, n > 1,
stop strings and preemption in both modes; the config is refused without a model. The tiny
models share the embedded model's tokenizer, so they draft for each other."""
import pytest

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams

from conftest import get_model

REPEAT = "one two three four five six seven eight nine ten. " * 4


def draft(model: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k}


@pytest.mark.parametrize("draft_name", ["tiny-llama", "tiny-qwen2"])
def test_greedy_is_token_identical_with_a_draft_model(draft_name):
    model, tokenizer, _ = get_model("tiny-llama")
    options = dict(num_kv_blocks=128, block_size=8)
    base = LLMEngine(model, tokenizer, **options)
    spec = LLMEngine(model, tokenizer, speculative_config=draft(draft_name), **options)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat: " + REPEAT[:80]}], True)
    prompts = [chat, REPEAT[:60], "The capital of France is", REPEAT[:30]]
    params = [SamplingParams(max_tokens=30, temperature=0), SamplingParams(max_tokens=25, temperature=0, stop=["six"]),
              SamplingParams(max_tokens=17, temperature=0, n=2, ignore_eos=True),
              SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True)]     # partial accepts
    want = [[c.token_ids for c in o.outputs] for o in base.generate(prompts, params)]
    sampled = []
    for _ in range(2):                                    # the second time, the prefixes are cached
        got = [[c.token_ids for c in o.outputs] for o in spec.generate(prompts, params)]
        assert got[:3] == want[:3]
        sampled.append(got[3])
    assert sampled[0] == sampled[1] and len(sampled[0][0]) == 30      # seeded: reproducible
    stats = spec.stats()
    assert stats["spec_proposed_tokens"] > 0
    if draft_name == "tiny-llama":         # the target drafting for itself: all greedy drafts kept, sampled ones not all
        assert 0.2 < stats["spec_acceptance_rate"] < 1
    else:
        assert stats["spec_acceptance_rate"] < 0.5
    assert spec.block_manager.allocator.num_free == 128


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_draft_model_follows_preemption(mode):
    model, tokenizer, _ = get_model("tiny-llama")
    options = dict(num_kv_blocks=20, block_size=4, preemption_mode=mode, max_num_batched_tokens=64)
    base = LLMEngine(model, tokenizer, **options)
    spec = LLMEngine(model, tokenizer, speculative_config=draft("tiny-llama", 2), **options)
    prompts = [REPEAT[:60], REPEAT[10:70], REPEAT[20:90]]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
    stats = spec.stats()
    assert stats["num_preemptions"] > 0 and stats["spec_acceptance_rate"] > 0.95


def test_draft_model_needs_a_model_and_only_then():
    model, tokenizer, _ = get_model("tiny-llama")
    with pytest.raises(ValueError, match="speculative_config|model"):
        LLMEngine(model, tokenizer, speculative_config={"method": "draft_model"})
    with pytest.raises(ValueError, match="model"):
        LLMEngine(model, tokenizer, speculative_config={"method": "ngram", "model": "tiny-llama"})
