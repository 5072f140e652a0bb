"""Tests of the graders of lesson 01 (minillm.checks.lesson01_sampling
and lesson01_generation).

The reference passes each one, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_top_k`, `-k check_top_p`, `-k check_sampler`,
`-k check_generate_naive`.
"""
import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.attention import NoCache
from minillm.baselines.naive_generation import generate_naive, prompt_to_ids
from minillm.outputs import CompletionOutput
from minillm.sample.sampler import apply_top_k, apply_top_p, make_generator, sample
from minillm.text.stopping import StopChecker


# ---------------------------------------------------------------- lesson 01: top-k

def top_k_keeps_k_plus_one(logits, top_k):
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k + 1, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_drops_kth(logits, top_k):
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits <= kth, float("-inf"))


def top_k_one_cutoff_for_the_batch(logits, top_k):
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits.flatten(), top_k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_large_negative(logits, top_k):
    return apply_top_k(logits, top_k).clamp(min=-1e9)


def top_k_no_clamp(logits, top_k):
    if top_k <= 0:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_in_place(logits, top_k):
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))


def test_check_top_k_passes_reference():
    assert checks.check_top_k(apply_top_k)


def test_check_top_k_accepts_exactly_k_on_ties():
    def scatter_top_k(logits, top_k):        # keeps exactly k tokens, one of the tied ones
        if top_k <= 0 or top_k >= logits.shape[-1]:
            return logits
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(top_k).indices, True)
        return torch.where(keep, logits, torch.full_like(logits, float("-inf")))
    assert checks.check_top_k(scatter_top_k)


@pytest.mark.parametrize("bad, match", [
    (top_k_keeps_k_plus_one, "beyond the top_k"),
    (top_k_drops_kth, "dropped token"),
    (top_k_one_cutoff_for_the_batch, "row"),
    (top_k_large_negative, "-inf"),
    (top_k_no_clamp, "more than the 5 tokens"),
    (top_k_in_place, "in place"),
], ids=["keeps_k_plus_one", "drops_kth", "one_cutoff_for_the_batch", "large_negative", "no_clamp", "in_place"])
def test_check_top_k_rejects(bad, match):
    rejects(checks.check_top_k, bad, match)


# ---------------------------------------------------------------- lesson 01: top-p

def _top_p_sorted(logits, top_p, drop_rule):
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = drop_rule(probs, top_p)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def top_p_excludes_crossing_token(logits, top_p):
    def rule(probs, top_p):
        drop = probs.cumsum(-1) > top_p               # the token that crosses top_p goes too
        drop[..., 0] = False
        return drop
    return _top_p_sorted(logits, top_p, rule)


def top_p_drops_best_token(logits, top_p):
    return _top_p_sorted(logits, top_p, lambda probs, p: probs.cumsum(-1) > p)   # no guard for the best


