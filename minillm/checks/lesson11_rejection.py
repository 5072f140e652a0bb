"""Lesson 11's rejection-sampler grader, `check_rejection_sampler`: the learner's
`verify(logits, drafts, params, generator)` for point-mass drafts (an n-gram proposal), on a
6-token vocabulary, in four stages that each name the mistake they catch:

  1. greedy, exact: a draft is kept exactly when it is its row's argmax, up to the first miss,
     then the model's own token (the correction, or the bonus after a full accept);
  2. sampled, structure: drafts of probability 1 always kept, a draft of probability 0 never, the
     bonus after a full accept, a rejected draft never drawn again as the correction (the residual
     max(0, p - q) has the draft removed), and a draft of probability p kept about p of the time;
  3. seeded: the same generator seed gives the same tokens, whatever the global RNG does;
  4. the distribution test, as vLLM tests its sampler: random target distributions (temperature,
     top-k and top-p among them), thousands of draws; at every position the emitted tokens
     (given the drafts before were kept) must follow the model's distribution there: their
     distance to it shrinks with the number of samples, stays within a few times what sampling
     noise alone gives, and is smaller than that of every one of 100 random reference
     distributions.

Stage 4 alone rejects every planted bug of tests/test_checks_lesson11.py (accepting on p > q,
resampling from p, no bonus, off by one); stages 1-3 come first so that the hint names the bug.
"""
from __future__ import annotations

import math

import torch

from .harness import Grader, expect, expect_unchanged, fmt, grader

V = 6
SURE, NEVER = 30.0, float("-inf")       # logits: p = 1.0 exactly in float32, and p = 0

ACCEPT_RULE = ("accept draft i with probability p_i(draft): draw u uniform in [0, 1) (torch.rand(1, "
               "generator=generator)) and keep the draft when u < p_i(draft). That is min(1, p/q) for a point-mass "
               "draft (q = 1). Accepting on p > q, or whenever p(draft) is large, decides deterministically: it keeps "
               "too many likely drafts and too few unlikely ones, and the tokens no longer follow the model")
RESAMPLE = ("after rejecting draft d, draw the correction from p with d removed (residual = probs[i].clone(); "
            "residual[d] = 0), which is normalise(max(0, p - q)) for the point mass q on d. Drawing from p itself "
            "gives d a second chance, so d comes out more often than p(d)")
BONUS = ("when every draft is accepted, the model's last row (row k, computed after the last draft) still gives one "
         "token: the bonus. A full accept emits k + 1 tokens; without the bonus a step that verified k drafts gains "
         "only k, and the token after them is missing")
KEPT_REJECTED = ("off by one in the accepted count: the rejected draft was emitted. When draft i is the first "
                 "rejected, drafts 0..i-1 are kept: emit drafts[:i], then the model's token from row i")
DROPPED = ("off by one in the accepted count: an accepted draft is missing. When draft i is the first rejected, "
           "emit drafts[:i] (i drafts), then the model's token from row i")
STOP_AT_FIRST = ("stop at the first rejected draft: row i + 1 was computed as if draft i were in the text, so once "
                 "draft i is rejected, the rows after it say nothing")
SEEDED = ("draw every random number from `generator` (torch.rand(1, generator=generator), torch.multinomial(..., "
          "generator=generator)): a request with a seed must get the same tokens on every run, whatever else runs")
PARAMS = ("draw from the distribution sampling would use: temperature, top-k and top-p applied to the logits first "
          "(target_probs(logits, params) does it), not softmax(logits)")


def _tokens(got, call: str) -> list[int]:
    expect(isinstance(got, (list, tuple)), f"{call} returned {type(got).__name__}: return a list of token ids")
    try:
        return [int(t) for t in got]
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{call} returned {list(got)[:4]}: return a list of token ids (ints)") from None


