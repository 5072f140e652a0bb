"""Tests of the graders of lesson 11 (minillm.checks.lesson11_ngram, lesson11_rejection).

The references pass each one, and planted mistakes are rejected with a hint that names the
problem; the rejection sampler's distribution test alone also rejects each of the issue's planted
bugs (accepting on p > q, resampling from p, no bonus, off by one). Addressable per lesson task:
`pytest -k check_ngram_proposer`, `pytest -k check_rejection_sampler`.
"""
import re

import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.checks.lesson11_rejection import distribution_problem
from minillm.spec.ngram import propose_ngram
from minillm.spec.rejection import target_probs, verify


# ---------------------------------------------------------------- exercise (a): the n-gram proposer

def shortest_first(tokens, k, min_n, max_n):
    length = len(tokens)
    for n in range(min_n, min(max_n, length - 1) + 1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def earliest_match(tokens, k, min_n, max_n):
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(0, length - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def matches_itself(tokens, k, min_n, max_n):
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n, -1, -1):          # the suffix's own position first
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def no_overlap(tokens, k, min_n, max_n):
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - 2 * n, -1, -1):      # the earlier occurrence must end before the suffix
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def no_k_cap(tokens, k, min_n, max_n):
    return propose_ngram(tokens, 100, min_n, max_n)


def ignores_min_n(tokens, k, min_n, max_n):
    return propose_ngram(tokens, k, 1, max_n)


def ignores_max_n(tokens, k, min_n, max_n):
    return propose_ngram(tokens, k, min_n, 8)


def pads_to_k(tokens, k, min_n, max_n):
    out = propose_ngram(tokens, k, min_n, max_n)
    return out + [out[-1]] * (k - len(out)) if out else out


def proposes_the_last_token(tokens, k, min_n, max_n):
    return propose_ngram(tokens, k, min_n, max_n) or tokens[-1:]


def appends(tokens, k, min_n, max_n):
    out = propose_ngram(tokens, k, min_n, max_n)
    tokens += out
    return out


def ngram_stub(tokens, k, min_n, max_n):
    raise NotImplementedError("YOUR CODE HERE")


def test_check_ngram_proposer_accepts_the_reference():
    assert checks.check_ngram_proposer(propose_ngram)


@pytest.mark.parametrize("bad, match", [
    (shortest_first, r"(?s)the longest n-gram first.*Try n from max_n down"),
    (earliest_match, r"(?s)the most recent match.*the latest one wins"),
    (matches_itself, r"(?s)never the suffix itself.*always match themselves"),
    (no_overlap, r"(?s)may overlap the suffix.*\[7, 7\] starts at position 1 and overlaps the suffix.*"
                 r"every start from len - n - 1 down to 0"),
    (no_k_cap, r"(?s)at most k tokens"),
    (ignores_min_n, r"(?s)min_n respected"),
    (ignores_max_n, r"(?s)max_n respected"),
    (pads_to_k, r"(?s)no padding"),
    (proposes_the_last_token, r"(?s)nothing recurs.*propose nothing"),
    (appends, r"(?s)changed its tokens"),
    (ngram_stub, r"(?s)not implemented yet"),
], ids=["shortest-first", "earliest-match", "matches-itself", "no-overlap", "no-k-cap", "ignores-min-n",
        "ignores-max-n", "pads-to-k", "fallback-proposal", "mutates-tokens", "stub"])
def test_check_ngram_proposer_rejects(bad, match):
    rejects(checks.check_ngram_proposer, bad, match)


# ---------------------------------------------------------------- exercise (b): the rejection sampler

def sampled(accept, residual_of, bonus=True, kept=lambda i: i):
    """A verify with the reference's greedy path and a sampled path built from the given pieces:
    accept(u, p_draft, probs_row) decides, residual_of(probs_row, draft) is what a rejection draws
    from, kept(i) how many drafts a rejection at i emits."""
    def fn(logits, drafts, params, generator=None):
        if params.greedy:
            return verify(logits, drafts, params, generator)
        probs = target_probs(logits, params)
        for i, draft in enumerate(drafts):
            u = torch.rand(1, generator=generator)
            if accept(u, probs[i, draft], probs[i]):
                continue
            return drafts[:kept(i)] + [int(torch.multinomial(residual_of(probs[i], draft), 1, generator=generator))]
        last = [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]
        return drafts + last if bonus else list(drafts)
    return fn


def with_draft_removed(row, draft):
    residual = row.clone()
    residual[draft] = 0.0
    return residual


RIGHT = sampled(lambda u, p, row: u < p, with_draft_removed)
ACCEPT_WHEN_LIKELY = sampled(lambda u, p, row: p > 0.5, with_draft_removed)           # "p > q": deterministic
ACCEPT_WHEN_MODE = sampled(lambda u, p, row: p >= row.max(), with_draft_removed)
RESAMPLE_FROM_P = sampled(lambda u, p, row: u < p, lambda row, draft: row)
NO_BONUS = sampled(lambda u, p, row: u < p, with_draft_removed, bonus=False)
KEEPS_THE_REJECTED = sampled(lambda u, p, row: u < p, with_draft_removed, kept=lambda i: i + 1)
DROPS_ONE = sampled(lambda u, p, row: u < p, with_draft_removed, kept=lambda i: max(0, i - 1))
REJECTS_WHEN_LIKELY = sampled(lambda u, p, row: u > p, with_draft_removed)


