"""What turns sampled tokens into what a user sees, kept out of the scheduler's plain data.

Per sequence (keyed by `seq_id`) it holds what carries behaviour or grows with the text:
  - the seeded `torch.Generator` (lesson 01: a seeded request's draws are its own);
  - the StopChecker with its incremental detokenizer (stop strings, streamed text);
  - the logprobs collected, when the request asked for them (prompt logprobs with the
    request's first sequence: its other samples fork after the prompt).
The scheduler, the block manager and the runner see only `Sequence`, which pickles.
As vLLM's OutputProcessor, it lives with the engine's front, never in a worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..outputs import CompletionOutput, RequestOutput
from ..sample.logprobs import PromptLogprobs, token_logprobs
from ..sample.sampler import make_generator
from ..structured.matchers import SequenceGrammar, StructuredOutputs
from ..text.stopping import StopChecker
from .request import Request
from .sequence import Sequence


@dataclass
class SequenceState:
    generator: torch.Generator | None
    stopper: StopChecker
    logprobs: list[dict] | None = field(default=None)
    prompt_logprobs: list[dict | None] | None = field(default=None)   # [None] + one per later prompt token
    grammar: SequenceGrammar | None = None          # with SamplingParams.structured_outputs


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids, device: torch.device, vocab_size: int,
                 structured_outputs_cls=StructuredOutputs):
        self.tokenizer, self.eos_token_ids, self.device = tokenizer, eos_token_ids, device
        self.states: dict[int, SequenceState] = {}
        self.structured = structured_outputs_cls(tokenizer, vocab_size)

    def add(self, seq: Sequence) -> None:
        """A new sequence (a request's first, or a fork): its generator and stop checker."""
        p = seq.params
        self.states[seq.seq_id] = SequenceState(make_generator(p, self.device, offset=seq.index),
                                                StopChecker(p, self.tokenizer, self.eos_token_ids),
                                                grammar=self.structured.matcher(p.structured_outputs))

    def generator(self, seq: Sequence) -> torch.Generator | None:
        return self.states[seq.seq_id].generator

    def grammar(self, seq: Sequence) -> SequenceGrammar | None:
        return self.states[seq.seq_id].grammar

    def stop_checker(self, seq: Sequence) -> StopChecker:
        return self.states[seq.seq_id].stopper

    def check_stop(self, seq: Sequence) -> str | None:
        """After a new token: "stop", "length" or None (keep going); the text advances, and so
        does the grammar, which says "stop" once it is complete."""
        state = self.states[seq.seq_id]
        reason = state.stopper.check(seq.output_token_ids)
        if reason is None and state.grammar is not None:
            reason = self.structured.advance(state.grammar, seq.output_token_ids[-1])
        return reason

    def mask_logits(self, rows: torch.Tensor, seqs: list[Sequence], on_error) -> None:
        """Constrained sequences' rows keep only the tokens their grammar allows next (in place);
        `on_error(seq, exception)` for a matcher that fails."""
        grammars = [self.states[s.seq_id].grammar for s in seqs]
        if any(g is not None for g in grammars):
            self.structured.mask_logits(rows, grammars, lambda i, e: on_error(seqs[i], e))

    def record_logprobs(self, seq: Sequence, logits: torch.Tensor, token: int) -> None:
        state = self.states[seq.seq_id]
        state.logprobs = state.logprobs if state.logprobs is not None else []
        state.logprobs.append(token_logprobs(logits, token, seq.params.logprobs, self.tokenizer))

    def record_prompt_logprobs(self, scores: list[PromptLogprobs]) -> None:
        """A prefill chunk's prompt scores, put at their positions (a recomputed chunk after a
        preemption writes the same values again)."""
        for chunk in scores:
            state = self.states.get(chunk.seq_id)
            if state is None:          # the request ended in this step
                continue
            entries = chunk.as_dicts(self.tokenizer)
            end = chunk.first_position + len(entries)
            state.prompt_logprobs = state.prompt_logprobs or [None]
            state.prompt_logprobs += [None] * (end - len(state.prompt_logprobs))
            state.prompt_logprobs[chunk.first_position:end] = entries

    def prompt_logprobs(self, req: Request) -> list[dict | None] | None:
        """vLLM's `RequestOutput.prompt_logprobs`: None for the first token, then {token_id:
        Logprob} per prompt token; given once the whole prompt is scored (None before)."""
        if req.params.prompt_logprobs is None:
            return None
        scored = self.states[req.seqs[0].seq_id].prompt_logprobs or [None]
        return scored if len(scored) == len(req.prompt_ids) else None

    def output(self, req: Request) -> RequestOutput:
        outs = []
        for s in req.seqs:
            state = self.states[s.seq_id]
            outs.append(CompletionOutput(s.index, state.stopper.text, list(s.output_token_ids), s.finish_reason,
                                         None if state.logprobs is None else list(state.logprobs)))
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids, outs, req.finished,
                             req.seqs[0].num_cached_tokens, req.metrics, req.error, self.prompt_logprobs(req))

    def remove(self, req: Request) -> None:
        """The request left the engine: forget its sequences' state."""
        for s in req.seqs:
            self.states.pop(s.seq_id, None)
