"""Tests of the graders of lesson 12 (minillm.checks.lesson12_masks, lesson12_choice).

The references pass each one, and planted mistakes — the ones learners actually make — are
rejected with a hint that names the problem. Addressable per lesson task:
`pytest -k check_structured_outputs`, `pytest -k check_choice_constraint`.
"""
import weakref

import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.structured.choice_trie import END, ChoiceConstraint
from minillm.structured.matchers import StructuredOutputs, apply_masks


# ---------------------------------------------------------------- exercise 1: the step's two moves

def _bits(bitmasks, vocab, reverse=False):
    order = torch.arange(31, -1, -1, dtype=torch.int32) if reverse else torch.arange(32, dtype=torch.int32)
    return ((torch.stack(bitmasks)[:, :, None] >> order) & 1).bool().flatten(1)[:, :vocab]


class AsTheNotebook(StructuredOutputs):
    """The notebook's answer: the loop of mask_logits over the rows, the package's apply_masks."""
    def mask_logits(self, rows, grammars, on_error):
        which, masks = [], []
        for i, grammar in enumerate(grammars):
            if grammar is not None:
                try:
                    masks.append(grammar.allowed())
                    which.append(i)
                except Exception as e:
                    on_error(i, e)
        apply_masks(rows, masks, which)

    def advance(self, grammar, token):
        return grammar.advance(token)


class MaskOnACopy(AsTheNotebook):
    """rows[which] with a list is a copy: masked, never written back."""
    def mask_logits(self, rows, grammars, on_error):
        which = [i for i, g in enumerate(grammars) if g is not None]
        if which:
            sub = rows[which]
            sub.masked_fill_(~_bits([grammars[i].allowed() for i in which], rows.shape[1]), float("-inf"))


class MaskAfterSampling(AsTheNotebook):
    """Nothing before sampling; the token is only checked against the mask afterwards."""
    def mask_logits(self, rows, grammars, on_error):
        self.last = [g.allowed() if g is not None else None for g in grammars]


class StaleMask(AsTheNotebook):
    """Each matcher's first mask is kept and applied at every step: the matcher moves on, the mask does not."""
    def __init__(self, tokenizer, vocab_size):
        super().__init__(tokenizer, vocab_size)
        self.seen = weakref.WeakKeyDictionary()

    def mask_logits(self, rows, grammars, on_error):
        which, masks = [], []
        for i, grammar in enumerate(grammars):
            if grammar is not None:
                try:
                    if grammar not in self.seen:
                        self.seen[grammar] = grammar.allowed()
                    masks.append(self.seen[grammar])
                    which.append(i)
                except Exception as e:
                    on_error(i, e)
        apply_masks(rows, masks, which)


class ZeroRowForUnconstrained(AsTheNotebook):
    """One batched mask with an all-zero bitmask row for the requests without a grammar."""
    def mask_logits(self, rows, grammars, on_error):
        words = (rows.shape[1] + 31) // 32
        masks = [g.allowed() if g is not None else torch.zeros(words, dtype=torch.int32) for g in grammars]
        apply_masks(rows, masks, list(range(len(grammars))))


class ReversedBits(AsTheNotebook):
    def mask_logits(self, rows, grammars, on_error):
        which = [i for i, g in enumerate(grammars) if g is not None]
        if which:
            rows[which] = rows[which].masked_fill(~_bits([grammars[i].allowed() for i in which], rows.shape[1],
                                                         reverse=True), float("-inf"))


class FiniteMask(AsTheNotebook):
    def mask_logits(self, rows, grammars, on_error):
        which = [i for i, g in enumerate(grammars) if g is not None]
        if which:
            rows[which] = rows[which].masked_fill(~_bits([grammars[i].allowed() for i in which], rows.shape[1]), -1e4)


class NoOnError(AsTheNotebook):
    def mask_logits(self, rows, grammars, on_error):
        which = [i for i, g in enumerate(grammars) if g is not None]
        apply_masks(rows, [grammars[i].allowed() for i in which], which)


class StacksNothing(AsTheNotebook):
    """No early return: torch.stack([]) raises when every matcher failed."""
    def mask_logits(self, rows, grammars, on_error):
        which, masks = [], []
        for i, grammar in enumerate(grammars):
            if grammar is not None:
                try:
                    masks.append(grammar.allowed())
                    which.append(i)
                except Exception as e:
                    on_error(i, e)
        bitmask = torch.stack(masks)
        rows[which] = rows[which].masked_fill(~_bits(list(bitmask), rows.shape[1]), float("-inf"))


class NotAdvanced(AsTheNotebook):
    def advance(self, grammar, token):
        return None


class AdvancesWithoutReturning(AsTheNotebook):
    def advance(self, grammar, token):
        grammar.advance(token)


class Stub(StructuredOutputs):
    def mask_logits(self, rows, grammars, on_error):
        raise NotImplementedError("YOUR CODE HERE")


