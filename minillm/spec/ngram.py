"""The n-gram proposer (prompt lookup): find the sequence's last n tokens earlier in its own
text and propose the tokens that followed them there.

Free to compute, and right surprisingly often wherever the answer repeats its input: a
summary quoting the passage, code edited in place, a list that continues a pattern. Longer
n-grams are tried first (a longer match predicts better); the most recent match wins.
"""
from __future__ import annotations


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens
    (n from max_n down to min_n); [] when no n-gram recurs."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):          # latest first, not the suffix itself
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
