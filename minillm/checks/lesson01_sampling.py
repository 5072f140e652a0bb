"""Lesson 01's sampling graders: `check_top_k`, `check_top_p` and `check_sampler`. Top-k
and top-p are judged by rule, not by equality with the reference, so that tied tokens
may go either way and any correct formulation passes; the sampler is judged by the
frequencies of 2000 seeded draws, and by whether a seeded row draws only from its own
generator, which is what keeps a seeded request reproducible inside any batch.
"""
from __future__ import annotations

import torch

from ..sample import sampler as ref_sampling
from ..sampling_params import SamplingParams
from .harness import Grader, expect, expect_tensor, expect_unchanged, fmt, grader, references_standing_in

NEG_INF = float("-inf")


# ---------------------------------------------------------------- lesson 01: top-k, top-p

def _kept_mask(out: torch.Tensor, logits: torch.Tensor, what: str, label: str) -> torch.Tensor:
    """Which tokens survived a filter; every survivor must keep its logit, every other be -inf."""
    expect_tensor(out, logits.shape, what)
    out = out.to(logits.dtype)
    dropped = out == NEG_INF
    kept = (out == logits) & ~dropped
    bad = ~(dropped | kept)
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        got, was = float(out[i]), float(logits[i])
        if got < -1e4:
            hint = f"set dropped tokens to float('-inf'), not a large negative number ({got:.3g})"
        else:
            hint = (f"changed a logit it should keep (token {i[-1]}: {was:.3f} -> {got:.3f}); return the "
                    "logits themselves, with -inf for dropped tokens (not probabilities)")
        raise AssertionError(f"{what} {hint}. Case: {label}")
    return kept


def _top_k_verdict(logits_row, kept_row, k: int, label: str) -> None:
    """Top-k: must keep every logit above the k-th largest, drop every one below it, and at
    least k tokens; tokens tied with the k-th may go either way (the reference keeps them)."""
    V = logits_row.shape[-1]
    if k <= 0 or k >= V:
        expect(kept_row.all(), f"apply_top_k dropped tokens although top_k={k} keeps all {V}. Case: {label}")
        return
    kth = logits_row.sort(descending=True).values[k - 1]
    top = logits_row.topk(k).indices.sort().values.tolist()
    no_tie = int((logits_row >= kth).sum()) == k         # then the k-th itself must stay too
    must_keep = (logits_row >= kth) if no_tie else (logits_row > kth)
    missing = (~kept_row & must_keep).nonzero().flatten().tolist()
    expect(not missing, f"apply_top_k dropped token(s) {missing} which are among the top_k={k} "
                        f"(should survive: {top}). Keep every logit >= the k-th largest. Case: {label}")
    extra = (kept_row & (logits_row < kth)).nonzero().flatten().tolist()
    expect(not extra, f"apply_top_k kept token(s) {extra} beyond the top_k={k}: only {top} should "
                      f"survive, yours kept {kept_row.nonzero().flatten().tolist()}. Case: {label}")
    expect(int(kept_row.sum()) >= k, f"apply_top_k kept {int(kept_row.sum())} tokens, fewer than "
                                     f"top_k={k} (ties at the k-th value count as kept). Case: {label}")


def _filter_cases(fn, what, g, cases, verdict, disabled):
    """Shared driver for top-k and top-p: 1-D rows and [B, V] batches, input never modified,
    disabled values return the logits unchanged."""
    for logits, value, label in cases:
        before = logits.clone()
        with g.case(f"filtering {label}"):
            out = fn(logits, value)
        expect_unchanged(before, logits, what)
        if value in disabled:
            expect(isinstance(out, torch.Tensor) and torch.equal(out, logits),
                   f"{what} with {label} must return the logits unchanged (that value disables it)")
            continue
        kept = _kept_mask(out, logits, what, label)
        rows = [(logits, kept)] if logits.dim() == 1 else list(zip(logits, kept))
        for b, (row, kept_row) in enumerate(rows):
            verdict(row, kept_row, value, label if logits.dim() == 1 else f"row {b} of {label}")


