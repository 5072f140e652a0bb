"""Lessons 03-05 end to end: the paged engine against transformers' greedy generate.

Block sizes 1, 3, 16; prefix caching off and on (hits, a fully cached prompt); n > 1
with copy-on-write (seeded samples independent of the batch); memory pressure with
preemption; refusals and aborts. Every greedy comparison goes through the tie-aware
`compare_greedy` of the correctness contract: a difference that is not a float
rounding tie fails.
"""
import pytest

from minillm.engine.engine import LLMEngine
from minillm.kv.block_manager import cdiv
from minillm.models.reference import compare_greedy, reference_greedy
from minillm.baselines.naive_generation import generate_naive
from minillm.sample.sampler import sample_seed
from minillm.sampling_params import SamplingParams

from conftest import PROMPTS, get_model

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
LONG_TEXT = ("In the early morning light, the fishermen of the northern coast pushed their small wooden "
             "boats into the cold grey water, calling to one another across the harbour as gulls circled "
             "overhead and the smell of salt and tar drifted through the narrow streets of the old town.")

_REFERENCES = {}


def reference(hf, ids, max_tokens=MAX_TOKENS):
    """transformers' greedy tokens, computed once per (model, prompt) for the whole session."""
    key = (id(hf), tuple(ids), max_tokens)
    if key not in _REFERENCES:
        _REFERENCES[key] = reference_greedy(hf, list(ids), max_tokens)
    return _REFERENCES[key]


def assert_greedy_correct(hf, ids, ours, max_tokens=MAX_TOKENS):
    """Identical to transformers, or differing first at a rounding tie; anything else fails
    (compare_greedy raises, and its verdict is checked too)."""
    verdict = compare_greedy(hf, list(ids), list(ours), reference(hf, ids, max_tokens))
    assert verdict == "identical" or verdict.startswith("tie at step "), verdict
    return verdict


def tokens_of(out, index=0):
    [c] = [c for c in out.outputs if c.index == index]
    return c.token_ids


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def engine(model, tokenizer, block_size, num_kv_blocks=None, **options):
    return LLMEngine(model, tokenizer, block_size=block_size,
                     num_kv_blocks=num_kv_blocks or cdiv(1024, block_size), **options)


def run(eng, requests):
    """requests: [(id, prompt ids, params)] added now; steps until the engine is idle.
    Returns {id: final RequestOutput}."""
    for rid, ids, params in requests:
        eng.add_request(rid, ids, params)
    return drain(eng)


def drain(eng, final=None):
    final = {} if final is None else final
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
    return final


# -- greedy against transformers -------------------------------------------------------------

