"""What a request may do to its logits before a token is drawn: vLLM's extras, in vLLM's order.

    raw logits ─► min_tokens ─► logit_bias ─► repetition ─► frequency ─► presence ─► min_p ─► sample()
    (logprobs)    (stop ids     (+ bias)      (prompt and    (generated tokens only:     (needs the       temperature,
                   -inf)                       output)        OpenAI's definitions)       temperature)     top-k, top-p

One row at a time: a row is one sequence's logits [V], and each stage reads only that
sequence's parameters and token history, so a row's result does not depend on what else
shares the batch. A row whose request asks for none of these is never touched (`wants_processing`):
greedy and seeded sampling with the extras at their defaults give exactly the tokens they gave
before this stage existed. Logprobs are taken from the raw logits, before this stage, as vLLM
reports them by default (minillm/sample/logprobs.py).

The arithmetic, for a token t with logit l, c = how many times t was generated so far:
  - min_tokens:         l = -inf for EOS and stop_token_ids while fewer than min_tokens tokens exist
  - logit_bias:         l = l + bias[t]
  - repetition_penalty: if t is in the prompt or the output: l = l / p if l > 0 else l * p (HF's, vLLM's)
  - frequency_penalty:  l = l - f * c
  - presence_penalty:   l = l - p * (c > 0)
  - min_p:              drop t (l = -inf) when softmax(l / T)[t] < min_p * max softmax(l / T); vLLM
                        applies it after temperature, so its threshold uses T here (greedy: skipped,
                        it never changes the argmax).
"""
from __future__ import annotations

import torch

from ..sampling_params import SamplingParams


def wants_processing(params: SamplingParams, num_generated: int) -> bool:
    """Does this row need any stage? (min_tokens only while it is not reached yet.)"""
    return bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
                or params.logit_bias or num_generated < params.min_tokens
                or (params.min_p > 0 and not params.greedy))


def process_logits(row: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                   eos_token_ids=()) -> torch.Tensor:
    """One sequence's logits [V] (float) -> a new row with every stage it asks for applied."""
    if len(output_ids) < params.min_tokens:
        row = apply_min_tokens(row, stop_ids(params, eos_token_ids))
    if params.logit_bias:
        row = apply_logit_bias(row, params.logit_bias)
    if params.repetition_penalty != 1.0:
        row = apply_repetition_penalty(row, prompt_ids, output_ids, params.repetition_penalty)
    if params.frequency_penalty or params.presence_penalty:
        row = apply_frequency_presence(row, output_ids, params.frequency_penalty, params.presence_penalty)
    if params.min_p > 0 and not params.greedy:
        row = apply_min_p(row, params.min_p, params.temperature)
    return row


def stop_ids(params: SamplingParams, eos_token_ids) -> set[int]:
    """The tokens that would end the sequence: stop_token_ids, and EOS unless ignore_eos."""
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))


def apply_min_tokens(row: torch.Tensor, ids: set[int]) -> torch.Tensor:
    """Mask the ids (those outside the vocabulary can never be drawn anyway)."""
    ids = sorted(t for t in ids if 0 <= t < row.shape[-1])
    if not ids:
        return row
    return row.index_fill(-1, torch.tensor(ids, device=row.device), float("-inf"))


def apply_logit_bias(row: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    vocab = row.shape[-1]
    bad = next((t for t in bias if t >= vocab), None)
    if bad is not None:
        raise ValueError(f"SamplingParams.logit_bias has token id {bad}, outside the vocabulary [0, {vocab})")
    ids = torch.tensor(list(bias), device=row.device)
    return row.index_add(-1, ids, torch.tensor(list(bias.values()), dtype=row.dtype, device=row.device))


def token_counts(ids: list[int], vocab: int, device) -> torch.Tensor:
    """[V] how many times each token occurs in ids."""
    if not ids:
        return torch.zeros(vocab, dtype=torch.long, device=device)
    return torch.bincount(torch.tensor(ids, device=device), minlength=vocab)


def apply_repetition_penalty(row: torch.Tensor, prompt_ids: list[int], output_ids: list[int],
                             penalty: float) -> torch.Tensor:
    seen = token_counts(prompt_ids + output_ids, row.shape[-1], row.device) > 0
    return torch.where(seen, torch.where(row > 0, row / penalty, row * penalty), row)


def apply_frequency_presence(row: torch.Tensor, output_ids: list[int], frequency: float,
                             presence: float) -> torch.Tensor:
    counts = token_counts(output_ids, row.shape[-1], row.device)
    if frequency:
        row = row - frequency * counts.to(row.dtype)
    if presence:
        row = row - presence * (counts > 0).to(row.dtype)
    return row


def apply_min_p(row: torch.Tensor, min_p: float, temperature: float) -> torch.Tensor:
    probs = (row / temperature).softmax(dim=-1)
    return row.masked_fill(probs < min_p * probs.max(), float("-inf"))
