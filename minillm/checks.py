"""Graders for the lessons' check cells: your piece against the reference, on small cases.

Each `check_*` takes your function or class — with exactly the signature of the
reference it replaces — runs it on a few deterministic cases, and either prints
"✅ ... passed" and returns True, or raises AssertionError with a hint saying what
went wrong and where to look.

    from minillm.checks import check_top_p
    check_top_p(my_apply_top_p)

| lesson | grader                  | your piece has the signature of        |
|--------|-------------------------|----------------------------------------|
| 00     | check_rope              | minillm.models.llama.apply_rope        |
| 01     | check_top_k             | minillm.sampling.apply_top_k           |
| 01     | check_top_p             | minillm.sampling.apply_top_p           |
| 01     | check_sampler           | minillm.sampling.sample                |
| 01     | check_generate_naive    | minillm.naive.generate_naive           |
| 02     | check_contiguous_cache  | minillm.kv.contiguous.ContiguousKVCache |

Lessons 03-06 (paged KV, prefix sharing, scheduling, preemption) have their graders in
`minillm/checks_paged.py`; they are importable from here too.

Every case uses fixed seeds, so a check gives the same verdict every time it runs.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from . import sampling as ref_sampling
from .sampling import SamplingParams

__all__ = ["check_rope", "check_top_k", "check_top_p", "check_sampler",
           "check_generate_naive", "check_contiguous_cache"]

NEG_INF = float("-inf")


# ---------------------------------------------------------------- shared helpers

class _Grader:
    """Counts the cases of one check, turns a crash in your code into a hint, prints the verdict."""

    def __init__(self, name: str, what: str):
        self.name, self.what, self.cases = name, what, 0

    @contextmanager
    def case(self, doing: str):
        """One case: any error other than a failed check is reported as your code crashing."""
        self.cases += 1
        try:
            yield
        except AssertionError:
            raise
        except NotImplementedError as e:
            raise AssertionError(f"{self.what} is not implemented yet (it raised NotImplementedError): "
                                 "fill in the exercise cell and run it again") from e
        except Exception as e:
            raise AssertionError(f"{self.what} raised {type(e).__name__}: {e}\n"
                                 f"    while {doing}") from e

    def passed(self) -> bool:
        print(f"✅ {self.name} passed ({self.cases} cases)")
        return True


def _expect(ok, message: str) -> None:
    """Like `assert`, but still checks under `python -O`."""
    if not ok:
        raise AssertionError(message)


def _fmt(values, digits: int = 2) -> str:
    """A short readable list: [0.6, 0.3, -inf]."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return "[" + ", ".join(f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in values) + "]"


def _expect_tensor(out, shape, what: str, integer: bool = False) -> None:
    _expect(isinstance(out, torch.Tensor), f"{what} should return a torch.Tensor, got {type(out).__name__}")
    _expect(tuple(out.shape) == tuple(shape),
            f"{what} returned shape {list(out.shape)}, expected {list(shape)}")
    if integer:
        _expect(not out.dtype.is_floating_point and out.dtype != torch.bool,
                f"{what} should return integer token ids (torch.long), got dtype {out.dtype}")


def _expect_unchanged(before: torch.Tensor, after: torch.Tensor, what: str) -> None:
    _expect(torch.equal(before, after),
            f"{what} modified its input in place; return a new tensor instead "
            "(e.g. `masked_fill`, not `masked_fill_`; `x / t`, not `x /= t`)")


@functools.lru_cache(maxsize=None)
def _tiny_model():
    """The tiny random Llama and the course tokenizer, loaded once per session."""
    from .models import load_model
    return load_model("tiny-llama", device="cpu")