def _call(g, fn, logits, drafts, params, generator, what: str) -> list[int]:
    call = f"verify(logits [{logits.shape[0]}, {V}], drafts={drafts}, {_describe(params)})"
    before = logits.clone()
    with g.case(f"calling {call} ({what})"):
        got = fn(logits, list(drafts), params, generator)
    expect_unchanged(before, logits, "verify")
    out = _tokens(got, call)
    expect(1 <= len(out) <= len(drafts) + 1,
           f"{call} returned {out}: {len(out)} tokens. It emits the accepted drafts and then exactly one token of "
           f"the model's, so 1 to len(drafts) + 1 = {len(drafts) + 1} tokens")
    expect(all(0 <= t < V for t in out), f"{call} returned {out}: token ids are 0..{V - 1} here")
    return out


def _describe(params) -> str:
    if params.greedy:
        return "greedy"
    extra = (f", top_k={params.top_k}" if params.top_k > 0 else "") + (f", top_p={params.top_p}" if params.top_p < 1 else "")
    return f"temperature={params.temperature}{extra}"


def _shape(got, drafts, accepted: int, what: str) -> str | None:
    """The hint for a run whose accepted count should be `accepted` (known: every draft's p is 0 or 1)."""
    k = len(drafts)
    if len(got) == accepted + 1 and got[:accepted] == drafts[:accepted] \
            and (accepted == k or got[accepted] != drafts[accepted]):
        return None
    head = f"{what}: drafts {drafts}, you emitted {got}; expected drafts {drafts[:accepted]} then one token of the model's"
    if accepted == k and got == drafts:
        return f"{head}\n    Hint: {BONUS}"
    if len(got) == accepted + 2 and got[:accepted + 1] == drafts[:accepted + 1]:
        return f"{head}\n    Hint: {KEPT_REJECTED}"
    if len(got) == accepted and got[:accepted - 1] == drafts[:accepted - 1]:
        return f"{head}\n    Hint: {DROPPED}"
    if len(got) > accepted + 1:
        return f"{head}\n    Hint: {STOP_AT_FIRST}"
    if accepted < k and got[:accepted + 1] == drafts[:accepted + 1]:
        return f"{head}\n    Hint: draft {accepted} was accepted although the model gives it probability 0. {ACCEPT_RULE}"
    return f"{head}\n    Hint: a draft was rejected although the model gives it probability 1. {ACCEPT_RULE}"


# ---------------------------------------------------------------- 1. greedy, exact

def _greedy_logits(best: list[int]) -> torch.Tensor:
    logits = torch.full((len(best), V), -5.0)
    for row, token in enumerate(best):
        logits[row, token] = 5.0
    return logits


def _greedy_cases(g, fn) -> None:
    from ..sampling_params import SamplingParams
    greedy = SamplingParams(temperature=0)
    logits = _greedy_logits([2, 3, 1, 4])
    cases = [("every draft is its row's argmax", [2, 3, 1], 3), ("the second draft is not the argmax", [2, 0, 1], 1),
             ("the first draft misses, the later ones would match", [5, 3, 1], 0),
             ("two drafts, both the argmax", [2, 3], 2), ("no drafts", [], 0)]
    for what, drafts, accepted in cases:
        rows = logits[:len(drafts) + 1].clone()
        got = _call(g, fn, rows, drafts, greedy, torch.Generator().manual_seed(0), what)
        want = drafts[:accepted] + [[2, 3, 1, 4][accepted]]
        if got != want:
            hint = _shape(got, drafts, accepted, f"greedy, {what} (row argmaxes {[2, 3, 1, 4][:len(drafts) + 1]})")
            raise AssertionError(hint or f"greedy, {what}: drafts {drafts}, you emitted {got}, expected {want}\n"
                                         f"    Hint: greedy keeps a draft exactly when it is its row's argmax, and "
                                         f"the token after the kept drafts is the argmax of the next row")


# ---------------------------------------------------------------- 2. sampled, structure

def _sure_logits(drafts: list[int], never_at: int | None, seed: int) -> torch.Tensor:
    """Row i gives drafts[i] probability 1 (or 0 at row never_at); the last row is random."""
    logits = torch.randn(len(drafts) + 1, V, generator=torch.Generator().manual_seed(seed))
    for i, d in enumerate(drafts):
        logits[i] = 0.0
        logits[i, d] = NEVER if i == never_at else SURE
    return logits


def _one_draft_logits(p: float, draft: int = 1) -> torch.Tensor:
    """Row 0 gives the draft probability p, the other tokens equal shares; row 1 random."""
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
    logits[0] = 0.0
    logits[0, draft] = math.log(p * (V - 1) / (1 - p))
    return logits


