"""A grammar matcher per constrained sequence, and the step's token masks.

Each step, before sampling: for every constrained sequence, the matcher says which tokens
may come next (a bitmask row, 32 tokens per int32), and every other token's logit becomes
-inf. After sampling, the matcher advances on the token that was picked. Rows of
unconstrained sequences are never touched (no all-zero row that would block every token).

A matcher follows the *output tokens*, not the KV cache: a preempted sequence keeps its
output tokens (recompute or swap), so its matcher stays valid; a fork (n > 1) is made
before any output token exists, so its fresh matcher equals a copy.
"""
from __future__ import annotations

import torch

from .grammar import GrammarCache
from .params import StructuredOutputsParams


class StructuredOutputs:
    """The engine's grammar side: compiled grammars (cached by spec) and new matchers.
    `allow_additional_properties`: read JSON schemas as the JSON-Schema standard does (an object
    without additionalProperties takes any extra key), not as vLLM/OpenAI strict (schema.py)."""

    allow_additional_properties = False

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._cache: GrammarCache | None = None

    @property
    def cache(self) -> GrammarCache:
        """Built on first use: reading the vocabulary into llguidance takes ~0.3 s."""
        if self._cache is None:
            import llguidance.hf
            if self.tokenizer is None:
                raise ValueError("structured outputs need the model's tokenizer")
            self._cache = GrammarCache(llguidance.hf.from_tokenizer(self.tokenizer.hf, n_vocab=self.vocab_size),
                                       self.allow_additional_properties)
        return self._cache

    def check(self, spec: StructuredOutputsParams | None) -> None:
        """Compile (or find) the spec's grammar; a bad one raises ValueError naming the field."""
        if spec is not None:
            self.cache.get(spec)

    def matcher(self, spec: StructuredOutputsParams | None) -> "SequenceGrammar | None":
        if spec is None:
            return None
        from llguidance import LLMatcher
        return SequenceGrammar(LLMatcher(self.cache.ll_tokenizer, self.cache.get(spec)), self.vocab_size)

    # the two moves of a step (lesson 12 overrides them)
    def mask_logits(self, rows: torch.Tensor, grammars: list, on_error) -> None:
        """Before sampling: row i keeps only what grammars[i] allows next (in place); a None
        grammar (an unconstrained sequence) leaves its row alone. `on_error(i, exception)`
        for a matcher that fails (its row stays as it was)."""
        which, masks = [], []
        for i, grammar in enumerate(grammars):
            if grammar is None:
                continue
            try:
                masks.append(grammar.allowed())
                which.append(i)
            except Exception as e:
                on_error(i, e)
        apply_masks(rows, masks, which)

    def advance(self, grammar: "SequenceGrammar", token: int) -> str | None:
        """After sampling: the matcher consumes the picked token; "stop" once the grammar is complete."""
        return grammar.advance(token)


class SequenceGrammar:
    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size

    def allowed(self) -> torch.Tensor:
        """The next token's bitmask row [ceil(V / 32)] int32 (bit t % 32 of word t // 32: token t).
        (llguidance.torch is not imported: its torch.compile decorator pulls in the compiler
        stack, 2 s on first use.)"""
        words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)
        if self.matcher.is_error():
            raise ValueError(f"the grammar failed: {self.matcher.get_error()}")
        return words[:(self.vocab_size + 31) // 32]

    def advance(self, token: int) -> str | None:
        """Consume the sampled token; "stop" once the grammar is complete (nothing else may follow)."""
        if not self.matcher.consume_token(token):
            raise ValueError(f"token {token} is not allowed by the grammar: {self.matcher.get_error()}")
        return "stop" if self.matcher.is_stopped() else None


def apply_masks(rows: torch.Tensor, bitmasks: list[torch.Tensor], which: list[int]) -> None:
    """rows [S, V] float: in row which[i], every token bitmasks[i] does not allow gets -inf.
    Plain torch ops on the logits' device (4 ms for 16 rows of 49,152 on this 2-core CPU):
    llguidance's own apply is a torch.compile'd function whose first call took 3.2 s in a step."""
    if not which:
        return
    bitmask = torch.stack(bitmasks).to(rows.device)
    bits = torch.arange(32, device=rows.device, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().flatten(1)[:, :rows.shape[1]]
    sub = rows[which]
    sub.masked_fill_(~allowed, float("-inf"))
    rows[which] = sub
