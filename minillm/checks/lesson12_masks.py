"""Lesson 12's mask grader, `check_structured_outputs`: the learner's `StructuredOutputs`
subclass (the step's two moves: `mask_logits` before sampling, `advance` after), first on rows
of a small vocabulary with stand-in matchers whose bitmasks are known (the bit order, the sign
bit, the padding bits past the vocabulary, unconstrained rows, a matcher that fails), then with
real llguidance matchers (advance), then plugged into the engine on the tiny random Llama beside
unconstrained requests, whose tokens must stay exactly those of a run without any grammar.

The mistakes it names: a mask that never reaches the logits that are sampled (applied to a copy,
or after sampling: the engine's tokens then break the grammar), a zero row that blocks every
token of an unconstrained request, a matcher not advanced on the sampled token.
"""
from __future__ import annotations

import json
import re

import torch

from .harness import Grader, expect, grader, tiny_model

V = 70                                          # the stand-in vocabulary: 3 words of 32 bits, 26 past the end
ROW0 = {0, 5, 31, 32, 69}                       # token 31 is bit 31 of word 0, the int32's sign bit
ROW2 = {1, 2, 63, 64}
NOT_BEFORE_SAMPLING = ("The mask must change `rows` itself, in place, inside mask_logits: the engine samples from "
                       "those rows right after it returns. A mask applied after sampling, or to a copy (`rows[which]` "
                       "with a list of rows is a copy: write it back with `rows[which] = ...`), comes too late")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "yy"]}},
          "required": ["a", "b"], "additionalProperties": False}
REGEX = r"(yes|no), [a-z]{2,5}\."
CHOICES = ["red", "green", "light blue"]


def _words(allowed: set[int], n_words: int, padding: bool = True) -> torch.Tensor:
    """An int32 bitmask row: bit t % 32 of word t // 32 is token t (and, as a trap, the bits past V)."""
    words = []
    for w in range(n_words):
        value = sum(1 << b for b in range(32) if (32 * w + b) in allowed or (padding and 32 * w + b >= V))
        words.append(value - (1 << 32) if value >= 1 << 31 else value)
    return torch.tensor(words, dtype=torch.int32)


