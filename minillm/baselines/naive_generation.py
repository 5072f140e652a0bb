"""Lesson 01: the autoregressive loop with no cache.

Each step feeds the *whole* sequence (prompt + everything generated so far) through
the model and keeps only the last position's logits. Simple and obviously correct,
and each step costs more than the last: the waste lesson 02 removes.
"""
from __future__ import annotations

import torch

from ..attention import NoCache
from ..outputs import CompletionOutput
from ..sample.sampler import make_generator, sample
from ..sampling_params import SamplingParams
from ..text.stopping import StopChecker
from ..text.tokenizer import prompt_to_ids


@torch.inference_mode()
def next_token_logits_naive(model, token_ids: list[int]) -> torch.Tensor:
    """Run the full sequence; return the logits [V] that predict the next token."""
    ids = torch.tensor(token_ids, device=model.device)
    positions = torch.arange(len(token_ids), device=model.device)
    hidden = model(ids, positions, NoCache([len(token_ids)]))
    return model.compute_logits(hidden[-1:])[0]


@torch.inference_mode()
def generate_naive(model, tokenizer, prompt, params: SamplingParams | None = None,
                   on_token=None) -> CompletionOutput:
    """Generate one completion by recomputing everything each step.
    `on_token(step, token_id)` is called after each token (lessons time steps with it)."""
    params = params or SamplingParams()
    if params.n != 1:
        raise NotImplementedError("n > 1 needs the paged engine (lesson 04)")
    prompt_ids = prompt_to_ids(tokenizer, prompt)
    eos = tokenizer.eos_token_ids if tokenizer is not None else model.config.eos_token_ids
    stopper = StopChecker(params, tokenizer, eos)
    generator = make_generator(params, model.device)
    output: list[int] = []
    while True:
        ids = prompt_ids + output
        input_ids = torch.tensor(ids, device=model.device)
        positions = torch.arange(len(ids), device=model.device)
        hidden = model(input_ids, positions, NoCache([len(ids)]))
        logits = model.compute_logits(hidden[-1:])              # [1, V]
        token = int(sample(logits, [params], [generator])[0])
        output.append(token)
        if on_token is not None:
            on_token(len(output) - 1, token)
        finish = stopper.check(output)
        if finish:
            return CompletionOutput(0, stopper.text, output, finish)
