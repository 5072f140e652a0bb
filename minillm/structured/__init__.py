"""Structured outputs: the sampler may only pick tokens a grammar allows (JSON schema, regex,
choice, Lark grammar), so the answer always parses. params.py says what a request asks for,
grammar.py turns it into a compiled grammar (llguidance), matchers.py keeps a matcher per
sequence and masks each step's logits. choice_trie.py is lesson 12's hand-written `choice`
constraint (a byte trie, the teaching version: the engine uses llguidance)."""
from .params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