def top_p_unsorted(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs = logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p              # cumulative sum in vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def top_p_returns_probabilities(logits, top_p):
    return apply_top_p(logits, top_p).softmax(-1)


def top_p_keeps_one_token_too_many(logits, top_p):
    def rule(probs, top_p):
        drop = probs.cumsum(-1) - probs >= top_p
        return torch.cat([torch.zeros_like(drop[..., :1]), drop[..., :-1]], dim=-1)
    return _top_p_sorted(logits, top_p, rule)


def test_check_top_p_passes_reference():
    assert checks.check_top_p(apply_top_p)


def test_check_top_p_accepts_another_formulation():
    def shifted_cumsum(logits, top_p):          # keep while the mass *before* the token is < top_p
        if top_p == 1.0:
            return logits
        probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
        keep_sorted = (probs.cumsum(-1) - probs) < top_p
        keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
        return torch.where(keep, logits, torch.full_like(logits, float("-inf")))
    assert checks.check_top_p(shifted_cumsum)


def test_check_top_p_hint_names_the_nucleus():
    with pytest.raises(AssertionError, match=r"with top_p=0.5 on probs \[0.60, 0.30, 0.10\] only token\(s\) \[0\]"):
        checks.check_top_p(top_p_keeps_one_token_too_many)


@pytest.mark.parametrize("bad, match", [
    (top_p_excludes_crossing_token, "crosses it"),
    (top_p_drops_best_token, "most likely token"),
    (top_p_unsorted, "top_p"),
    (top_p_returns_probabilities, "not probabilities"),
    (top_p_keeps_one_token_too_many, "beyond the nucleus"),
], ids=["excludes_crossing_token", "drops_best_token", "unsorted", "returns_probabilities", "one_too_many"])
def test_check_top_p_rejects(bad, match):
    rejects(checks.check_top_p, bad, match)


# ---------------------------------------------------------------- lesson 01: the sampler

def _sample_with(logits, params, generators, scale=True, top_k=True, generator_of=lambda i, gens: gens[i]):
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature if scale else logits[i]
        row = apply_top_p(apply_top_k(row, p.top_k) if top_k else row, p.top_p)
        tokens[i] = torch.multinomial(row.softmax(-1), 1, generator=generator_of(i, generators))[0]
    return tokens


def sampler_ignores_temperature(logits, params, generators):
    return _sample_with(logits, params, generators, scale=False)


def sampler_global_generator(logits, params, generators):
    return _sample_with(logits, params, generators, generator_of=lambda i, gens: None)


def sampler_first_generator_for_all_rows(logits, params, generators):
    return _sample_with(logits, params, generators, generator_of=lambda i, gens: gens[0])


def sampler_ignores_top_k(logits, params, generators):
    return _sample_with(logits, params, generators, top_k=False)


def sampler_always_argmax(logits, params, generators):
    return logits.argmax(dim=-1)


def sampler_top_p_before_temperature(logits, params, generators):
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if not p.greedy:
            row = apply_top_p(apply_top_k(logits[i], p.top_k), p.top_p) / p.temperature
            tokens[i] = torch.multinomial(row.softmax(-1), 1, generator=generators[i])[0]
    return tokens


def sampler_in_place_temperature(logits, params, generators):
    for i, p in enumerate(params):
        if not p.greedy:
            logits[i] /= p.temperature
    return sample(logits, [p if p.greedy else type(p)(temperature=1.0, top_k=p.top_k, top_p=p.top_p)
                           for p in params], generators)


def test_check_sampler_passes_reference():
    assert checks.check_sampler(sample)


def test_check_sampler_accepts_another_random_stream():
    def inverse_cdf(logits, params, generators):   # its own draws: not the reference's stream
        out = logits.argmax(-1)
        for i, p in enumerate(params):
            if p.temperature > 0:
                probs = apply_top_p(apply_top_k(logits[i] / p.temperature, p.top_k), p.top_p).softmax(-1)
                u = torch.rand((), generator=generators[i])
                out[i] = min(int(torch.searchsorted(probs.cumsum(-1), u * probs.sum())), len(probs) - 1)
        return out
    assert checks.check_sampler(inverse_cdf)


@pytest.mark.parametrize("bad, match", [
    (sampler_ignores_temperature, "temperature"),
    (sampler_global_generator, "same seed"),
    (sampler_first_generator_for_all_rows, "batched with other rows"),
    (sampler_ignores_top_k, "top_k=3"),
    (sampler_always_argmax, "far from the expected"),
    (sampler_top_p_before_temperature, "order"),
    (sampler_in_place_temperature, "in place"),
], ids=["ignores_temperature", "global_generator", "first_generator_for_all_rows", "ignores_top_k",
        "always_argmax", "top_p_before_temperature", "in_place_temperature"])
def test_check_sampler_rejects(bad, match):
    rejects(checks.check_sampler, bad, match)


# ---------------------------------------------------------------- lesson 01: naive generation

def _naive_loop(model, tokenizer, prompt, params, on_token, *, append=True, extra_steps=0,
                last_token_only=False, seeded=True, keep_stop_token=True):
    prompt_ids = prompt_to_ids(tokenizer, prompt)
    stopper = StopChecker(params, tokenizer, tokenizer.eos_token_ids)
    generator = make_generator(params) if seeded else None
    output = []
    while True:
        seq = prompt_ids + (output if append else [])
        if last_token_only and output:
            ids, positions, kv = torch.tensor(seq[-1:]), torch.tensor([0]), NoCache([1])
        else:
            ids, positions, kv = torch.tensor(seq), torch.arange(len(seq)), NoCache([len(seq)])
        logits = model.compute_logits(model(ids, positions, kv)[-1:])
        token = int(sample(logits, [params], [generator])[0])
        output.append(token)
        if on_token:
            on_token(len(output) - 1, token)
        finish = stopper.check(output)
        if finish == "length" and extra_steps:
            extra_steps -= 1
            continue
        if finish:
            if finish == "stop" and not keep_stop_token:
                output.pop()
            return CompletionOutput(0, tokenizer.decode(output), output, finish)


def naive_forgets_to_append(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, on_token, append=False)


def naive_ignores_max_tokens(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, on_token, extra_steps=1)


def naive_last_token_without_cache(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, on_token, last_token_only=True)


def naive_unseeded(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, on_token, seeded=False)


def naive_drops_stop_token(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, on_token, keep_stop_token=False)


def naive_no_on_token(model, tokenizer, prompt, params, on_token=None):
    return _naive_loop(model, tokenizer, prompt, params, None)


def naive_skeleton(model, tokenizer, prompt, params, on_token=None):
    raise NotImplementedError


def test_check_generate_naive_passes_reference():
    assert checks.check_generate_naive(generate_naive)


def test_check_generate_naive_accepts_an_independent_loop():
    def own_loop(model, tokenizer, prompt, params, on_token=None):
        return _naive_loop(model, tokenizer, prompt, params, on_token)
    assert checks.check_generate_naive(own_loop)


@pytest.mark.parametrize("bad, match", [
    (naive_forgets_to_append, "append"),
    (naive_ignores_max_tokens, "max_tokens"),
    (naive_last_token_without_cache, "whole sequence"),
    (naive_unseeded, "generator"),
    (naive_drops_stop_token, "stop_token_ids"),
    (naive_no_on_token, "on_token"),
    (naive_skeleton, "not implemented"),
], ids=["forgets_to_append", "ignores_max_tokens", "last_token_without_cache", "unseeded",
        "drops_stop_token", "no_on_token", "skeleton"])
def test_check_generate_naive_rejects(bad, match):
    rejects(checks.check_generate_naive, bad, match)
