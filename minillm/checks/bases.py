"""Abstract bases for the exercises whose lesson asks for a class with some methods given.

A lesson's exercise class subclasses one of these, not the package's reference: the base
gives the constructor (the attributes the methods use) and declares the exercise methods
abstract, so a class that does not write them cannot even be instantiated, and nothing of
the answer is inherited. The grader (`python -m minillm.course grade`) also requires every
exercise method to be defined in the notebook.
"""
from __future__ import annotations

from abc import ABC, abstractmethod


class DetokenizerBase(ABC):
    """Lesson 07: what `minillm.text.detokenizer.IncrementalDetokenizer` starts from, its
    `__init__`; `add`, `flush` and `settled_text` are the exercise."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""             # every delta returned so far, concatenated
        self.prefix_offset = 0     # window start: the tokens of the last emitted delta
        self.read_offset = 0       # the first token whose text is not yet emitted
        self.pending = ""          # the held-back tail as it decodes now (may end in U+FFFD)

    @abstractmethod
    def add(self, token_id: int) -> str:
        """Feed one token; return the text it completes ("" while a character is unfinished)."""

    @abstractmethod
    def flush(self) -> str:
        """Emit the held-back tail as it decodes now; call once, when generation has ended."""

    @abstractmethod
    def settled_text(self, stop: list[str]) -> str:
        """`self.text` without its longest tail that is the beginning of a stop string."""