@pytest.mark.parametrize("backend", ["torch", "cpu-kernel"])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefixcache"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_greedy_batch_matches_transformers(tiny, block_size, prefix_caching, backend):
    model, tokenizer, hf = tiny
    prompts = [tokenizer.encode(p) for p in PROMPTS]          # 4 different lengths, one batch
    assert len({len(p) for p in prompts}) == 4
    eng = engine(model, tokenizer, block_size, enable_prefix_caching=prefix_caching,
                 attention_backend=backend)
    assert eng.stats()["attention_backend"] == backend
    outs = eng.generate(prompts, GREEDY)
    for ids, out in zip(prompts, outs):
        assert out.finished and out.prompt_token_ids == ids
        assert out.outputs[0].finish_reason == "length" and len(tokens_of(out)) == MAX_TOKENS
        assert out.num_cached_tokens == 0                    # a fresh engine has nothing cached
        assert_greedy_correct(hf, ids, tokens_of(out))
    again = run(eng, [("again", prompts[1], GREEDY)])["again"]   # the same prompt once more
    assert again.num_cached_tokens == (0 if not prefix_caching else
                                       (len(prompts[1]) - 1) // block_size * block_size)
    assert tokens_of(again) == tokens_of(outs[1])
    stats = eng.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_preemptions"] == 0
    assert stats["num_cow_copies"] == 0
    assert (stats["prefix_cache_hit_rate"] > 0) == prefix_caching


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_prefix_hits_and_a_fully_cached_prompt_stay_correct(tiny, block_size):
    model, tokenizer, hf = tiny
    bs = block_size
    eng = engine(model, tokenizer, bs, enable_prefix_caching=True)

    # round 1: an 18-token prompt, and a 48-token one (a multiple of 1, 3 and 16)
    first = tokenizer.encode(PROMPTS[1])
    full = tokenizer.encode(LONG_TEXT)[:48]
    assert len(full) == 48 and common_prefix(first, full) == 0
    outs = run(eng, [("first", first, GREEDY), ("full-0", full, GREEDY)])
    for rid, ids in (("first", first), ("full-0", full)):
        assert outs[rid].num_cached_tokens == 0
        assert_greedy_correct(hf, ids, tokens_of(outs[rid]))
    assert eng.stats()["kv_blocks_used"] == 0            # finished: blocks free (but still cached)

    # round 2, one batch: a prompt extending the first one (a prefix hit), and the 48-token
    # prompt twice (fully cached). A fully cached prompt must still compute something to
    # sample its first token, so the engine recomputes its last block: cached = 48 - bs,
    # the largest multiple of bs below the prompt length
    second = first + tokenizer.encode("    if n < 2:\n        return n\n")
    outs2 = run(eng, [("second", second, GREEDY), ("full-1", full, GREEDY), ("full-2", full, GREEDY)])
    computed = first + tokens_of(outs["first"])[:-1]     # tokens whose K/V the first request wrote
    shared = min(common_prefix(second, computed), len(second))
    expected = shared // bs * bs                         # whole blocks only
    if expected == len(second):
        expected -= bs
    assert expected >= 16
    assert outs2["second"].num_cached_tokens == expected
    assert_greedy_correct(hf, second, tokens_of(outs2["second"]))
    for rid in ("full-1", "full-2"):
        assert outs2[rid].num_cached_tokens == 48 - bs
        assert_greedy_correct(hf, full, tokens_of(outs2[rid]))    # the first token included
    stats = eng.stats()
    assert stats["prefix_cache_hit_rate"] > 0
    assert stats["kv_blocks_used"] == 0 and stats["num_cow_copies"] == 0


@pytest.mark.slow
def test_smollm2_shared_system_prompt_prefix_hit_is_identical(smol):
    model, tokenizer, hf = smol
    system = ("You are a careful geography tutor. Answer every question in one short sentence, "
              "name the country and the city, and never add anything else.")
    chats = [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                            {"role": "user", "content": q}])
             for q in ("What is the capital of France?", "What is the capital of Italy?")]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eng = engine(model, tokenizer, 16, num_kv_blocks=64, enable_prefix_caching=True)
    out_a = run(eng, [("a", chats[0], params)])["a"]
    out_b = run(eng, [("b", chats[1], params)])["b"]
    shared = common_prefix(chats[0], chats[1])
    assert shared >= 32
    assert out_a.num_cached_tokens == 0
    assert out_b.num_cached_tokens == shared // 16 * 16 > 0
    # the request served from the cache (the plain path is the tiny models' business; a
    # transformers reference costs seconds per prompt on this model)
    assert compare_greedy(hf, chats[1], tokens_of(out_b), reference(hf, chats[1], 24)) == "identical"
    assert eng.stats()["kv_blocks_used"] == 0


# -- n > 1: fork, copy-on-write, seeds ----------------------------------------------------------

