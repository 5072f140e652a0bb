"""A request as the engine holds it, and the checks it passes at the door.

A request is a prompt and its n sequences (only the first exists until the prompt
is computed; then it forks). `check_request` refuses, before anything is queued,
every input that would otherwise fail in the middle of a step and take the batch
down with it: a bad type, a token outside the vocabulary, a request that could never
fit the engine's limits.
"""
from __future__ import annotations

from ..outputs import RequestMetrics
from ..sampling_params import SamplingParams
from .sequence import Sequence
from ..text.tokenizer import prompt_to_ids
from ..utils.validate import is_int, refuse


class Request:
    def __init__(self, request_id, prompt, prompt_ids, params, priority, arrival, lora_request=None):
        self.request_id, self.prompt, self.prompt_ids = request_id, prompt, prompt_ids
        self.params, self.priority = params, priority
        self.seqs: list[Sequence] = []
        self.metrics = RequestMetrics(arrival_time=arrival)
        self.error: str | None = None      # set when a fault ended the request
        self.lora_request = lora_request   # its LoRA adapter (lesson 13), None: the base model

    @property
    def finished(self) -> bool:
        return self.error is not None or (
            len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs))


def check_request(request_id, prompt, params, priority, tokenizer, *, vocab_size: int, max_model_len: int,
                  max_num_seqs: int) -> list[int]:
    """The prompt's token ids, or a TypeError/ValueError that says what is wrong. The limits
    are the engine's resolved ones (resolved_config.py)."""
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}"
                        + (": build one with SamplingParams(**d)" if isinstance(params, dict) else ""))
    if not is_int(priority):
        raise TypeError(f"priority must be an integer, got {priority!r:.40}")
    ids = prompt_to_ids(tokenizer, prompt)
    vocab = vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        refuse("prompt", f"prompt token id {bad} is outside the vocabulary: ids lie in [0, {vocab})")
    bad = next((t for t in (params.logit_bias or {}) if not t < vocab), None)
    if bad is not None:
        refuse("logit_bias", f"logit_bias names token id {bad}, outside the vocabulary: ids lie in [0, {vocab})")
    limit = max_model_len
    if len(ids) >= limit:
        refuse("prompt", f"the prompt has {len(ids)} tokens; max_model_len is {limit} "
                         "(prompt + at least one generated token): shorten the prompt")
    if len(ids) + params.max_tokens > limit:
        refuse("max_tokens", f"the prompt ({len(ids)} tokens) plus max_tokens={params.max_tokens} is more than "
                         f"max_model_len={limit}: lower max_tokens to at most {limit - len(ids)}")
    seats = max_num_seqs
    if params.n > seats:
        refuse("n", f"n={params.n} samples need {params.n} sequences running at once; max_num_seqs is {seats}")
    return ids