def _structure_cases(g, fn) -> None:
    from ..sampling_params import SamplingParams
    t1 = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(1)
    drafts = [1, 4, 2]
    for what, never_at, accepted in (("drafts of probability 1, 1, then 0", 2, 2),
                                     ("drafts of probability 1, 1, 1", None, 3),
                                     ("a first draft of probability 0", 0, 0)):
        logits = _sure_logits(drafts, never_at, seed=accepted)
        for _ in range(20):
            hint = _shape(_call(g, fn, logits, drafts, t1, gen, what), drafts, accepted, f"sampled, {what}")
            if hint:
                raise AssertionError(hint)
    logits = _one_draft_logits(0.5)
    for _ in range(300):
        got = _call(g, fn, logits, [1], t1, gen, "a draft of probability 0.5")
        if got == [1]:
            raise AssertionError("sampled, a draft of probability 0.5: the draft was rejected and then emitted as "
                                 f"the correction ({got})\n    Hint: {RESAMPLE}")
    for p in (0.3, 0.7):
        logits, n = _one_draft_logits(p), 1000
        kept = sum(len(_call(g, fn, logits, [1], t1, gen, f"a draft of probability {p}")) == 2 for _ in range(n))
        if abs(kept / n - p) > 0.07:
            raise AssertionError(f"sampled, one draft of probability {p}: you kept it in {kept} of {n} runs "
                                 f"({kept / n:.0%}), expected about {p:.0%}\n    Hint: {ACCEPT_RULE}")


# ---------------------------------------------------------------- 3. seeded

def _seeded_case(g, fn) -> None:
    from ..sampling_params import SamplingParams
    params = SamplingParams(temperature=0.9, seed=7)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    drafts = [int(logits[0].argmax()), int(logits[1].argmax())]
    state = torch.get_rng_state()
    try:
        runs = []
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            gen = torch.Generator().manual_seed(7)
            runs.append([_call(g, fn, logits, drafts, params, gen, "a seeded request") for _ in range(40)])
    finally:
        torch.set_rng_state(state)
    expect(runs[0] == runs[1], "sampled with a seeded generator: two runs with the same seed (and a different "
                               f"global RNG) emitted different tokens, first {runs[0][:4]}..., then {runs[1][:4]}..."
                               f"\n    Hint: {SEEDED}")


# ---------------------------------------------------------------- 4. the distribution test

def _trials():
    """(logits [3, V], drafts [2], params): random targets; the first draft likely, the second less so."""
    from ..sampling_params import SamplingParams
    from ..spec.rejection import target_probs
    out = []
    for seed, params in ((11, SamplingParams(temperature=1.0)), (12, SamplingParams(temperature=0.7, top_k=4)),
                         (13, SamplingParams(temperature=1.3, top_p=0.9))):
        logits = 1.5 * torch.randn(3, V, generator=torch.Generator().manual_seed(seed))
        p = target_probs(logits, params)
        drafts = [int(p[0].argmax()), int(p[1].argsort(descending=True)[1])]
        out.append((logits, drafts, params, p))
    return out


def _noise(p: torch.Tensor, n: int) -> float:
    """The expected total-variation distance of n exact draws from p (a normal approximation)."""
    return 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def _position_counts(table: torch.Tensor, drafts: list[int], j: int) -> torch.Tensor:
    """Counts of the token emitted at position j over the runs (rows of `table`, V past a run's end)
    that kept drafts[:j]; index V: no token there."""
    kept = (table[:, :j] == torch.tensor(drafts[:j], dtype=torch.long)).all(dim=1)
    return torch.bincount(table[kept, j], minlength=V + 1).float()