def _batch(seed: int, rows: int = 4, vocab: int = 32) -> torch.Tensor:
    """Random logits whose rows have very different scales: each row needs its own cutoff."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 1.0, 3.0, 8.0][:rows])[:, None]
    return torch.randn(rows, vocab, generator=gen) * scale + torch.arange(rows)[:, None] * 5.0


@grader
def check_top_k(fn) -> bool:
    """fn(logits [V] or [B, V], top_k) -> logits with all but the k largest per row set to -inf.

    Checks k = 1, 2, 4, k equal to and larger than the vocabulary, ties at the k-th
    value (keeping every tied token, or exactly k, are both accepted), a [B, V] batch
    whose rows need different cutoffs, and that 0 and -1 return the logits unchanged.
    """
    g = Grader("check_top_k", "apply_top_k")
    row = torch.tensor([1.0, 3.0, 2.0, 0.5, -1.0])
    cases = [
        (row, 2, "top_k=2 on logits [1.0, 3.0, 2.0, 0.5, -1.0]"),
        (row, 1, "top_k=1 on logits [1.0, 3.0, 2.0, 0.5, -1.0]"),
        (row, 4, "top_k=4 on logits [1.0, 3.0, 2.0, 0.5, -1.0]"),
        (row, 5, "top_k=5 (the whole vocabulary) on 5 logits"),
        (row, 8, "top_k=8, more than the 5 tokens of the vocabulary (clamp k)"),
        (torch.tensor([2.0, 1.0, 1.0, 0.0]), 2, "top_k=2 on logits [2.0, 1.0, 1.0, 0.0] (a tie at the k-th)"),
        (_batch(1), 3, "top_k=3 on a [4, 32] batch (each row needs its own cutoff: work along dim=-1)"),
        (row, 0, "top_k=0"),
        (_batch(2), -1, "top_k=-1 on a [4, 32] batch"),
    ]
    _filter_cases(fn, "apply_top_k", g, cases, _top_k_verdict, disabled=(0, -1))
    return g.passed()


_MASS_EPS = 1e-4   # float32 cumulative sums may land this close to top_p either way


def _top_p_verdict(logits_row, kept_row, top_p: float, label: str) -> None:
    """Top-p keeps the smallest set of most likely tokens whose probability reaches top_p.
    A token must stay if the tokens at least as likely as it hold less than top_p; it must
    go if the strictly more likely ones already reach top_p; ties may go either way, but
    the kept set must reach top_p."""
    probs = logits_row.double().softmax(-1)
    weights = probs[None, :].expand(len(probs), -1)
    better = (weights * (probs[None, :] > probs[:, None])).sum(-1)
    not_worse = (weights * (probs[None, :] >= probs[:, None])).sum(-1) - probs
    must_keep = (not_worse < top_p - _MASS_EPS) & (probs > 0)
    must_drop = (better > top_p + _MASS_EPS) | (probs == 0)
    expected = torch.isfinite(ref_sampling.apply_top_p(logits_row, top_p)).nonzero().flatten().tolist()
    yours = kept_row.nonzero().flatten().tolist()
    short = len(probs) <= 8
    shown = (f" on probs {fmt(probs.float())}" if short else "")
    detail = f"only token(s) {expected} should survive, yours kept {yours}" if short else \
        f"{len(expected)} tokens should survive, yours kept {len(yours)}"

    best = int(probs.argmax())
    expect(not (must_keep[best] and not kept_row[best]),
           f"apply_top_p dropped the most likely token {best}: the best token always survives, even "
           f"when its probability ({float(probs[best]):.2f}) is above top_p={top_p}. Case: {label}")
    missing = (must_keep & ~kept_row).nonzero().flatten().tolist()
    expect(not missing,
           f"apply_top_p dropped token(s) {missing} that the nucleus needs: with top_p={top_p}{shown} "
           f"{detail}. Keep tokens in order of probability until the cumulative probability reaches "
           f"top_p, including the token that crosses it. Case: {label}")
    extra = (must_drop & kept_row).nonzero().flatten().tolist()
    expect(not extra,
           f"apply_top_p kept tokens beyond the nucleus: with top_p={top_p}{shown} {detail}. "
           "Sort the probabilities (descending) before the cumulative sum, stop once it reaches "
           f"top_p, and map the mask back to the original token order. Case: {label}")
    mass = float(probs[kept_row].sum())
    expect(mass >= top_p - _MASS_EPS,
           f"apply_top_p kept tokens holding only {mass:.3f} of the probability, less than "
           f"top_p={top_p}: {detail}. Case: {label}")


@grader
def check_top_p(fn) -> bool:
    """fn(logits [V] or [B, V], top_p) -> logits outside the nucleus set to -inf.

    Checks the token that crosses top_p is kept, tokens past it are dropped,
    unsorted logits, the best token surviving when its probability alone exceeds
    top_p, logits already -inf (after top-k), ties, a [B, V] batch whose rows need
    different cutoffs, and that top_p=1.0 returns the logits unchanged.
    """
    g = Grader("check_top_p", "apply_top_p")

    def from_probs(*p):
        return torch.tensor(p).log() + 3.0       # logits, not log-probs: softmax must normalise

    cases = [
        (from_probs(0.6, 0.3, 0.1), 0.5, "top_p=0.5 on probs [0.6, 0.3, 0.1]"),
        (from_probs(0.6, 0.3, 0.1), 0.7, "top_p=0.7 on probs [0.6, 0.3, 0.1]"),
        (from_probs(0.1, 0.6, 0.3), 0.7, "top_p=0.7 on unsorted probs [0.1, 0.6, 0.3]"),
        (from_probs(0.1, 0.05, 0.8, 0.05), 0.5, "top_p=0.5 on probs [0.1, 0.05, 0.8, 0.05]"),
        (from_probs(0.3, 0.2, 0.5), 0.01, "top_p=0.01 on probs [0.3, 0.2, 0.5]"),
        (torch.tensor([2.0, NEG_INF, 1.0, NEG_INF, 0.5]), 0.9, "top_p=0.9 on logits [2, -inf, 1, -inf, 0.5]"),
        (from_probs(0.4, 0.3, 0.3), 0.5, "top_p=0.5 on probs [0.4, 0.3, 0.3] (a tie)"),
        (_batch(3), 0.8, "top_p=0.8 on a [4, 32] batch (each row needs its own cutoff: work along dim=-1)"),
        (_batch(4, vocab=200), 0.95, "top_p=0.95 on a [4, 200] batch"),
        (from_probs(0.6, 0.3, 0.1), 1.0, "top_p=1.0"),
    ]
    _filter_cases(fn, "apply_top_p", g, cases, _top_p_verdict, disabled=(1.0,))
    return g.passed()


# ---------------------------------------------------------------- lesson 01: the sampler

_DRAWS = 2000
_FREQ_TOL = 0.06    # > 5 standard errors of a frequency over 2000 draws: never a false alarm
STANDING_IN = {"apply_top_k": "check_top_k", "apply_top_p": "check_top_p"}   # names sample calls (outside_help.py)


def _target_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution the sampler must draw from: temperature, then top-k, then top-p."""
    scaled = row / p.temperature
    return ref_sampling.apply_top_p(ref_sampling.apply_top_k(scaled, p.top_k), p.top_p).softmax(-1)