def _greedy_tie(model, prompt_ids: list[int], ours: list[int], reference: list[int]) -> bool:
    """True when the first differing greedy token is a float-rounding tie: both tokens'
    logits lie within 1e-3 of the largest one (the course's rule, see DESIGN.md)."""
    from .naive import next_token_logits_naive
    i = next((j for j, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if i is None:
        return False
    logits = next_token_logits_naive(model, prompt_ids + reference[:i])
    top = logits.max()
    return max(float(top - logits[ours[i]]), float(top - logits[reference[i]])) <= 1e-3


# ---------------------------------------------------------------- lesson 00: RoPE

def _rope_variants(x, cos, sin):
    """Outputs of the classic RoPE mistakes, to name the one a learner made."""
    x1, x2 = x.chunk(2, dim=-1)
    half = torch.cat([-x2, x1], dim=-1)
    c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
    ev, od = x[..., 0::2], x[..., 1::2]
    interleaved = torch.stack([ev * c - od * s, od * c + ev * s], dim=-1).flatten(-2)
    return {
        "rotates the wrong way: the rotated half must be cat([-x2, x1]), not cat([x2, -x1])":
            x * cos - half * sin,
        "forgets the minus sign: the rotated half must be cat([-x2, x1]), not cat([x2, x1])":
            x * cos + torch.cat([x2, x1], dim=-1) * sin,
        "swaps cos and sin: out = x * cos + rotate_half(x) * sin":
            x * sin + half * cos,
        "rotates adjacent pairs (2i, 2i+1); this Llama layout pairs dimension i with i + D/2 "
        "(split the last dimension into two halves)":
            interleaved,
    }


def check_rope(fn) -> bool:
    """fn(x [N, heads, D], cos, sin) -> x rotated, like `models.llama.apply_rope`.

    Compares with the reference on random queries and keys at real positions from 0
    to 4095 (cos/sin from the tiny-llama `RotaryEmbedding`), and checks that the
    output keeps x's shape and dtype and that x itself is left untouched.
    """
    from .models.llama import RotaryEmbedding, apply_rope
    from .models.tiny import TINY_CONFIGS

    g = _Grader("check_rope", "apply_rope")
    cfg = TINY_CONFIGS["tiny-llama"]
    positions = torch.tensor([0, 1, 2, 3, 10, 57, 255, 1000, 1023, 1500, 2048, 4095])
    cos, sin = RotaryEmbedding(cfg)(positions)
    gen = torch.Generator().manual_seed(0)
    for heads, name in ((cfg.num_attention_heads, "queries"), (cfg.num_key_value_heads, "keys")):
        x = torch.randn(len(positions), heads, cfg.head_dim, generator=gen)
        before = x.clone()
        with g.case(f"rotating {name} of shape {list(x.shape)}"):
            out = fn(x, cos, sin)
        _expect_unchanged(before, x, "apply_rope")
        _expect_tensor(out, x.shape, "apply_rope")
        _expect(out.dtype == x.dtype, f"apply_rope should keep x's dtype {x.dtype}, returned {out.dtype}")
        expected = apply_rope(x, cos, sin)
        if torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
            continue
        for mistake, wrong in _rope_variants(x, cos, sin).items():
            if torch.allclose(out, wrong, atol=1e-5, rtol=1e-4):
                raise AssertionError(f"apply_rope {mistake}")
        _expect(torch.allclose(out[0], x[0], atol=1e-5),
                "apply_rope changed a token at position 0, where cos = 1 and sin = 0 so the rotation "
                "is the identity: out = x * cos + rotate_half(x) * sin")
        err = (out - expected).abs().amax(dim=(1, 2))
        worst = int(err.argmax())
        raise AssertionError(
            f"apply_rope differs from the reference by up to {float(err[worst]):.3g} "
            f"(worst at position {int(positions[worst])}, rotating {name}). Expected "
            "out = x * cos + rotate_half(x) * sin, where rotate_half(x) = cat([-x2, x1]) "
            "and x1, x2 are the first and second halves of the last dimension")
    return g.passed()


# ---------------------------------------------------------------- lesson 01: top-k, top-p

def _kept_mask(out: torch.Tensor, logits: torch.Tensor, what: str, label: str) -> torch.Tensor:
    """Which tokens survived a filter; every survivor must keep its logit, every other be -inf."""
    _expect_tensor(out, logits.shape, what)
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
        _expect(kept_row.all(), f"apply_top_k dropped tokens although top_k={k} keeps all {V}. Case: {label}")
        return
    kth = logits_row.sort(descending=True).values[k - 1]
    top = logits_row.topk(k).indices.sort().values.tolist()
    no_tie = int((logits_row >= kth).sum()) == k         # then the k-th itself must stay too
    must_keep = (logits_row >= kth) if no_tie else (logits_row > kth)
    missing = (~kept_row & must_keep).nonzero().flatten().tolist()
    _expect(not missing, f"apply_top_k dropped token(s) {missing} which are among the top_k={k} "
                         f"(should survive: {top}). Keep every logit >= the k-th largest. Case: {label}")
    extra = (kept_row & (logits_row < kth)).nonzero().flatten().tolist()
    _expect(not extra, f"apply_top_k kept token(s) {extra} beyond the top_k={k}: only {top} should "
                       f"survive, yours kept {kept_row.nonzero().flatten().tolist()}. Case: {label}")
    _expect(int(kept_row.sum()) >= k, f"apply_top_k kept {int(kept_row.sum())} tokens, fewer than "
                                      f"top_k={k} (ties at the k-th value count as kept). Case: {label}")


def _filter_cases(fn, what, g, cases, verdict, disabled):
    """Shared driver for top-k and top-p: 1-D rows and [B, V] batches, input never modified,
    disabled values return the logits unchanged."""
    for logits, value, label in cases:
        before = logits.clone()
        with g.case(f"filtering {label}"):
            out = fn(logits, value)
        _expect_unchanged(before, logits, what)
        if value in disabled:
            _expect(isinstance(out, torch.Tensor) and torch.equal(out, logits),
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


def check_top_k(fn) -> bool:
    """fn(logits [V] or [B, V], top_k) -> logits with all but the k largest per row set to -inf.

    Checks k = 1, 2, 4, k equal to and larger than the vocabulary, ties at the k-th
    value (keeping every tied token, or exactly k, are both accepted), a [B, V] batch
    whose rows need different cutoffs, and that 0 and -1 return the logits unchanged.
    """
    g = _Grader("check_top_k", "apply_top_k")
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
    shown = (f" on probs {_fmt(probs.float())}" if short else "")
    detail = f"only token(s) {expected} should survive, yours kept {yours}" if short else \
        f"{len(expected)} tokens should survive, yours kept {len(yours)}"

    best = int(probs.argmax())
    _expect(not (must_keep[best] and not kept_row[best]),
            f"apply_top_p dropped the most likely token {best}: the best token always survives, even "
            f"when its probability ({float(probs[best]):.2f}) is above top_p={top_p}. Case: {label}")
    missing = (must_keep & ~kept_row).nonzero().flatten().tolist()
    _expect(not missing,
            f"apply_top_p dropped token(s) {missing} that the nucleus needs: with top_p={top_p}{shown} "
            f"{detail}. Keep tokens in order of probability until the cumulative probability reaches "
            f"top_p, including the token that crosses it. Case: {label}")
    extra = (must_drop & kept_row).nonzero().flatten().tolist()
    _expect(not extra,
            f"apply_top_p kept tokens beyond the nucleus: with top_p={top_p}{shown} {detail}. "
            "Sort the probabilities (descending) before the cumulative sum, stop once it reaches "
            f"top_p, and map the mask back to the original token order. Case: {label}")
    mass = float(probs[kept_row].sum())
    _expect(mass >= top_p - _MASS_EPS,
            f"apply_top_p kept tokens holding only {mass:.3f} of the probability, less than "
            f"top_p={top_p}: {detail}. Case: {label}")


def check_top_p(fn) -> bool:
    """fn(logits [V] or [B, V], top_p) -> logits outside the nucleus set to -inf.

    Checks the token that crosses top_p is kept, tokens past it are dropped,
    unsorted logits, the best token surviving when its probability alone exceeds
    top_p, logits already -inf (after top-k), ties, a [B, V] batch whose rows need
    different cutoffs, and that top_p=1.0 returns the logits unchanged.
    """
    g = _Grader("check_top_p", "apply_top_p")

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


def _target_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution the sampler must draw from: temperature, then top-k, then top-p."""
    scaled = row / p.temperature
    return ref_sampling.apply_top_p(ref_sampling.apply_top_k(scaled, p.top_k), p.top_p).softmax(-1)


def check_sampler(fn) -> bool:
    """fn(logits [B, V], params: list[SamplingParams], generators: list[Generator | None]) -> ids [B].

    Checks greedy rows (temperature 0) return the argmax, even beside sampled rows;
    that over 2000 seeded draws every token lies in the allowed set and the
    frequencies match temperature -> top-k -> top-p -> softmax; and that a seeded row
    uses only its own generator: the same seed gives the same tokens, alone or batched
    with any other rows.
    """
    g = _Grader("check_sampler", "sample")
    gen = torch.Generator().manual_seed(0)

    # greedy rows
    logits = torch.randn(3, 50, generator=gen) * 3
    before = logits.clone()
    with g.case("sampling 3 greedy rows"):
        out = fn(logits, [SamplingParams(temperature=0)] * 3, [None] * 3)
    _expect_unchanged(before, logits, "sample")
    _expect_tensor(out, (3,), "sample", integer=True)
    _expect(torch.equal(out, logits.argmax(-1)),
            f"sample with temperature=0 must return the argmax of each row: expected "
            f"{logits.argmax(-1).tolist()}, got {out.tolist()}")
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=5),
              SamplingParams(temperature=0)]
    with g.case("sampling greedy rows beside a sampled row"):
        out = fn(logits, params, [None, torch.Generator().manual_seed(5), None])
    _expect_unchanged(before, logits, "sample")
    _expect_tensor(out, (3,), "sample", integer=True)
    _expect(out[0] == logits[0].argmax() and out[2] == logits[2].argmax(),
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
        _expect_tensor(out, (_DRAWS,), "sample", integer=True)
        _expect(bool(((out >= 0) & (out < len(row))).all()), f"sample returned token ids outside the vocabulary "
                                                            f"(0..{len(row) - 1}) with {label}")
        outside = sorted(set(out[target[out] == 0].tolist()))
        _expect(not outside, f"sample with {label} returned token(s) {outside}, which have probability 0 "
                             f"there (allowed: {(target > 0).nonzero().flatten().tolist()}): {hint}")
        freq = torch.bincount(out, minlength=len(row)).float() / _DRAWS
        gap = float((freq - target).abs().max())
        _expect(gap <= _FREQ_TOL,
                f"sample with {label} on logits {_fmt(row, 1)}: over {_DRAWS} draws the token frequencies "
                f"{_fmt(freq)} are far from the expected probabilities {_fmt(target)} (max gap {gap:.2f}): {hint}")

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
    _expect(len(set(first)) > 1, f"sample with temperature=1.0 on nearly flat logits returned the same token "
                                 f"12 times ({first[0]}): it does not seem to sample")
    _expect(first == second,
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
    _expect(batched == first,
            f"sample: a seeded row gave {first} alone but {batched} when batched with other rows (row 2 of "
            "4). Each row must draw only from its own generator, generators[i], and nothing else may "
            "advance it: not other rows, not the global RNG")
    return g.passed()


# ---------------------------------------------------------------- lesson 01: naive generation

def _run_generate(g, fn, model, tokenizer, prompt, params, label):
    """Call the learner's generate with an on_token recorder that also stops runaway loops."""
    seen = []

    def on_token(step, token_id):
        seen.append((int(step), int(token_id)))
        _expect(len(seen) <= params.max_tokens + 5,
                f"generate_naive kept going past max_tokens={params.max_tokens} ({label})")

    with g.case(f"generating with {label}"), torch.no_grad():
        out = fn(model, tokenizer, prompt, params, on_token=on_token)
    for field in ("token_ids", "finish_reason", "text"):
        _expect(hasattr(out, field), f"generate_naive should return a CompletionOutput; "
                                     f"the result has no `{field}`")
    return out, seen


def _compare_completion(model, tokenizer, prompt, ours, reference, label, greedy: bool):
    prompt_ids = tokenizer.encode(prompt)
    mine, ref = [int(t) for t in ours.token_ids], list(reference.token_ids)
    n = min(len(mine), len(ref))
    if mine[:n] != ref[:n] and not (greedy and _greedy_tie(model, prompt_ids, mine, ref)):
        i = next(j for j in range(n) if mine[j] != ref[j])
        if len(set(mine)) == 1 and len(mine) > 1:
            hint = ("every token is the same: append each new token to the sequence, so the next step "
                    "sees it")
        elif greedy:
            hint = ("each step must run the whole sequence so far (prompt + generated tokens) through "
                    "the model, with positions 0..len-1, and take the logits of the LAST position")
        else:
            hint = ("make one generator with make_generator(params) before the loop and pass it to "
                    "sample() at every step, with the logits of the last position")
        raise AssertionError(f"generate_naive ({label}) differs from the reference at token {i}: "
                             f"yours {mine}, expected {ref}; {hint}")
    if mine[:n] != ref[:n]:
        return                                 # a float-rounding tie: the rest may differ
    _expect(len(mine) == len(ref) and ours.finish_reason == reference.finish_reason,
            f"generate_naive ({label}) returned {len(mine)} tokens with finish_reason="
            f"{ours.finish_reason!r}; expected {len(ref)} tokens, finish_reason={reference.finish_reason!r}. "
            "Stop right after the token that makes len(output) == max_tokens ('length'), or after a "
            "token in stop_token_ids or EOS ('stop', that token kept as the last one)")
    _expect(ours.text == reference.text,
            f"generate_naive ({label}): text should be tokenizer.decode(token_ids) = {reference.text!r}, "
            f"got {ours.text!r}")


def check_generate_naive(fn) -> bool:
    """fn(model, tokenizer, prompt, params, on_token=None) -> CompletionOutput, like
    `naive.generate_naive`, on the tiny random Llama.

    Checks greedy tokens equal the reference's, max_tokens is respected
    (finish_reason "length"), a token in stop_token_ids ends generation ("stop"),
    seeded sampling reproduces the reference's tokens, and on_token(step, token_id)
    is called once per token.
    """
    from .naive import generate_naive

    g = _Grader("check_generate_naive", "generate_naive")
    model, tokenizer = _tiny_model()
    prompt = "The capital of France is"
    with torch.no_grad():
        ref_greedy = generate_naive(model, tokenizer, prompt, SamplingParams(temperature=0, max_tokens=6))
    stop_at = next(i for i, t in enumerate(ref_greedy.token_ids) if i >= 2 and t not in ref_greedy.token_ids[:i])
    cases = [
        (prompt, SamplingParams(temperature=0, max_tokens=6), "greedy, max_tokens=6"),
        ("Once upon a time", SamplingParams(temperature=0, max_tokens=1), "greedy, max_tokens=1"),
        (prompt, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[ref_greedy.token_ids[stop_at]]),
         f"greedy, stop_token_ids=[{ref_greedy.token_ids[stop_at]}] (the token at step {stop_at})"),
        ("List three colors:", SamplingParams(temperature=1.0, top_k=50, seed=1234, max_tokens=6),
         "temperature=1.0, top_k=50, seed=1234"),
    ]
    for text, params, label in cases:
        with torch.no_grad():
            reference = generate_naive(model, tokenizer, text, params)
        ours, seen = _run_generate(g, fn, model, tokenizer, text, params, label)
        _compare_completion(model, tokenizer, text, ours, reference, label, greedy=params.greedy)
        expected_calls = [(i, int(t)) for i, t in enumerate(ours.token_ids)]
        _expect(seen == expected_calls,
                f"generate_naive ({label}) should call on_token(step, token_id) once after each token, "
                f"steps counting from 0: expected {expected_calls}, got {seen}")
    again, _ = _run_generate(g, fn, model, tokenizer, cases[-1][0], cases[-1][1], "the same seed again")
    first, second = [int(t) for t in ours.token_ids], [int(t) for t in again.token_ids]
    _expect(first == second,
            f"generate_naive: the same seed gave {first} then {second}; "
            "make the generator from params.seed inside generate_naive (make_generator(params))")
    return g.passed()


# ---------------------------------------------------------------- lesson 02: contiguous KV cache

def _find(store: torch.Tensor, vec: torch.Tensor) -> list[tuple[int, int]]:
    """Where in a [rows, max_len, Hkv, D] store does this [Hkv, D] vector sit?"""
    hit = (store - vec).abs().amax(dim=(-2, -1)) < 1e-6
    return [tuple(int(i) for i in ix) for ix in hit.nonzero()]


def _check_writes(cache, ref, layer, step, k, v):
    """After attend: this step's k/v at (rows[b], start[b] + t) and nothing else changed."""
    rows, start, T = step
    call = f"set_step(rows={rows}, start={start}, num_tokens={T}) then attend(layer {layer})"
    for name, store, ref_store, new in (("k", cache.k[layer], ref.k[layer], k),
                                        ("v", cache.v[layer], ref.v[layer], v)):
        for b, r in enumerate(rows):
            for t in range(T):
                pos, token = start[b] + t, b * T + t
                if torch.allclose(store[r, pos], new[token], atol=1e-6):
                    continue
                found = _find(store, new[token])
                if found:
                    where = f"it sits at (row, position) {found}"
                elif name == "v":
                    where = "V was not stored at all (store v as well as k)"
                else:
                    where = "it is nowhere in the cache"
                raise AssertionError(
                    f"ContiguousKVCache: after {call}, cache.{name}[{layer}][{r}, {pos}] should hold "
                    f"{name} of token {token} of the flat batch (row rows[{b}]={r}, position start[{b}]+{t}); "
                    f"{where}. Token b*T+t of the batch belongs to row rows[b] at position start[b]+t")
        changed = ((store - ref_store).abs().amax(dim=(-2, -1)) > 1e-6).nonzero().tolist()
        _expect(not changed, f"ContiguousKVCache: {call} changed cache.{name}[{layer}] at (row, position) "
                             f"{changed[:4]}, slots this step does not write. Only rows in `rows`, at positions "
                             "start..start+num_tokens-1, may change")


def _check_attention(cache, ref, out, expected, layer, step, q):
    """The output must equal causal attention of each query over its own row, keys 0..its position."""
    from .attention.core import masked_attention

    rows, start, T = step
    call = f"set_step(rows={rows}, start={start}, num_tokens={T}) then attend(layer {layer})"
    _expect_tensor(out, q.shape, f"attend after {call}")
    if torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
        return
    B = len(rows)
    bad = ((out - expected).abs().amax(dim=(1, 2)) > 1e-5).view(B, T).nonzero()[0].tolist()
    num_keys = max(start) + T
    keys, values = ref.k[layer][rows, :num_keys], ref.v[layer][rows, :num_keys]
    everything = masked_attention(q.view(B, T, *q.shape[1:]), keys, values,
                                  torch.ones(B, T, keys.shape[1], dtype=torch.bool)).reshape(q.shape)
    hint = ("it attends to slots after the query's own position (apply the causal mask: key j is "
            "visible iff j <= the query's position)" if torch.allclose(out, everything, atol=1e-5) else
            "each query at position p must attend to its own row's keys at positions 0..p only (not to "
            "later slots, not to other rows), with this step's k/v already stored; with GQA each "
            "kv head serves num_heads / num_kv_heads query heads")
    raise AssertionError(f"ContiguousKVCache: after {call}, the attention output of row {rows[bad[0]]} at "
                         f"position {start[bad[0]] + bad[1]} differs from the reference: {hint}")


def check_contiguous_cache(cls) -> bool:
    """cls(num_layers, max_batch_size, max_len, num_kv_heads, head_dim, dtype, device), like
    `kv.contiguous.ContiguousKVCache`: for_model, set_step, attend, per-layer k/v lists of
    [max_batch_size, max_len, num_kv_heads, head_dim] tensors, and `positions` [rows, T]
    after set_step (generate_static_batch feeds it to the model).

    On a cache pre-filled with garbage: after every attend, this step's k and v sit at
    (rows[b], start[b] + t) of the right layer and no other slot changed; outputs equal
    causal attention over each row's own keys (prefill, decode, rows out of order,
    several tokens per row). Then `generate_static_batch(..., cache_cls=cls)` on
    tiny-llama with 3 prompts of different lengths gives the reference's greedy tokens.
    """
    from .kv.contiguous import ContiguousKVCache, generate_static_batch

    g = _Grader("check_contiguous_cache", "your cache class")
    L, B, M, Hkv, D, H = 2, 3, 8, 2, 4, 4
    gen = torch.Generator().manual_seed(0)
    with g.case(f"constructing cls({L}, {B}, {M}, {Hkv}, {D}, torch.float32, 'cpu')"):
        cache = cls(L, B, M, Hkv, D, torch.float32, "cpu")
    ref = ContiguousKVCache(L, B, M, Hkv, D, torch.float32, "cpu")
    for name in ("k", "v"):
        store = getattr(cache, name, None)
        _expect(store is not None and len(store) == L,
                f"the cache should keep `{name}`: a list with one tensor per layer ({L} layers)")
        for layer in range(L):
            _expect(tuple(store[layer].shape) == (B, M, Hkv, D),
                    f"cache.{name}[{layer}] should have shape [max_batch_size, max_len, num_kv_heads, "
                    f"head_dim] = {[B, M, Hkv, D]}, got {list(store[layer].shape)}")
            garbage = torch.randn(B, M, Hkv, D, generator=gen) * 10   # unwritten slots must not matter
            store[layer].copy_(garbage)
            getattr(ref, name)[layer].copy_(garbage)

    steps = [([1], [0], 3),            # prefill row 1: 3 tokens
             ([0], [0], 5),            # prefill row 0: 5 tokens
             ([0, 1], [5, 3], 1),      # decode both rows, each at its own position
             ([2, 0], [0, 6], 2),      # rows out of order, two tokens each
             ([1], [4], 1)]            # decode one row alone
    for step in steps:
        rows, start, T = step
        N = len(rows) * T
        with g.case(f"calling set_step(rows={rows}, start={start}, num_tokens={T})"):
            cache.set_step(rows, start, T)
        ref.set_step(rows, start, T)
        for layer in range(L):
            q = torch.randn(N, H, D, generator=gen)
            k, v = torch.randn(N, Hkv, D, generator=gen), torch.randn(N, Hkv, D, generator=gen)
            with g.case(f"calling attend({layer}, q, k, v) after set_step(rows={rows}, start={start}, "
                        f"num_tokens={T})"):
                out = cache.attend(layer, q.clone(), k.clone(), v.clone())
            expected = ref.attend(layer, q, k, v)
            _check_writes(cache, ref, layer, step, k, v)
            _check_attention(cache, ref, out, expected, layer, step, q)

    model, tokenizer = _tiny_model()
    prompts = ["Hi", "The capital of France is", "Once upon a time, in a small village by the sea, there lived"]
    params = SamplingParams(temperature=0, max_tokens=5)
    with g.case("running generate_static_batch(model, tokenizer, 3 prompts, cache_cls=cls)"):
        ours, _ = generate_static_batch(model, tokenizer, prompts, params, cache_cls=cls)
    reference, _ = generate_static_batch(model, tokenizer, prompts, params)
    for prompt, a, b in zip(prompts, ours, reference):
        if a.token_ids != b.token_ids and not _greedy_tie(model, tokenizer.encode(prompt), a.token_ids, b.token_ids):
            raise AssertionError(f"generate_static_batch with your cache gives {a.token_ids} for {prompt!r}, "
                                 f"the reference cache {b.token_ids}: the unit cases pass, so look at "
                                 "for_model (sizes from model.config) and at set_step's positions")
    return g.passed()


from .checks_paged import *  # noqa: F401,F403
