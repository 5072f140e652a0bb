"""SamplingParams (vLLM's names) and the sampler: a batch of logits -> one token per row.

Each row carries its own parameters and its own random generator. A seeded
request owns a generator seeded once, and only its own draws advance it, so its
tokens do not depend on what else shares the batch (lesson 01, and the engine).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    n: int = 1                        # parallel samples per prompt (copy-on-write, lesson 04)
    max_tokens: int = 16              # generated tokens at most
    temperature: float = 1.0          # 0 means greedy
    top_k: int = 0                    # keep the k most likely tokens; 0 or -1: all
    top_p: float = 1.0                # keep the smallest set with this much probability
    seed: int | None = None           # per-request seed: reproducible whatever the batch
    stop: list[str] | str | None = None       # strings that end generation (not shown in text)
    stop_token_ids: list[int] | None = None   # token ids that end generation
    ignore_eos: bool = False          # keep going after EOS (benchmarks)

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"SamplingParams.{name} must be {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "an integer >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", "an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            bad("temperature", "a number in [0, 100] (0 = greedy)")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k not in (0, -1)):
            bad("top_k", "an integer >= 1, or 0 / -1 to disable")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "a number in (0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an integer or None")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            bad("stop", "a non-empty string or a list of non-empty strings")
        self.stop = stops
        ids = list(self.stop_token_ids or [])
        if not all(isinstance(t, int) and t >= 0 for t in ids):
            bad("stop_token_ids", "a list of non-negative integers")
        self.stop_token_ids = ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams, device="cpu", offset: int = 0) -> torch.Generator | None:
    """A generator owned by one sequence; None (the global RNG) when unseeded.
    `offset` gives the i-th of n parallel samples its own stream."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed + offset)


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf (a row of logits, or a batch)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # ties: lowest id first, like argmax
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs        # probability of strictly better tokens
    drop_sorted = mass_before >= top_p                # the best token always stays
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """logits [B, V] -> next token ids [B]. Row i uses params[i] and generators[i]."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)                    # greedy rows are done
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        row = apply_top_p(apply_top_k(row, p.top_k), p.top_p)
        probs = row.softmax(dim=-1)
        tokens[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return tokens
