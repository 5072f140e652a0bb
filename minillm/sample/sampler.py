"""The sampler: a batch of logits -> one token per row (SamplingParams says how).

Each row carries its own parameters and its own random generator. A seeded
request owns a generator seeded once, and only its own draws advance it, so its
tokens do not depend on what else shares the batch (lesson 01, and the engine).
"""
from __future__ import annotations

import hashlib
import math

import torch

from ..sampling_params import SamplingParams


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


# -- the engine's short road for greedy rows --------------------------------------------------

ARGMAX_CHUNK = 1024      # logits per chunk in greedy_tokens, at most
CHUNKED_MIN_ROWS = 8     # fewer rows: argmax itself


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> each row's argmax [B]: the tokens sample() gives greedy rows (the lowest id
    among ties; a NaN wins, as in torch.argmax), found faster on CPU. torch's CPU argmax walks a row
    one element at a time while its max is vectorized, so: the max of each chunk of C logits (C the
    largest power of two up to ARGMAX_CHUNK that divides V), the argmax over those maxima (the first
    chunk holding the row's max), then the argmax inside that one chunk. Measured right after the
    logits are computed, as the engine calls it: 1.1 ms instead of 3 for 64 rows of SmolLM2's 49,152
    logits; below CHUNKED_MIN_ROWS rows the five extra operations cost more than they save."""
    B, V = logits.shape
    C = math.gcd(V, ARGMAX_CHUNK)
    if logits.device.type != "cpu" or B < CHUNKED_MIN_ROWS or C < 64:
        return logits.argmax(dim=-1)
    chunks = logits.unflatten(1, (V // C, C))                         # a view: [B, V // C, C]
    best = chunks.amax(dim=-1).argmax(dim=-1)                         # ties: the first chunk, in id order
    return best * C + chunks[torch.arange(B), best].argmax(dim=-1)
