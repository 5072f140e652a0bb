"""Sampler: parameter validation, the shape of the distributions, seeds."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minillm.sample.sampler import apply_top_k, apply_top_p, make_generator, sample
from minillm.sampling_params import SamplingParams
from minillm.text.stopping import StopChecker


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"),
    ({"stop": [""]}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"seed": 1.5}, "seed"),
])
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises((ValueError, TypeError), match=f"SamplingParams.{field} must be"):
        SamplingParams(**kwargs)


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="END").stop == ["END"]


def test_greedy_is_argmax():
    logits = torch.randn(5, 100, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0)] * 5
    assert torch.equal(sample(logits, params, [None] * 5), logits.argmax(-1))


def empirical(logits, params, draws=4000, seed=0):
    g = make_generator(SamplingParams(seed=seed))
    counts = torch.zeros(logits.shape[-1])
    for _ in range(draws):
        counts[sample(logits[None], [params], [g])[0]] += 1
    return counts / draws


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_matches_softmax(temperature):
    freq = empirical(LOGITS, SamplingParams(temperature=temperature))
    target = (LOGITS / temperature).softmax(-1)
    # 4000 draws: standard error <= 0.008; 0.04 is 5 sigma
    assert (freq - target).abs().max() < 0.04


def test_top_k_keeps_k_tokens_in_proportion():
    freq = empirical(LOGITS, SamplingParams(temperature=1.0, top_k=3))
    assert freq[3:].sum() == 0
    target = LOGITS[:3].softmax(-1)
    assert (freq[:3] - target).abs().max() < 0.04


def test_top_p_keeps_the_nucleus():
    probs = LOGITS.softmax(-1)            # 0.39, 0.24, 0.14, 0.09, ...
    top_p = float(probs[:2].sum()) + 0.01  # needs the third token to reach it
    freq = empirical(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert freq[3:].sum() == 0 and freq[2] > 0
    assert (freq[:3] - probs[:3] / probs[:3].sum()).abs().max() < 0.04


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=1, max_size=40), st.floats(0.01, 1.0))
def test_top_p_property_smallest_set_reaching_p(values, top_p):
    logits = torch.tensor(values)
    kept = torch.isfinite(apply_top_p(logits, top_p))
    probs = logits.softmax(-1)
    assert kept[logits.argmax()]
    assert probs[kept].sum() >= min(top_p, 1.0) - 1e-5          # reaches p
    # minimal: without its least likely kept token, the set would fall short of p
    # (unless that token ties another kept one)
    least = probs[kept].min()
    assert probs[kept].sum() - least < top_p + 1e-5 or (probs[kept] == least).sum() > 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=1, max_size=40), st.integers(1, 50))
def test_top_k_property(values, k):
    logits = torch.tensor(values)
    kept = torch.isfinite(apply_top_k(logits, k))
    assert kept.sum() >= min(k, len(values))
    assert logits[kept].min() >= logits[~kept].max() if (~kept).any() else True


def test_seeded_row_independent_of_batch():
    torch.manual_seed(0)
    row = torch.randn(1000)
    p = SamplingParams(temperature=1.0, seed=123)
    alone = [sample(row[None], [p], [make_generator(p)])[0].item() for _ in range(1)]
    seqs = []
    for others in (0, 3, 7):
        g = make_generator(p)
        out = []
        for step in range(20):
            batch = torch.cat([torch.randn(others, 1000), row[None]])
            params = [SamplingParams(temperature=0.7, seed=step)] * others + [p]
            gens = [make_generator(q) for q in params[:-1]] + [g]
            out.append(sample(batch, params, gens)[-1].item())
        seqs.append(out)
    assert seqs[0] == seqs[1] == seqs[2]
    assert seqs[0][0] == alone[0]
    assert len(set(seqs[0])) > 1


class CharTokenizer:
    """One character per token: lets a test place a stop string exactly."""
    eos_token_ids = {0}

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i != 0)


def test_stop_string_spanning_tokens_is_cut_exactly():
    tok = CharTokenizer()
    checker = StopChecker(SamplingParams(stop=["END", "zz"], max_tokens=100), tok, tok.eos_token_ids)
    ids, reasons = [], []
    for ch in "abcEN":
        ids.append(ord(ch))
        reasons.append(checker.check(ids))
    assert reasons == [None] * 5
    ids.append(ord("D"))
    assert checker.check(ids) == "stop" and checker.text == "abc"


def test_stop_reasons_eos_token_and_length():
    tok = CharTokenizer()
    assert StopChecker(SamplingParams(max_tokens=5), tok, {0}).check([65, 0]) == "stop"
    assert StopChecker(SamplingParams(max_tokens=5, ignore_eos=True), tok, {0}).check([65, 0]) is None
    assert StopChecker(SamplingParams(max_tokens=5, stop_token_ids=[66]), tok, {0}).check([65, 66]) == "stop"
    assert StopChecker(SamplingParams(max_tokens=2), tok, {0}).check([65, 67]) == "length"


def test_top_p_on_tied_logits_keeps_the_argmax():
    logits = torch.zeros(17)
    kept = torch.isfinite(apply_top_p(logits, 0.5))
    assert kept[logits.argmax()] and kept.sum() == 9      # 9/17 >= 0.5 > 8/17