@grader
def check_sampler(fn) -> bool:
    """fn(logits [B, V], params: list[SamplingParams], generators: list[Generator | None]) -> ids [B].

    Checks greedy rows (temperature 0) return the argmax, even beside sampled rows;
    that over 2000 seeded draws every token lies in the allowed set and the
    frequencies match temperature -> top-k -> top-p -> softmax; and that a seeded row
    uses only its own generator: the same seed gives the same tokens, alone or batched
    with any other rows. The reference top-k and top-p stand in for the notebook's own while it
    runs (each of those has its own check), so only a mistake in `sample` fails this check.
    """
    with references_standing_in(fn, STANDING_IN):
        return _check_sampler(fn)


def _check_sampler(fn) -> bool:
    g = Grader("check_sampler", "sample")
    gen = torch.Generator().manual_seed(0)

    # greedy rows
    logits = torch.randn(3, 50, generator=gen) * 3
    before = logits.clone()
    with g.case("sampling 3 greedy rows"):
        out = fn(logits, [SamplingParams(temperature=0)] * 3, [None] * 3)
    expect_unchanged(before, logits, "sample")
    expect_tensor(out, (3,), "sample", integer=True)
    expect(torch.equal(out, logits.argmax(-1)),
           f"sample with temperature=0 must return the argmax of each row: expected "
           f"{logits.argmax(-1).tolist()}, got {out.tolist()}")
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=5),
              SamplingParams(temperature=0)]
    with g.case("sampling greedy rows beside a sampled row"):
        out = fn(logits, params, [None, torch.Generator().manual_seed(5), None])
    expect_unchanged(before, logits, "sample")
    expect_tensor(out, (3,), "sample", integer=True)
    expect(out[0] == logits[0].argmax() and out[2] == logits[2].argmax(),
           "sample: greedy rows (0 and 2) must return their argmax even when other rows of the batch "
           f"sample (row 1); expected {[int(logits[0].argmax()), int(logits[2].argmax())]}, "
           f"got {[int(out[0]), int(out[2])]}")

    # distributions over many seeded draws
    row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0])
    dist_cases = [
        (SamplingParams(temperature=1.0), "temperature=1.0",
         "draw from softmax(logits), e.g. torch.multinomial(probs, 1, generator=...)"),
        (SamplingParams(temperature=0.5), "temperature=0.5",
         "divide the logits by the temperature before the softmax"),
        (SamplingParams(temperature=2.0), "temperature=2.0",
         "divide the logits by the temperature before the softmax"),
        (SamplingParams(temperature=1.0, top_k=3), "top_k=3",
         "apply top-k to the (temperature-scaled) logits before the softmax"),
        (SamplingParams(temperature=1.0, top_p=0.7), "top_p=0.7",
         "apply top-p to the (temperature-scaled) logits before the softmax"),
        (SamplingParams(temperature=0.5, top_k=5, top_p=0.8), "temperature=0.5, top_k=5, top_p=0.8",
         "apply them in vLLM's order: divide by the temperature, then top-k, then top-p, then softmax"),
    ]
    for i, (p, label, hint) in enumerate(dist_cases):
        target = _target_probs(row, p)
        shared = torch.Generator().manual_seed(100 + i)
        with g.case(f"drawing {_DRAWS} tokens with {label}"):
            out = fn(row.expand(_DRAWS, -1).clone(), [p] * _DRAWS, [shared] * _DRAWS)
        expect_tensor(out, (_DRAWS,), "sample", integer=True)
        expect(bool(((out >= 0) & (out < len(row))).all()), f"sample returned token ids outside the vocabulary "
                                                            f"(0..{len(row) - 1}) with {label}")
        outside = sorted(set(out[target[out] == 0].tolist()))
        expect(not outside, f"sample with {label} returned token(s) {outside}, which have probability 0 "
                            f"there (allowed: {(target > 0).nonzero().flatten().tolist()}): {hint}")
        freq = torch.bincount(out, minlength=len(row)).float() / _DRAWS
        gap = float((freq - target).abs().max())
        expect(gap <= _FREQ_TOL,
               f"sample with {label} on logits {fmt(row, 1)}: over {_DRAWS} draws the token frequencies "
               f"{fmt(freq)} are far from the expected probabilities {fmt(target)} (max gap {gap:.2f}): {hint}")

    # a seeded row owns its generator
    mine = torch.randn(16, generator=gen) * 0.5          # flat: many different tokens
    p = SamplingParams(temperature=1.0, seed=7)

    def alone():
        g7 = ref_sampling.make_generator(p)
        return [int(fn(mine[None].clone(), [p], [g7])[0]) for _ in range(12)]

    with torch.random.fork_rng(devices=[]), g.case("sampling one seeded row 12 times"):
        torch.manual_seed(0)
        first = alone()
        torch.manual_seed(1)       # whatever the global RNG is doing
        second = alone()
    expect(len(set(first)) > 1, f"sample with temperature=1.0 on nearly flat logits returned the same token "
                                f"12 times ({first[0]}): it does not seem to sample")
    expect(first == second,
           f"sample: the same seed gave different tokens ({first} then {second}). Draw row i with "
           "its own generator: torch.multinomial(probs, 1, generator=generators[i])")
    g7, g99 = ref_sampling.make_generator(p), torch.Generator().manual_seed(99)
    others = [SamplingParams(temperature=1.0, seed=99), SamplingParams(temperature=0),
              SamplingParams(temperature=0.8, top_k=4)]
    batched = []
    with torch.random.fork_rng(devices=[]), g.case("sampling a seeded row batched with other rows"):
        torch.manual_seed(2)
        for step in range(12):
            noise = torch.randn(3, 16, generator=gen)
            logits = torch.stack([noise[0], noise[1], mine, noise[2]])
            out = fn(logits, [others[0], others[1], p, others[2]], [g99, None, g7, None])
            batched.append(int(out[2]))
    expect(batched == first,
           f"sample: a seeded row gave {first} alone but {batched} when batched with other rows (row 2 of "
           "4). Each row must draw only from its own generator, generators[i], and nothing else may "
           "advance it: not other rows, not the global RNG")
    return g.passed()
