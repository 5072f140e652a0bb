"""Naive, contiguous-cache and static-batch generation against transformers' greedy generate."""
import pytest

from minillm.kv.contiguous import ContiguousKVCache
from minillm.baselines.static_batching import generate_static_batch, generate_with_cache
from minillm.baselines.naive_generation import generate_naive
from minillm.models.reference import compare_greedy, reference_greedy
from minillm.sampling_params import SamplingParams

from conftest import PROMPTS

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_naive_greedy_matches_transformers(tiny):
    model, tokenizer, hf = tiny
    ids = tokenizer.encode(PROMPTS[0])
    ours = generate_naive(model, tokenizer, ids, GREEDY)
    assert ours.finish_reason == "length" and len(ours.token_ids) == GREEDY.max_tokens
    compare_greedy(hf, ids, ours.token_ids, reference_greedy(hf, ids, GREEDY.max_tokens))


def test_contiguous_greedy_matches_transformers(tiny):
    model, tokenizer, hf = tiny
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ours = generate_with_cache(model, tokenizer, ids, GREEDY).token_ids
        compare_greedy(hf, ids, ours, reference_greedy(hf, ids, GREEDY.max_tokens))


def test_static_batch_matches_transformers_per_prompt(tiny):
    model, tokenizer, hf = tiny
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]          # four different lengths
    outs, cache = generate_static_batch(model, tokenizer, prompt_ids, GREEDY)
    for ids, out in zip(prompt_ids, outs):
        compare_greedy(hf, ids, out.token_ids, reference_greedy(hf, ids, GREEDY.max_tokens))
    assert len(cache.k) == model.config.num_hidden_layers


@pytest.mark.slow
def test_smollm2_all_paths_match_transformers(smol):
    model, tokenizer, hf = smol
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Name a primary color.")]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    refs = [reference_greedy(hf, ids, 32) for ids in prompts]
    naive = generate_naive(model, tokenizer, prompts[0], params).token_ids
    assert compare_greedy(hf, prompts[0], naive, refs[0]) == "identical"
    batch, _ = generate_static_batch(model, tokenizer, prompts, params)
    for ids, out, ref in zip(prompts, batch, refs):
        assert compare_greedy(hf, ids, out.token_ids, ref) == "identical"


@pytest.mark.slow
def test_smollm2_chat_answers_paris_and_stops_at_eos(smol):
    model, tokenizer, _ = smol
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    out = generate_with_cache(model, tokenizer, ids, SamplingParams(temperature=0, max_tokens=40))
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] in tokenizer.eos_token_ids
    assert "<|im_end|>" not in out.text


def test_seeded_sampling_same_on_naive_and_cached_paths(tiny):
    model, tokenizer, _ = tiny
    ids = tokenizer.encode(PROMPTS[2])
    params = SamplingParams(temperature=5.0, top_p=0.95, seed=7, max_tokens=12, ignore_eos=True)
    a = generate_naive(model, tokenizer, ids, params).token_ids
    b = generate_with_cache(model, tokenizer, ids, params).token_ids
    # batched with other prompts, the seeded request still samples the same tokens
    outs, _ = generate_static_batch(model, tokenizer, [tokenizer.encode(PROMPTS[0]), ids], params)
    assert a == b == outs[1].token_ids
    other = generate_with_cache(model, tokenizer, ids, SamplingParams(
        temperature=5.0, top_p=0.95, seed=8, max_tokens=12, ignore_eos=True)).token_ids
    assert other != a


def test_stop_string_cuts_text_and_stop_token_ends(tiny):
    model, tokenizer, _ = tiny
    ids = tokenizer.encode(PROMPTS[0])
    free = generate_with_cache(model, tokenizer, ids, GREEDY)
    # pick a stop string from the middle of the greedy text: generation must end there
    text = free.text
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    assert stop.strip(), "greedy text too short to cut"
    out = generate_with_cache(model, tokenizer, ids, SamplingParams(temperature=0, max_tokens=24,
                                                                    ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop"
    assert out.text == text[:text.find(stop)]
    assert free.token_ids[:len(out.token_ids)] == out.token_ids
    third = free.token_ids[2]
    out = generate_with_cache(model, tokenizer, ids, SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[third]))
    first = free.token_ids.index(third)
    assert out.token_ids == free.token_ids[:first + 1] and out.finish_reason == "stop"


def test_contiguous_cache_accounts_waste():
    cache = ContiguousKVCache(num_layers=2, max_batch_size=3, max_len=100, num_kv_heads=2, head_dim=8)
    assert cache.bytes_per_token() == 2 * 2 * 2 * 8 * 4
    w = cache.waste([10, 50, 100])
    assert w["reserved_bytes"] == 3 * 100 * cache.bytes_per_token()
    assert w["used_bytes"] == 160 * cache.bytes_per_token()
    assert w["wasted_fraction"] == pytest.approx(1 - 160 / 300)


def test_cache_refuses_to_overflow(tiny):
    model, tokenizer, _ = tiny
    with pytest.raises(ValueError, match="max_len"):
        generate_static_batch(model, tokenizer, [tokenizer.encode(PROMPTS[0])], GREEDY, max_len=5)


def test_n_greater_than_one_not_yet_supported(tiny):
    model, tokenizer, _ = tiny
    with pytest.raises(NotImplementedError):
        generate_naive(model, tokenizer, "hi", SamplingParams(n=2))
