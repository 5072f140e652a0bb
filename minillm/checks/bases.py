"""Abstract bases for the exercises whose lesson asks for a class with some methods given.

A lesson's exercise class subclasses one of these, not the package's reference: the base
gives the constructor (the attributes the methods use) and declares the exercise methods
abstract, so a class that does not write them cannot even be instantiated, and nothing of
the answer is inherited. The grader (`python -m minillm.course grade`) also requires every
exercise method to be defined in the notebook.
"""
from __future__ import annotations

from ..text.detokenizer import DetokenizerBase

__all__ = ["DetokenizerBase"]
