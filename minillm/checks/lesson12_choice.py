"""Lesson 12's choice grader, `check_choice_constraint`: the learner's hand-written trie for a
`choice` list, held token for token to llguidance's masks for the package's grammar of
`StructuredOutputsParams(choice=...)`, on the real SmolLM2 tokenizer. The grammar is compared with
llguidance's forcing turned off (`%llguidance {"no_forcing": true}`): by default, where the rest of
the text is forced, llguidance allows only the first token of its canonical tokenization, a
refinement the lesson shows but does not ask for; everywhere else the two masks are the same.

Planted cases: choices sharing a prefix ("green", "grey"), a choice that is a prefix of another
("yes", "yes please"), choices of several tokens, and non-ASCII choices (2-, 3- and 4-byte UTF-8
characters). Each is walked along the choices' own tokenizations and along spellings one byte
per token (a byte-level BPE can spell any text so, and the grammar allows it), and at every
prefix the set `allowed(generated)` must equal the grammar's mask and `is_complete(generated)`
its accepting state. A wrong trie rarely crashes: it forgets a spelling, lets a token run past a
choice's end, or never lets the answer end.
"""
from __future__ import annotations

import functools

import torch

from .harness import Grader, expect, grader, tiny_model

NO_FORCING = '%llguidance {"no_forcing": true}\n'      # the grammar's own mask, no canonical-token forcing

CASES = [
    ("choices sharing a prefix", ["red", "green", "grey"]),
    ("a choice that is a prefix of another", ["yes", "yes please", "no"]),
    ("choices of several tokens", ["light blue", "dark chocolate brown", "ultramarine"]),
    ("non-ASCII choices", ["café", "naïve", "日本語", "🙂 ok"]),
]


@functools.lru_cache(maxsize=None)
def _grammar_side():
    """(tokenizer, StructuredOutputs, token bytes, byte -> its one-byte token) for the course tokenizer."""
    from ..structured.choice_trie import token_bytes
    from ..structured.matchers import StructuredOutputs
    model, tok = tiny_model()
    vocab = token_bytes(tok)
    single = {data[0]: t for t, data in enumerate(vocab) if data is not None and len(data) == 1}
    return tok, StructuredOutputs(tok, model.config.vocab_size), vocab, single


