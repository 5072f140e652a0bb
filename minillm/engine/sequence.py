"""One sequence being generated: its tokens, where its KV lives, how far it got.

A request with n > 1 samples owns n sequences that share the prompt's blocks
(lesson 04). The scheduler moves sequences between states; the block manager
fills `block_table`; the runner reads both to lay out a step.

Plain data only (ids, tokens, block table, counts, params): a sequence pickles, so a
step's plan can be sent to another process (a tensor-parallel worker). What carries
behaviour (the seeded generator, the stop checker and its detokenizer, the logprobs
collected) lives in the engine's OutputProcessor, keyed by `seq_id`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"      # not yet (or no longer) holding KV blocks
    RUNNING = "running"      # blocks on the device, scheduled every step
    SWAPPED = "swapped"      # blocks copied out to CPU memory (lesson 06)
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0                                  # which of the request's n samples
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)   # one per full block
    num_computed_tokens: int = 0                    # tokens whose K/V are in the cache
    num_cached_tokens: int = 0                      # prompt tokens found in the prefix cache on arrival
    admitted: bool = False                          # has held blocks before (a preemption re-admits)
    finish_reason: str | None = None
    priority: int = 0
    arrival: float = 0.0
    spec_token_ids: list[int] = field(default_factory=list)   # this step's drafts (speculative decoding)
    lora_request: object = None                     # its LoRA adapter (lora/request.py), None: the base model

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to feed the model before the next one can be sampled (drafts included)."""
        return len(self) + len(self.spec_token_ids) - self.num_computed_tokens

    @property
    def input_token_ids(self) -> list[int]:
        """What the model is fed from: the tokens, then this step's drafts."""
        return self.token_ids + self.spec_token_ids if self.spec_token_ids else self.token_ids

    def input_tokens(self, start: int, end: int) -> list[int]:
        """input_token_ids[start:end], without building the whole list first: a decode step
        reads one token, and copying every token of a long sequence for it would cost more."""
        prompt, out = self.prompt_token_ids, self.output_token_ids
        tokens = prompt[start:end] if start < len(prompt) else []
        start, end = max(0, start - len(prompt)), end - len(prompt)
        if end > 0:
            tokens += out[start:end]
            start, end = max(0, start - len(out)), end - len(out)
            tokens += self.spec_token_ids[start:end] if end > 0 else []
        return tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
