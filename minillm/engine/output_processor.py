"""What turns sampled tokens into what a user sees, kept out of the scheduler's plain data.

Per sequence (keyed by `seq_id`) it holds what carries behaviour or grows with the text:
  - the seeded `torch.Generator` (lesson 01: a seeded request's draws are its own);
  - the StopChecker with its incremental detokenizer (stop strings, streamed text);
  - the logprobs collected, when the request asked for them.
The scheduler, the block manager and the runner see only `Sequence`, which pickles.
As vLLM's OutputProcessor, it lives with the engine's front, never in a worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..outputs import CompletionOutput, RequestOutput
from ..sample.logprobs import token_logprobs
from ..sample.sampler import make_generator
from ..text.stopping import StopChecker
from .request import Request
from .sequence import Sequence


@dataclass
class SequenceState:
    generator: torch.Generator | None
    stopper: StopChecker
    logprobs: list[dict] | None = field(default=None)


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids, device: torch.device):
        self.tokenizer, self.eos_token_ids, self.device = tokenizer, eos_token_ids, device
        self.states: dict[int, SequenceState] = {}

    def add(self, seq: Sequence) -> None:
        """A new sequence (a request's first, or a fork): its generator and stop checker."""
        p = seq.params
        self.states[seq.seq_id] = SequenceState(make_generator(p, self.device, offset=seq.index),
                                                StopChecker(p, self.tokenizer, self.eos_token_ids))

    def generator(self, seq: Sequence) -> torch.Generator | None:
        return self.states[seq.seq_id].generator

    def stop_checker(self, seq: Sequence) -> StopChecker:
        return self.states[seq.seq_id].stopper

    def check_stop(self, seq: Sequence) -> str | None:
        """After a new token: "stop", "length" or None (keep going); the text advances."""
        return self.states[seq.seq_id].stopper.check(seq.output_token_ids)

    def record_logprobs(self, seq: Sequence, logits: torch.Tensor, token: int) -> None:
        state = self.states[seq.seq_id]
        state.logprobs = state.logprobs if state.logprobs is not None else []
        state.logprobs.append(token_logprobs(logits, token, seq.params.logprobs, self.tokenizer))

    def output(self, req: Request) -> RequestOutput:
        outs = []
        for s in req.seqs:
            state = self.states[s.seq_id]
            outs.append(CompletionOutput(s.index, state.stopper.text, list(s.output_token_ids), s.finish_reason,
                                         None if state.logprobs is None else list(state.logprobs)))
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids, outs, req.finished,
                             req.seqs[0].num_cached_tokens, req.metrics, req.error)

    def remove(self, req: Request) -> None:
        """The request left the engine: forget its sequences' state."""
        for s in req.seqs:
            self.states.pop(s.seq_id, None)
