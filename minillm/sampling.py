"""SamplingParams (vLLM's names) and the sampler: a batch of logits -> one token per row.

Each row carries its own parameters and its own random generator. A seeded
request owns a generator seeded once, and only its own draws advance it, so its
tokens do not depend on what else shares the batch (lesson 01, and the engine).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from .logprobs import MAX_LOGPROBS
from .validate import Validated, check_bool, check_int, check_number, fail, is_int


MIN_TEMPERATURE = 1e-2     # vLLM's floor: 0 < T < 0.01 is raised to 0.01 (below it logits / T overflow)
MAX_SEED = 2**64 - 1       # torch generators take 64-bit seeds


@dataclass
class SamplingParams(Validated):
    """How to pick each token (vLLM's names). Checked strictly on construction and again
    whenever a field is assigned, so a bad value is refused before it reaches a step."""
    n: int = 1                        # parallel samples per prompt (copy-on-write, lesson 04)
    max_tokens: int = 16              # generated tokens at most
    temperature: float = 1.0          # 0 means greedy
    top_k: int = 0                    # keep the k most likely tokens; 0 or -1: all
    top_p: float = 1.0                # keep the smallest set with this much probability
    seed: int | None = None           # per-request seed in [0, 2**64): reproducible whatever the batch
    stop: list[str] | str | None = None       # strings that end generation (not shown in text)
    stop_token_ids: list[int] | None = None   # token ids that end generation
    ignore_eos: bool = False          # keep going after EOS (benchmarks)
    logprobs: int | None = None       # report the sampled token's logprob and the top k (minillm/logprobs.py)

    def validate(self) -> None:
        name = "SamplingParams"
        check_int(name, "n", self.n, minimum=1)
        check_int(name, "max_tokens", self.max_tokens, minimum=1)
        check_number(name, "temperature", self.temperature, "a number in [0, 100] (0 = greedy)",
                     lambda t: 0 <= t <= 100)
        if 0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        check_int(name, "top_k", self.top_k, minimum=-1)
        check_number(name, "top_p", self.top_p, "a number in (0, 1]", lambda p: 0 < p <= 1)
        check_int(name, "seed", self.seed, minimum=0, maximum=MAX_SEED, optional=True)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops is None:
            stops = []
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
            fail(name, "stop", "a non-empty string or a list of non-empty strings", self.stop, TypeError)
        object.__setattr__(self, "stop", list(stops))
        ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(is_int(t) and t >= 0 for t in ids):
            fail(name, "stop_token_ids", "a list of non-negative integers", self.stop_token_ids, TypeError)
        object.__setattr__(self, "stop_token_ids", list(ids))
        check_bool(name, "ignore_eos", self.ignore_eos)
        check_int(name, "logprobs", self.logprobs, minimum=0, maximum=MAX_LOGPROBS, optional=True)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_seed(seed: int, index: int) -> int:
    """The seed of the index-th of n parallel samples. Sample 0 uses the request's seed
    itself (so n=1 matches lesson 01's loop); the others take 64 bits of a hash of
    (seed, index): never out of range, and unrelated to any other request's seed + 1."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/{index}".encode()).digest()[:8], "little")


def make_generator(params: SamplingParams, device="cpu", offset: int = 0) -> torch.Generator | None:
    """A generator owned by one sequence; None (the global RNG) when unseeded.
    `offset` gives the i-th of n parallel samples its own stream."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(sample_seed(params.seed, offset))


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