class _Stand:
    """A matcher stand-in: a fixed bitmask, or an error."""

    def __init__(self, allowed=None, error=None):
        self.allowed_ids, self.error = allowed, error

    def allowed(self) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        return _words(self.allowed_ids, (V + 31) // 32)


def _expect_untouched(before, after, i, what) -> None:
    if torch.equal(before, after):
        return
    expect(not bool(torch.isinf(after).all()),
           f"row {i} ({what}) became all -inf: every token blocked. A zero row blocks everything; an unconstrained "
           "row (grammars[i] is None) must be left exactly as it is, not given an all-zero bitmask")
    raise AssertionError(f"row {i} ({what}) was changed by mask_logits: it must be left exactly as it is")


def _expect_masked(before, after, i, allowed: set[int]) -> None:
    if torch.equal(before, after):
        raise AssertionError(f"mask_logits left row {i} unmasked: tokens its grammar forbids keep their logits, so the "
                             f"engine samples them and its tokens break the grammar. {NOT_BEFORE_SAMPLING}")
    keep = torch.tensor([t in allowed for t in range(V)])
    blocked = [t for t in sorted(allowed) if after[t] != before[t]]
    if blocked:
        reversed_bits = {32 * (t // 32) + 31 - t % 32 for t in allowed}
        if all(not torch.isinf(after[t]) for t in reversed_bits if t < V):
            raise AssertionError(f"row {i}: the allowed tokens {sorted(allowed)} were blocked, and their bit-mirrored "
                                 "tokens kept: the bit order is reversed. Token t is bit t % 32 of word t // 32, "
                                 "counted from the lowest bit: (word >> (t % 32)) & 1")
        t = blocked[0]
        raise AssertionError(f"row {i}: token {t} is allowed (bit {t % 32} of word {t // 32} is 1) but its logit became "
                             f"{float(after[t])}" + (" (bit 31 is the int32's sign bit: a word with it set is negative; "
                                                     "(word >> 31) & 1 still reads it as 1)" if t % 32 == 31 else "")
                             + ": allowed tokens keep their logits unchanged")
    loose = after[~keep]
    if not bool(torch.isinf(loose).all()):
        t = int((~keep & ~torch.isinf(after)).nonzero()[0])
        if bool(after[t] == before[t]):
            raise AssertionError(f"row {i}: token {t} is forbidden (its bit is 0) but keeps its logit: "
                                 f"{NOT_BEFORE_SAMPLING}")
        raise AssertionError(f"row {i}: forbidden token {t} got {float(after[t])}: set forbidden logits to "
                             "float('-inf'), whose probability is exactly 0 whatever the temperature or penalties")
    expect(bool((loose < 0).all()), f"row {i}: forbidden tokens got +inf: use float('-inf')")


def _rows(seed: int, n: int) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed))


def _unit_cases(g, so) -> None:
    before = _rows(0, 4)
    rows, errors = before.clone(), []
    with g.case(f"calling mask_logits on 4 rows of a {V}-token vocabulary, rows 0 and 2 constrained (each bitmask "
                f"row has {(V + 31) // 32} words = 96 bits: the last {96 - V} bits lie past the vocabulary)"):
        so.mask_logits(rows, [_Stand(ROW0), None, _Stand(ROW2), None], lambda i, e: errors.append((i, e)))
    expect(tuple(rows.shape) == (4, V), f"mask_logits changed the rows' shape to {list(rows.shape)}: mask in place")
    for i in (1, 3):
        _expect_untouched(before[i], rows[i], i, "an unconstrained request")
    _expect_masked(before[0], rows[0], 0, ROW0)
    _expect_masked(before[2], rows[2], 2, ROW2)
    expect(not errors, f"on_error was called ({errors[0][1]!r} for row {errors[0][0]}) although no matcher failed"
           if errors else "")

    planted = ValueError("planted: this matcher failed")
    before = _rows(1, 3)
    rows, errors = before.clone(), []
    try:
        so.mask_logits(rows, [_Stand(ROW0), _Stand(error=planted), None], lambda i, e: errors.append((i, e)))
    except ValueError as e:
        if e is not planted:
            raise AssertionError(f"mask_logits raised {e!r} when grammars[1].allowed() failed") from e
        raise AssertionError("mask_logits let a failing matcher's exception out (grammars[1].allowed() raised): catch "
                             "it, call on_error(i, e) (the engine ends that request alone) and go on with the other "
                             "rows") from None
    g.cases += 1
    expect([(i, e is planted) for i, e in errors] == [(1, True)],
           f"when grammars[1].allowed() raised, on_error got {[(i, repr(e)) for i, e in errors]}: call "
           "on_error(i, e) once, with the row's index and the exception")
    _expect_masked(before[0], rows[0], 0, ROW0)
    _expect_untouched(before[1], rows[1], 1, "a request whose matcher failed")
    _expect_untouched(before[2], rows[2], 2, "an unconstrained request")
    rows = before[:2].clone()
    with g.case("calling mask_logits where the only constrained row's matcher fails (nothing is left to mask: "
                "torch.stack([]) raises, so do nothing when no row remains)"):
        so.mask_logits(rows, [_Stand(error=planted), None], lambda i, e: None)
    _expect_untouched(before[0], rows[0], 0, "a request whose matcher failed")


def _advance_cases(g, so, tok, vocab_size) -> None:
    from ..structured import StructuredOutputsParams
    from ..structured.matchers import StructuredOutputs
    spec = StructuredOutputsParams(choice=CHOICES)
    path = tok.hf.encode("light blue", add_special_tokens=False)
    with g.case("creating a matcher for choice=['red', 'green', 'light blue'] with cls.matcher (inherited)"):
        yours = so.matcher(spec)
    reference = StructuredOutputs(tok, vocab_size).matcher(spec)
    for k, token in enumerate(path):
        before = reference.allowed()
        with g.case(f"calling advance(grammar, {token}) on token {k} of 'light blue' {path}"):
            got = so.advance(yours, token)
        want = reference.advance(token)
        if want is None:
            now = yours.allowed()
            expect(not torch.equal(now, before),
                   f"after advance(grammar, {token}) the matcher still allows what it allowed before: it was not "
                   "advanced on the sampled token. Call grammar.advance(token), so that the next mask follows it")
            expect(torch.equal(now, reference.allowed()),
                   f"after advance(grammar, {token}) the matcher's mask is not the one after {token}: advance it on "
                   "the sampled token itself (the `token` argument), once")
        expect(got == want, f"advance(grammar, {token}) returned {got!r} for token {k} of {path}, expected {want!r}: "
                            "return what grammar.advance(token) returns ('stop' once the grammar is complete ends "
                            "the request, None otherwise)")


def _run(engine, prompts, params, max_steps=300):
    ids = [f"check-{i}" for i in range(len(prompts))]
    for request_id, prompt, p in zip(ids, prompts, params):
        engine.add_request(request_id, prompt, p)
    final = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    expect(not engine.has_unfinished_requests(), f"the engine did not finish {len(prompts)} requests in {max_steps} "
                                                 "steps")
    return [(final[i].outputs[0], final[i].error or "") for i in ids]


def _valid(kind, text) -> bool:
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "choice":
        return text in CHOICES
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"a", "b"} and type(value["a"]) is int
            and 0 <= value["a"] <= 99 and value["b"] in ("x", "yy"))


