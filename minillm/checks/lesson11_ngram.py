"""Lesson 11's proposer grader, `check_ngram_proposer`: the learner's n-gram (prompt lookup)
proposer `propose_ngram(tokens, k, min_n, max_n)`, on planted cases that each isolate one rule,
then on random short sequences over a 4-token alphabet (repeats everywhere) against the package's
`minillm.spec.ngram.propose_ngram`.

The rules, each with its planted case: the longest n-gram is tried first (n from max_n down to
min_n), the most recent earlier occurrence wins, the suffix never matches itself (it sits at
len - n with nothing after it), an earlier occurrence may overlap the suffix, at most k tokens,
[] when nothing recurs, min_n and max_n bound n, and a sequence too short for any n gives [].
A wrong proposer never crashes the engine (a bad draft is only rejected), it just drafts worse,
so each planted case names the rule it broke.
"""
from __future__ import annotations

import random

from .harness import Grader, expect, grader

# (the rule, tokens, k, min_n, max_n, expected, the hint when the answer differs), in an order where each
# case fails only for its own rule (a suffix matching itself fails every case with min_n < max_n too)
CASES = [
    ("never the suffix itself", [1, 2, 3, 1, 2], 3, 2, 2, [3, 1, 2],
     "the last n tokens always match themselves, at position len - n, where nothing follows them (so that "
     "'match' proposes []). Start the search at len - n - 1"),
    ("the most recent match", [1, 2, 8, 1, 2, 9, 1, 2], 2, 2, 2, [9, 1],
     "[1, 2] occurs at positions 0 and 3: the latest one wins (the text's most recent pattern is the better "
     "guess). Search start positions from len - n - 1 down to 0 and stop at the first match"),
    ("an earlier occurrence may overlap the suffix", [7, 7, 7, 7], 3, 2, 2, [7],
     "the suffix [7, 7] (positions 2-3) occurs at position 1, overlapping it; what followed there is [7] "
     "(up to the end of the sequence). An earlier occurrence is any start before len - n"),
    ("the longest n-gram first", [1, 2, 3, 9, 5, 3, 7, 1, 2, 3], 4, 1, 3, [9, 5, 3, 7],
     "the last 3 tokens [1, 2, 3] occur earlier (at position 0), and so does the last one, [3] (at 5): a longer "
     "match predicts better. Try n from max_n down to min_n and propose from the first n that matches"),
    ("at most k tokens", [1, 2, 3, 4, 5, 6, 1], 3, 1, 2, [2, 3, 4],
     "propose at most k tokens: tokens[start + n:start + n + k]"),
    ("what followed, up to the end", [5, 6, 5], 4, 1, 1, [6, 5],
     "[5] occurs at position 0; what followed it is [6, 5], fewer than k: propose those (no padding, no "
     "wrap-around)"),
    ("nothing recurs", [1, 2, 3, 4], 3, 1, 3, [],
     "no n-gram of the end occurs earlier: propose nothing ([]), and the engine runs the step without drafts"),
    ("min_n respected", [5, 1, 2, 9, 3, 5], 3, 2, 3, [],
     "only the 1-gram [5] recurs, but min_n=2: a one-token match is too weak to propose from here. n stops at "
     "min_n"),
    ("max_n respected", [1, 2, 3, 4, 8, 9, 2, 3, 4, 7, 1, 2, 3, 4], 2, 1, 3, [7, 1],
     "max_n=3: the longest n-gram tried is 3 tokens, [2, 3, 4] (latest earlier at position 6), even though "
     "the 4-gram [1, 2, 3, 4] also recurs"),
    ("a one-token sequence", [3], 2, 1, 3, [],
     "a single token has nothing before it to match: []. n can be at most len(tokens) - 1"),
    ("an empty sequence", [], 2, 1, 3, [], "no tokens, no proposal: []"),
]


def _as_tokens(got, call: str) -> list[int]:
    expect(isinstance(got, (list, tuple)),
           f"{call} returned {type(got).__name__}: return a list of token ids\n    Hint: slice the list, "
           "tokens[start + n:start + n + k]")
    try:
        out = [int(t) for t in got]
    except (TypeError, ValueError):
        raise AssertionError(f"{call} returned {list(got)[:4]}: return a list of token ids (ints)") from None
    return out