def test_check_structured_outputs_accepts_the_reference():
    assert checks.check_structured_outputs(StructuredOutputs)
    assert checks.check_structured_outputs(AsTheNotebook)


@pytest.mark.parametrize("bad, match", [
    (MaskOnACopy, r"left row 0 unmasked.*is a copy"),
    (MaskAfterSampling, r"left row 0 unmasked.*after sampling"),
    (StaleMask, r"the engine sampled a token its grammar forbids|breaks its grammar"),
    (ZeroRowForUnconstrained, r"became all -inf.*zero row"),
    (ReversedBits, r"bit order is reversed"),
    (FiniteMask, r"float\('-inf'\)"),
    (NoOnError, r"let a failing matcher's exception out"),
    (StacksNothing, r"torch.stack\(\[\]\) raises"),
    (NotAdvanced, r"not advanced on the sampled token"),
    (AdvancesWithoutReturning, r"return what grammar.advance\(token\) returns"),
    (Stub, r"not implemented yet"),
    (ChoiceConstraint, r"a subclass of StructuredOutputs"),
], ids=["mask-on-a-copy", "mask-after-sampling", "stale-mask", "zero-row-unconstrained", "reversed-bits",
        "finite-mask", "no-on-error", "stacks-nothing", "not-advanced", "advance-no-return", "stub", "not-a-subclass"])
def test_check_structured_outputs_rejects(bad, match):
    rejects(checks.check_structured_outputs, bad, match)


# ---------------------------------------------------------------- exercise 2: a choice trie by hand

class CanonicalOnly(ChoiceConstraint):
    """A trie of the choices' own tokenizations: "green" may only be spelled as the tokenizer spells it."""
    def __init__(self, choices, tokenizer):
        super().__init__(choices, tokenizer)
        self.paths = [tokenizer.hf.encode(c, add_special_tokens=False) for c in choices]

    def allowed(self, generated):
        k = len(generated)
        out = {p[k] for p in self.paths if p[:k] == list(generated) and len(p) > k}
        return out | ({self.eos_token_id} if list(generated) in self.paths else set())


class NoEos(ChoiceConstraint):
    def allowed(self, generated):
        return super().allowed(generated) - {self.eos_token_id}


class StopsAtTheFirstEnd(ChoiceConstraint):
    """A node that ends a choice allows only EOS: "yes please" can never be written."""
    def allowed(self, generated):
        return {self.eos_token_id} if self.is_complete(generated) else super().allowed(generated)


class DecodedStrings(ChoiceConstraint):
    """Works on decoded text: a token holding part of a character decodes to U+FFFD."""
    def __init__(self, choices, tokenizer):
        super().__init__(choices, tokenizer)
        self.choices, self.tok = choices, tokenizer
        self.texts = [tokenizer.decode([t]) if data is not None else None for t, data in enumerate(self.vocab)]

    def allowed(self, generated):
        text = self.tok.decode(list(generated))
        out = {self.eos_token_id} if text in self.choices else set()
        return out | {t for t, piece in enumerate(self.texts)
                      if piece and any(c.startswith(text + piece) for c in self.choices)}


class FirstByteOnly(ChoiceConstraint):
    """Checks a token's first byte only: "reddish" fits after nothing because "r" does."""
    def allowed(self, generated):
        node = self.walk(self.root, b"".join(self.vocab[t] for t in generated))
        if node is None:
            return set()
        out = {self.eos_token_id} if END in node else set()
        for byte in node:
            if byte != END:
                out.update(self.starting_with.get(byte, ()))
        return out


class CompleteOnAnyPrefix(ChoiceConstraint):
    def is_complete(self, generated):
        return self.walk(self.root, b"".join(self.vocab[t] for t in generated)) is not None


class AllowsSpecialTokens(ChoiceConstraint):
    def allowed(self, generated):
        specials = {t for t, data in enumerate(self.vocab) if data is None}
        return super().allowed(generated) | (specials - {self.eos_token_id})


class ChoiceStub:
    def __init__(self, choices, tokenizer):
        raise NotImplementedError("YOUR CODE HERE")


def test_check_choice_constraint_accepts_the_reference():
    assert checks.check_choice_constraint(ChoiceConstraint)


@pytest.mark.parametrize("bad, match", [
    (CanonicalOnly, r"only the first tokens of the choices' own tokenizations"),
    (NoEos, r"missing completion"),
    (StopsAtTheFirstEnd, r"A trie node can end a choice and have children"),
    (DecodedStrings, r"work in bytes, not decoded strings"),
    (FirstByteOnly, r"tokens that do not fit are allowed"),
    (CompleteOnAnyPrefix, r"is_complete\(\) is True, expected False"),
    (AllowsSpecialTokens, r"special tokens are allowed"),
    (ChoiceStub, r"not implemented yet"),
], ids=["canonical-only", "no-eos", "stops-at-first-end", "decoded-strings", "first-byte-only",
        "complete-on-prefix", "special-tokens", "stub"])
def test_check_choice_constraint_rejects(bad, match):
    rejects(checks.check_choice_constraint, bad, match)