def _engine_case(g, cls) -> None:
    from ..engine.engine import LLMEngine
    from ..sampling_params import SamplingParams
    model, tok = tiny_model()
    plain = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
             SamplingParams(temperature=0.9, seed=7, max_tokens=10, ignore_eos=True)]
    specs = [("regex", {"regex": REGEX}), ("choice", {"choice": CHOICES}), ("json", {"json": SCHEMA})]
    constrained = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=s)
                   for i, (_, s) in enumerate(specs)]
    prompts = ["The capital of France is", "List three colors:", "Answer:", "Here is the record:", "Colour:"]
    options = dict(num_kv_blocks=128, max_model_len=256, max_num_seqs=8)
    alone = _run(LLMEngine(model, tok, **options), prompts[:2], plain)
    with g.case("running LLMEngine(structured_outputs_cls=cls) on 2 unconstrained and 3 constrained requests"):
        engine = LLMEngine(model, tok, structured_outputs_cls=cls, **options)
        outs = _run(engine, [prompts[0], prompts[2], prompts[1], prompts[3], prompts[4]],
                    [plain[0], constrained[0], plain[1], constrained[1], constrained[2]])
    mixed = [outs[0][0], outs[2][0]]
    for (kind, spec), (o, error) in zip(specs, [outs[1], outs[3], outs[4]]):
        if o.finish_reason == "error" and "not allowed by the grammar" in error:
            raise AssertionError(f"in the engine, the request with {spec} failed: the engine sampled a token its grammar "
                                 f"forbids, so the right mask did not reach the sampled logits. {NOT_BEFORE_SAMPLING}; "
                                 "and a mask kept from an earlier step is stale: ask grammar.allowed() at every step")
        expect(o.finish_reason != "error", f"in the engine, the request with {spec} failed: {error}")
        expect(_valid(kind, o.text), f"in the engine, the request with {spec} gave {o.text!r}, which breaks its grammar: "
                                     f"the engine's tokens violate the mask. {NOT_BEFORE_SAMPLING}; and the matcher must "
                                     "advance on every sampled token")
        expect(o.finish_reason == "stop", f"in the engine, the request with {spec} gave {o.text!r} and ran to "
                                          f"max_tokens ({o.finish_reason}) although its grammar was complete: advance "
                                          "must return grammar.advance(token)'s 'stop'")
    for o, (a, _), p in zip(mixed, alone, plain):
        expect(o.finish_reason != "error", "in the engine, an unconstrained request beside constrained ones failed: "
                                           "an unconstrained row must be left alone (an all-zero bitmask row blocks "
                                           "every token)")
        expect(list(o.token_ids) == list(a.token_ids),
               f"in the engine, an unconstrained request ({'greedy' if p.temperature == 0 else 'sampled'}) beside "
               f"constrained ones generated {list(o.token_ids)}, but {list(a.token_ids)} alone: rows whose grammar is "
               "None must be left exactly as they are (no zero row, no mask of a neighbour)")


@grader
def check_structured_outputs(cls) -> bool:
    """cls: a subclass of `minillm.structured.matchers.StructuredOutputs` overriding
    mask_logits(rows, grammars, on_error) (in place: each constrained row keeps only the tokens
    its bitmask allows, -inf elsewhere; None rows untouched; a failing matcher goes to on_error)
    and advance(grammar, token) (the matcher consumes the sampled token; "stop" once complete).
    Stand-in matchers on a 70-token vocabulary, real llguidance matchers, then the engine on the
    tiny random Llama: constrained outputs follow their grammar and end with "stop",
    unconstrained neighbours keep their exact tokens."""
    from ..structured.matchers import StructuredOutputs
    g = Grader("check_structured_outputs", "your StructuredOutputs subclass")
    expect(isinstance(cls, type) and issubclass(cls, StructuredOutputs),
           f"check_structured_outputs takes your class (a subclass of StructuredOutputs, which gives the constructor "
           f"and matcher()), got {cls!r}")
    model, tok = tiny_model()
    with g.case("constructing cls(tokenizer, vocab_size), as the engine does"):
        so = cls(tok, model.config.vocab_size)
    _unit_cases(g, so)
    _advance_cases(g, so, tok, model.config.vocab_size)
    _engine_case(g, cls)
    g.cases += 1
    return g.passed()