def distribution_problem(fn, samples: int = 3000) -> str | None:
    """The distribution test alone: None when every position's emitted tokens follow the target, else
    what is wrong (the planted-bug tests call it directly)."""
    exponentials = -torch.rand(100, V, generator=torch.Generator().manual_seed(0)).log()
    references = exponentials / exponentials.sum(dim=1, keepdim=True)       # 100 uniform draws of a distribution
    small_total = big_total = 0.0
    for trial, (logits, drafts, params, p) in enumerate(_trials()):
        gen = torch.Generator().manual_seed(100 + trial)
        runs = [[int(t) for t in fn(logits.clone(), list(drafts), params, gen)] for _ in range(samples)]
        wrong = next((out for out in runs if not all(0 <= t < V for t in out)), None)
        if wrong is not None:
            return f"verify returned {wrong}: token ids are 0..{V - 1} here"
        width = len(drafts) + 1                                 # a run of V tokens past its end: [samples, k + 1]
        table = torch.tensor([(out + [V] * width)[:width] for out in runs], dtype=torch.long)
        raw = torch.softmax(logits, dim=-1)
        for j in range(len(drafts) + 1):
            target = torch.cat([p[j], torch.zeros(1)])
            counts = _position_counts(table, drafts, j)
            n = int(counts.sum())
            if n < 50:
                return (f"position {j}: only {n} of {samples} runs kept the drafts {drafts[:j]} before it, although "
                        f"the model gives them probability {float(p[0, drafts[0]]):.2f}" + (
                            f" and {float(p[1, drafts[1]]):.2f}" if j > 1 else "") + f"\n    Hint: {ACCEPT_RULE}")
            emp = counts / n
            tv, noise = _tv(emp, target), _noise(p[j], n)
            small = _position_counts(table[:samples // 16], drafts, j)
            small_total += _tv(small / max(1.0, float(small.sum())), target)
            big_total += tv
            closest_reference = min(_tv(r, p[j]) for r in references)
            if tv > 4 * noise + 0.01 or tv >= closest_reference:
                return _distribution_hint(j, drafts, emp, target, raw[j], tv, noise, params, closest_reference)
    if big_total > 0.5 * small_total:
        return (f"the emitted tokens' distance to the model's distributions did not shrink with more samples "
                f"({small_total:.3f} summed over positions with {samples // 16} runs, {big_total:.3f} with {samples})"
                f"\n    Hint: every random choice must come from the model's distribution: {ACCEPT_RULE}")
    return None


def _distribution_hint(j, drafts, emp, target, raw, tv, noise, params, closest) -> str:
    where = (f"position {j} (after the drafts {drafts[:j]} were kept; {_describe(params)}): the emitted tokens "
             f"{fmt(emp[:V])} (no token: {float(emp[V]):.2f}) against the model's {fmt(target[:V])}, distance "
             f"{tv:.3f}; sampling noise alone gives about {noise:.3f}, the closest of 100 random distributions {closest:.3f}")
    if emp[V] > 0.01:
        return f"{where}\n    Hint: {BONUS}"
    if _tv(emp[:V], raw) < 0.5 * tv:
        return f"{where}\n    Hint: {PARAMS}"
    if j < len(drafts):
        d = drafts[j]
        if emp[d] > target[d] + 3 * noise:
            return (f"{where}\n    Hint: the draft {d} comes out too often: either it is accepted on a deterministic "
                    f"rule, or drawn again after its rejection. {ACCEPT_RULE}. And {RESAMPLE}")
        if emp[d] < target[d] - 3 * noise:
            return f"{where}\n    Hint: the draft {d} comes out too rarely. {ACCEPT_RULE}"
    return f"{where}\n    Hint: {ACCEPT_RULE}; {RESAMPLE}"


@grader
def check_rejection_sampler(fn) -> bool:
    """fn(logits [k + 1, V], drafts [k], params, generator) -> the accepted drafts then one token of the
    model's, like `minillm.spec.rejection.verify`: greedy exact cases, sampled structure, seeded
    determinism, and the distribution test (3 random targets x 3000 draws, on 6 tokens)."""
    g = Grader("check_rejection_sampler", "your verify")
    expect(callable(fn), f"check_rejection_sampler takes your function verify, got {fn!r}")
    _greedy_cases(g, fn)
    _structure_cases(g, fn)
    _seeded_case(g, fn)
    with g.case("running the distribution test (3 random target distributions, 3000 draws each)"):
        problem = distribution_problem(fn)
    if problem:
        raise AssertionError(f"the distribution test: {problem}")
    return g.passed()