def sampled(n=4, seed=1234, temperature=3.0, max_tokens=6):
    return SamplingParams(n=n, temperature=temperature, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def samples_of(out):
    assert sorted(c.index for c in out.outputs) == list(range(len(out.outputs)))
    return [tokens_of(out, i) for i in range(len(out.outputs))]


def test_n4_seeded_samples_do_not_depend_on_the_batch_or_the_pool(tiny):
    model, tokenizer, _ = tiny
    bs = 4
    ids = tokenizer.encode(PROMPTS[2])                 # 15 tokens: the last block is partly filled
    assert len(ids) % bs
    params = sampled()

    alone = engine(model, tokenizer, bs, num_kv_blocks=64)
    out = run(alone, [("x", ids, params)])["x"]
    want = samples_of(out)
    assert len(want) == 4 and all(len(s) == params.max_tokens for s in want)
    assert len({tuple(s) for s in want}) > 1, "four samples at a high temperature are all equal"
    stats = alone.stats()
    # the children share the prompt's blocks; the partly filled one is copied before each
    # write (the last holder may write in place): 1..3 copies, and no block leaks
    assert 1 <= stats["num_cow_copies"] <= 3
    assert stats["kv_blocks_used"] == 0

    # batched with other work, joining mid-flight, prefix caching on (its first two blocks
    # are another request's): the same four samples
    busy = engine(model, tokenizer, bs, num_kv_blocks=64, enable_prefix_caching=True)
    busy.add_request("greedy", tokenizer.encode(PROMPTS[0]), GREEDY)
    busy.add_request("other", ids[:9] + [5, 6, 7], sampled(n=2, seed=99))
    busy.step()
    busy.step()
    got = run(busy, [("x", ids, params)])
    assert got["x"].num_cached_tokens == 8
    assert samples_of(got["x"]) == want
    assert busy.stats()["kv_blocks_used"] == 0

    # another composition: first in a fresh batch, with a long prompt and no prefix caching
    other = engine(model, tokenizer, bs, num_kv_blocks=64, enable_prefix_caching=False)
    got = run(other, [("x", ids, params), ("long", tokenizer.encode(LONG_TEXT), GREEDY),
                      ("n2", tokenizer.encode(PROMPTS[3]), sampled(n=2, seed=5))])
    assert samples_of(got["x"]) == want
    assert other.stats()["kv_blocks_used"] == 0

    # a pool too small for all of it: sequences are preempted and recomputed, samples unchanged
    tight = engine(model, tokenizer, bs, num_kv_blocks=10, enable_prefix_caching=True)
    got = run(tight, [("x", ids, params), ("g", tokenizer.encode(PROMPTS[1]), GREEDY)])
    assert tight.stats()["num_preemptions"] > 0
    assert samples_of(got["x"]) == want
    assert tight.stats()["kv_blocks_used"] == 0

    # each sample is exactly what an isolated, cache-free generation with its own stream
    # (sample_seed(seed, index), as the engine seeds sample `index`) gives: no sibling's
    # write leaked into another's K/V
    for i, s in enumerate(want):
        single = SamplingParams(temperature=params.temperature, seed=sample_seed(params.seed, i),
                                max_tokens=params.max_tokens, ignore_eos=True)
        assert generate_naive(model, tokenizer, ids, single).token_ids == s, f"sample {i}"


def test_n4_greedy_all_equal_the_reference(tiny):
    model, tokenizer, hf = tiny
    greedy4 = SamplingParams(n=4, temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    # 5 tokens in blocks of 3: the partly filled block is shared, then copied on write
    ids = tokenizer.encode(PROMPTS[0])
    eng = engine(model, tokenizer, 3)
    out = run(eng, [("g", ids, greedy4), ("other", tokenizer.encode(PROMPTS[1]), GREEDY)])["g"]
    got = samples_of(out)
    assert len(got) == 4 and all(s == got[0] for s in got)
    assert_greedy_correct(hf, ids, got[0])
    assert 1 <= eng.stats()["num_cow_copies"] <= 3 and eng.stats()["kv_blocks_used"] == 0
    # 4 tokens in blocks of 4: only full blocks are shared, nothing to copy
    ids = tokenizer.encode(PROMPTS[3])
    assert len(ids) == 4
    eng = engine(model, tokenizer, 4)
    got = samples_of(run(eng, [("g", ids, greedy4)])["g"])
    assert all(s == got[0] for s in got)
    assert_greedy_correct(hf, ids, got[0])
    assert eng.stats()["num_cow_copies"] == 0 and eng.stats()["kv_blocks_used"] == 0


@pytest.mark.slow
def test_smollm2_n4_seeded_samples_independent_of_batch(smol):
    model, tokenizer, _ = smol
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a word that rhymes with cat."}])
    params = sampled(temperature=1.0, seed=2024, max_tokens=8)
    alone = engine(model, tokenizer, 16, num_kv_blocks=32)
    assert len(ids) % 16                  # the prompt's last block is partly filled and shared
    want = samples_of(run(alone, [("x", ids, params)])["x"])
    assert len({tuple(s) for s in want}) > 1
    assert 1 <= alone.stats()["num_cow_copies"] <= 3
    assert alone.stats()["kv_blocks_used"] == 0
    busy = engine(model, tokenizer, 16, num_kv_blocks=32)
    busy.add_request("other", tokenizer.encode(PROMPTS[2]), SamplingParams(temperature=0, max_tokens=8))
    busy.step()
    assert samples_of(run(busy, [("x", ids, params)])["x"]) == want
    assert busy.stats()["kv_blocks_used"] == 0


# -- memory pressure --------------------------------------------------------------------------

@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefixcache"])
def test_small_pool_preempts_and_still_matches_transformers(tiny, prefix_caching):
    model, tokenizer, hf = tiny
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    # the four sequences need 27 blocks of 4 at their longest; 12 force preemption
    eng = engine(model, tokenizer, 4, num_kv_blocks=12, enable_prefix_caching=prefix_caching)
    outs = eng.generate(prompts, GREEDY)
    stats = eng.stats()
    assert stats["num_preemptions"] > 0 and stats["num_recomputed_tokens"] > 0
    assert sum(o.metrics.num_preemptions for o in outs) == stats["num_preemptions"]
    for ids, out in zip(prompts, outs):
        assert len(tokens_of(out)) == MAX_TOKENS
        assert_greedy_correct(hf, ids, tokens_of(out))
    assert stats["kv_blocks_used"] == 0


def test_num_cached_tokens_never_exceeds_the_prompt_after_preemption():
    model, tokenizer, _ = get_model("tiny-llama")
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    eng = engine(model, tokenizer, 4, num_kv_blocks=12, enable_prefix_caching=True)
    # "b" (4 prompt tokens) arrives last, is preempted when "a" grows, and is recomputed:
    # its re-admission finds its own prompt + generated blocks in the prefix cache
    outs = run(eng, [("a", tokenizer.encode(PROMPTS[1]), params), ("b", tokenizer.encode(PROMPTS[3]), params)])
    assert outs["b"].metrics.num_preemptions == 1
    for out in outs.values():
        assert out.num_cached_tokens <= len(out.prompt_token_ids), (len(out.prompt_token_ids),
                                                                    out.num_cached_tokens)


# -- refusals and aborts --------------------------------------------------------------------

def test_prompt_that_can_never_fit_is_refused_at_add_request(tiny):
    model, tokenizer, hf = tiny
    eng = engine(model, tokenizer, 4, num_kv_blocks=64, max_model_len=32)
    for n in (40, 32):                   # 32: no room left for even one generated token
        with pytest.raises(ValueError, match="max_model_len"):
            eng.add_request(f"too-long-{n}", list(range(100, 100 + n)), GREEDY)
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0
    ids = list(range(100, 131))          # 31 tokens: fits with one token to generate, no more
    with pytest.raises(ValueError, match="lower max_tokens to at most 1"):
        eng.add_request("too-many", ids, GREEDY)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    out = run(eng, [("too-long-32", ids, one)])["too-long-32"]    # the refused id is free
    assert len(tokens_of(out)) == 1 and out.outputs[0].finish_reason == "length"
    assert_greedy_correct(hf, ids, tokens_of(out), 1)
    # a pool smaller than the model's context caps the length too: one sequence must fit alone
    small = engine(model, tokenizer, 4, num_kv_blocks=4)
    with pytest.raises(ValueError, match="max_model_len"):
        small.add_request("big", list(range(100, 116)), GREEDY)
    assert run(small, [("fits", list(range(100, 115)), one)])["fits"].outputs[0].finish_reason == "length"
    assert small.stats()["kv_blocks_used"] == 0


def test_abort_frees_blocks_and_the_engine_keeps_serving(tiny):
    model, tokenizer, hf = tiny
    eng = engine(model, tokenizer, 4, num_kv_blocks=64)
    keep = tokenizer.encode(PROMPTS[0])
    eng.add_request("gone", tokenizer.encode(PROMPTS[1]), sampled(max_tokens=20))
    eng.add_request("keep", keep, GREEDY)
    for _ in range(3):
        eng.step()
    held = lambda rid: sum(len(s.block_table) for s in eng.requests[rid].seqs)
    assert len(eng.requests["gone"].seqs) == 4                  # forked
    assert eng.stats()["kv_blocks_used"] > held("keep")
    eng.abort_request("gone")
    eng.abort_request("no-such-request")                         # unknown id: nothing happens
    assert "gone" not in eng.requests
    assert eng.stats()["kv_blocks_used"] == held("keep")
    final = drain(eng)
    assert set(final) == {"keep"}
    assert_greedy_correct(hf, keep, tokens_of(final["keep"]))
    assert eng.stats()["kv_blocks_used"] == 0
    # the id can be used again, and aborting a request still waiting for a slot works too
    one = engine(model, tokenizer, 4, num_kv_blocks=64, max_num_seqs=1)
    one.add_request("gone", keep, GREEDY)
    one.add_request("waiting", tokenizer.encode(PROMPTS[2]), GREEDY)
    one.step()
    one.abort_request("waiting")
    one.step()
    one.abort_request("gone")
    assert not one.has_unfinished_requests() and one.stats()["kv_blocks_used"] == 0
    out = run(one, [("gone", keep, GREEDY)])["gone"]
    assert_greedy_correct(hf, keep, tokens_of(out))
    assert one.stats()["kv_blocks_used"] == 0
    # a request preempted for recompute (back in the queue, no blocks) can be aborted too
    tight = engine(model, tokenizer, 4, num_kv_blocks=10)
    big = tokenizer.encode(PROMPTS[1])
    tight.add_request("big", big, GREEDY)
    tight.add_request("small", tokenizer.encode(PROMPTS[3]), GREEDY)
    for _ in range(MAX_TOKENS):
        tight.step()
        if tight.stats()["num_preemptions"]:
            break
    assert tight.stats()["num_preemptions"] == 1 and not tight.requests["small"].seqs[0].block_table
    tight.abort_request("small")
    assert tight.stats()["kv_blocks_used"] == len(tight.requests["big"].seqs[0].block_table)
    final = drain(tight)
    assert set(final) == {"big"}
    assert_greedy_correct(hf, big, tokens_of(final["big"]))
    assert tight.stats()["kv_blocks_used"] == 0


def test_empty_text_prompt_is_refused_clearly():
    model, tokenizer, _ = get_model("tiny-llama")
    eng = engine(model, tokenizer, 4, num_kv_blocks=16)
    with pytest.raises(ValueError, match=r"(?i)prompt.*empty|empty.*prompt"):
        eng.add_request("empty", "", GREEDY)
    assert not eng.has_unfinished_requests()