def _too_long(got: list[int], want: list[int], k: int) -> str | None:
    """The hint for a proposal longer than it may be, whatever the case was about."""
    if len(got) > k:
        return f"you proposed {len(got)} tokens, k is {k}: propose at most k tokens, tokens[start + n:start + n + k]"
    if want and got[:len(want)] == want:
        return ("the match is right, but what followed it ends where the sequence ends: propose only those tokens "
                "(fewer than k; no padding, no wrap-around)")
    return None


def _search(tokens, k, min_n, max_n, overlap: bool = True):
    """(n, start, proposal) of the latest earlier match, longest n first; with overlap=False,
    the classic mistake: only occurrences that end before the suffix begins (in tokens[:len - n])."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1 if overlap else length - 2 * n, -1, -1):
            if tokens[start:start + n] == suffix:
                return n, start, tokens[start + n:start + n + k]
    return None, None, []


def _overlap_missed(got: list[int], tokens, k, min_n, max_n) -> str | None:
    """The hint when `got` is what a search that skips overlapping occurrences proposes."""
    n, start, want = _search(tokens, k, min_n, max_n)
    if got == want or got != _search(tokens, k, min_n, max_n, overlap=False)[2]:
        return None
    length = len(tokens)
    return (f"the latest earlier occurrence of the suffix {tokens[length - n:]} starts at position {start} and "
            f"overlaps the suffix (positions {length - n}-{length - 1}); your search skipped it, as if an "
            f"occurrence had to end before the suffix begins (a search in tokens[:len - n]), and proposed "
            f"{got}. Overlap is allowed: try every start from len - n - 1 down to 0; only start len - n, the "
            "suffix itself, is excluded")


def _call(g, fn, tokens, k, min_n, max_n) -> list[int]:
    call = f"propose_ngram({tokens}, k={k}, min_n={min_n}, max_n={max_n})"
    given = list(tokens)
    with g.case(f"calling {call}"):
        got = fn(given, k, min_n, max_n)
    expect(given == tokens, f"{call} changed its tokens to {given}: the proposer only reads the sequence "
                            "(the engine's own token list)")
    return _as_tokens(got, call)


@grader
def check_ngram_proposer(fn) -> bool:
    """fn(tokens, k, min_n, max_n) -> up to k tokens that followed the latest earlier occurrence of
    the last n tokens (n from max_n down to min_n), [] when none recurs: like
    `minillm.spec.ngram.propose_ngram`. Planted cases, then 400 random ones against it."""
    from ..spec.ngram import propose_ngram
    g = Grader("check_ngram_proposer", "your propose_ngram")
    expect(callable(fn), f"check_ngram_proposer takes your function propose_ngram, got {fn!r}")
    for rule, tokens, k, min_n, max_n, want, hint in CASES:
        got = _call(g, fn, tokens, k, min_n, max_n)
        if got != want:
            raise AssertionError(f"{rule}: propose_ngram({tokens}, k={k}, min_n={min_n}, max_n={max_n}) returned "
                                 f"{got}, expected {want}\n    Hint: "
                                 f"{_overlap_missed(got, tokens, k, min_n, max_n) or _too_long(got, want, k) or hint}")
    rng = random.Random(0)
    for _ in range(400):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 16))]
        min_n = rng.randint(1, 3)
        max_n, k = rng.randint(min_n, 4), rng.randint(1, 5)
        got, want = _call(g, fn, tokens, k, min_n, max_n), propose_ngram(tokens, k, min_n, max_n)
        if got != want:
            raise AssertionError(f"on a random case, propose_ngram({tokens}, k={k}, min_n={min_n}, max_n={max_n}) "
                                 f"returned {got}, expected {want}\n    Hint: "
                                 + (_overlap_missed(got, tokens, k, min_n, max_n) or
                                    "for n from max_n down to min_n, the last n tokens searched from start "
                                    "len - n - 1 down to 0; the first match gives tokens[start + n:start + n + k]"))
    return g.passed()