@functools.lru_cache(maxsize=None)
def _expected(choices: tuple[str, ...]) -> dict[tuple, tuple[set[int], bool]]:
    """Prefix (token ids) -> (llguidance's allowed tokens, whether it accepts), along each choice's
    own tokenization and its spelling one byte per token."""
    from llguidance import LLMatcher

    from ..structured import StructuredOutputsParams
    from ..structured.grammar import grammar_text
    from ..structured.matchers import SequenceGrammar
    tok, structured, vocab, single = _grammar_side()
    grammar = NO_FORCING + grammar_text(StructuredOutputsParams(choice=list(choices)))
    paths = [tok.hf.encode(c, add_special_tokens=False) for c in choices]
    paths += [[single[b] for b in c.encode("utf-8")] for c in choices if all(b in single for b in c.encode("utf-8"))]
    out = {}
    for path in paths:
        matcher = SequenceGrammar(LLMatcher(structured.cache.ll_tokenizer, grammar), structured.vocab_size)
        for k in range(len(path) + 1):
            if tuple(path[:k]) not in out:
                words = matcher.allowed()                  # bit t % 32 of word t // 32: token t
                bits = (words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
                out[tuple(path[:k])] = (set(bits.flatten().nonzero().flatten().tolist()),
                                        matcher.matcher.is_accepting())
            if k < len(path):
                matcher.advance(path[k])
    return out


def _text(vocab, ids) -> str:
    return repr(b"".join(vocab[t] or b"" for t in ids).decode("utf-8", errors="backslashreplace"))


def _show(vocab, tokens, eos, limit=4) -> str:
    shown = [("EOS" if t == eos else f"{t} (special)" if vocab[t] is None else f"{t} {_text(vocab, [t])}")
             for t in sorted(tokens)[:limit]]
    return ", ".join(shown) + (f", ... ({len(tokens)} in all)" if len(tokens) > limit else "")


def _as_set(got, what: str) -> set[int]:
    expect(isinstance(got, (set, frozenset, list, tuple)),
           f"{what} returned {type(got).__name__}: return a set of token ids (ints)")
    try:
        return {int(t) for t in got}
    except (TypeError, ValueError):
        raise AssertionError(f"{what} returned {list(got)[:4]}...: return a set of token ids (ints)") from None


def _diagnose(label, choices, prefix, got, want, vocab, eos, canonical_firsts) -> str:
    """Name the mistake behind a set that differs from the grammar's mask."""
    where = f"{label} {choices}: after {_text(vocab, prefix)} (tokens {list(prefix)})"
    missing, extra = want - got, got - want
    if eos in want and (want - {eos}) - got:
        return (f"{where} the text is a whole choice that another choice continues: allow EOS (it may end here) "
                f"*and* the tokens that continue the longer choice. A trie node can end a choice and have children; "
                f"missing: {_show(vocab, missing, eos)}")
    if eos in missing:
        return (f"{where} the text is a whole choice, so EOS (token {eos}) must be allowed: missing completion. "
                "Mark the node where each choice ends, and allow EOS there")
    if eos in extra:
        return f"{where} EOS is allowed, but the text is not one of the choices: only a node that ends a choice allows EOS"
    specials = {t for t in extra if vocab[t] is None}
    if specials:
        return (f"{where} special tokens are allowed ({_show(vocab, specials, eos)}): they spell no text and never "
                "fit a choice (their token_bytes are None)")
    if any(ord(c) > 127 for c in "".join(choices)) and (missing or extra):
        return (f"{where} your set differs from the grammar's mask on non-ASCII text: work in bytes, not decoded "
                "strings. 'é' is 2 bytes in UTF-8 and a token may hold just one of them (decoding it alone gives "
                f"U+FFFD). Missing: {_show(vocab, missing, eos) or 'none'}; extra: {_show(vocab, extra, eos) or 'none'}")
    if not prefix and got and got <= canonical_firsts:
        return (f"{where} you allow only the first tokens of the choices' own tokenizations ({_show(vocab, got, eos)}), "
                f"but any token whose bytes start a choice may come: the model may spell 'green' as 'g' + 'reen'. "
                f"Missing: {_show(vocab, missing, eos)}")
    if missing:
        return (f"{where} tokens whose bytes continue a choice are missing: {_show(vocab, missing, eos)}. A token "
                "fits when its bytes, read from the node the text reached, stay inside the trie (a different "
                "spelling of the same text counts)")
    return (f"{where} tokens that do not fit are allowed: {_show(vocab, extra, eos)}. With them the text would "
            "no longer start any choice: every byte of the token must follow the trie (a token may not run past "
            "a choice's end, nor match on its first byte only)")


@grader
def check_choice_constraint(cls) -> bool:
    """cls(choices, tokenizer) with allowed(generated) -> set of token ids and is_complete(generated)
    -> bool, like `minillm.structured.choice_trie.ChoiceConstraint`: at every prefix of the planted
    walks, the same tokens as llguidance's mask for StructuredOutputsParams(choice=choices), EOS
    included where the text is a whole choice, and is_complete where the grammar accepts."""
    g = Grader("check_choice_constraint", "your ChoiceConstraint")
    tok, _, vocab, _ = _grammar_side()
    eos = tok.hf.eos_token_id
    for label, choices in CASES:
        with g.case(f"constructing cls({choices}, tokenizer)"):
            constraint = cls(list(choices), tok)
        canonical_firsts = {tok.hf.encode(c, add_special_tokens=False)[0] for c in choices}
        for prefix, (want, accepting) in _expected(tuple(choices)).items():
            with g.case(f"calling allowed({list(prefix)}) for {choices} (after {_text(vocab, prefix)})"):
                got = _as_set(constraint.allowed(list(prefix)), "allowed()")
            if got != want:
                raise AssertionError(_diagnose(label, choices, prefix, got, want, vocab, eos, canonical_firsts))
            with g.case(f"calling is_complete({list(prefix)}) for {choices}"):
                complete = constraint.is_complete(list(prefix))
            expect(isinstance(complete, bool) or type(complete).__name__ == "bool_",
                   f"is_complete() returned {complete!r}: return True or False")
            expect(bool(complete) == accepting,
                   f"{label} {choices}: after {_text(vocab, prefix)} is_complete() is {complete}, expected "
                   f"{accepting}: it is True exactly when the text so far is one of the choices"
                   + (" (a choice that another continues is complete too)" if accepting else ""))
    return g.passed()