def ignores_params(logits, drafts, params, generator=None):
    if params.greedy:
        return verify(logits, drafts, params, generator)
    probs = logits.float().softmax(dim=-1)                  # no temperature, top-k, top-p
    for i, draft in enumerate(drafts):
        if torch.rand(1, generator=generator) < probs[i, draft]:
            continue
        return drafts[:i] + [int(torch.multinomial(with_draft_removed(probs[i], draft), 1, generator=generator))]
    return drafts + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


def global_rng(logits, drafts, params, generator=None):
    return verify(logits, drafts, params, None)              # the generator never used


def greedy_off_by_one(logits, drafts, params, generator=None):
    if not params.greedy:
        return verify(logits, drafts, params, generator)
    best = logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(drafts) and best[accepted] == drafts[accepted]:
        accepted += 1
    return drafts[:accepted + 1] + [best[accepted]] if accepted < len(drafts) else drafts + [best[accepted]]


def greedy_no_bonus(logits, drafts, params, generator=None):
    out = verify(logits, drafts, params, generator)
    return out[:-1] if params.greedy and len(out) == len(drafts) + 1 and drafts else out


def greedy_keeps_matching(logits, drafts, params, generator=None):
    if not params.greedy:
        return verify(logits, drafts, params, generator)
    best = logits.argmax(dim=-1).tolist()
    kept = [d for i, d in enumerate(drafts) if best[i] == d]
    return kept + [best[len(kept)]]


def modifies_logits(logits, drafts, params, generator=None):
    logits /= max(params.temperature, 1e-5)
    return verify(logits * max(params.temperature, 1e-5), drafts, params, generator)


def returns_a_tensor(logits, drafts, params, generator=None):
    return torch.tensor(verify(logits, drafts, params, generator))


def rejection_stub(logits, drafts, params, generator=None):
    raise NotImplementedError("YOUR CODE HERE")


def test_check_rejection_sampler_accepts_the_reference():
    assert checks.check_rejection_sampler(verify)
    assert checks.check_rejection_sampler(RIGHT)


@pytest.mark.parametrize("bad, match", [
    (ACCEPT_WHEN_LIKELY, r"(?s)probability 0.3: you kept it in 0 of 1000.*Accepting on p > q"),
    (ACCEPT_WHEN_MODE, r"(?s)Accepting on p > q, or whenever p\(draft\) is large"),
    (REJECTS_WHEN_LIKELY, r"(?s)rejected although the model gives it probability 1.*keep the draft when u < p_i\(draft\)"),
    (RESAMPLE_FROM_P, r"(?s)rejected and then emitted as the correction.*with d removed"),
    (NO_BONUS, r"(?s)drafts of probability 1, 1, 1.*the bonus"),
    (KEEPS_THE_REJECTED, r"(?s)off by one in the accepted count: the rejected draft was emitted"),
    (DROPS_ONE, r"(?s)off by one in the accepted count: an accepted draft is missing"),
    (greedy_off_by_one, r"(?s)greedy.*off by one in the accepted count: the rejected draft was emitted"),
    (greedy_no_bonus, r"(?s)greedy, every draft is its row's argmax.*the bonus"),
    (greedy_keeps_matching, r"(?s)greedy.*stop at the first rejected draft"),
    (ignores_params, r"(?s)the distribution test: .*temperature, top-k and top-p applied"),
    (global_rng, r"(?s)same seed.*draw every random number from `generator`"),
    (modifies_logits, r"(?s)modified its input in place"),
    (returns_a_tensor, r"(?s)returned Tensor: return a list"),
    (rejection_stub, r"(?s)not implemented yet"),
], ids=["accept-when-likely", "accept-when-mode", "rejects-when-likely", "resample-from-p", "no-bonus",
        "keeps-the-rejected", "drops-one", "greedy-off-by-one", "greedy-no-bonus", "greedy-keeps-matching",
        "ignores-params", "global-rng", "modifies-logits", "returns-a-tensor", "stub"])
def test_check_rejection_sampler_rejects(bad, match):
    rejects(checks.check_rejection_sampler, bad, match)


def test_the_distribution_test_alone_passes_the_reference():
    assert distribution_problem(verify) is None
    assert distribution_problem(RIGHT) is None


@pytest.mark.parametrize("bad, match", [
    (ACCEPT_WHEN_LIKELY, r"(?s)position 0 .*too (often|rarely)"),
    (RESAMPLE_FROM_P, r"(?s)position 0 .*comes out too often"),
    (NO_BONUS, r"(?s)no token: 1\.00.*the bonus"),
    (KEEPS_THE_REJECTED, r"(?s)position 0 .*too often"),
    (DROPS_ONE, r"(?s)position"),
], ids=["accept-when-likely", "resample-from-p", "no-bonus", "keeps-the-rejected", "drops-one"])
def test_the_distribution_test_alone_rejects_each_planted_bug(bad, match):
    problem = distribution_problem(bad)
    assert problem is not None and re.search(match, problem, re.S), problem
