"""What generation returns, in vLLM's shapes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int                       # which of the n samples
    text: str
    token_ids: list[int]
    finish_reason: str | None        # "stop" (EOS / stop string / stop token), "length", "abort",
                                     # "error" (a fault ended the request), or None while running
    logprobs: list[dict] | None = None   # per token {token_id: Logprob}, with SamplingParams(logprobs=k)

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the generated tokens' logprobs (None without logprobs)."""
        if self.logprobs is None:
            return None
        return sum(step[t].logprob for step, t in zip(self.logprobs, self.token_ids))


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    spec_proposed_tokens: int = 0      # speculative decoding: drafts verified ...
    spec_accepted_tokens: int = 0      # ... and kept

    def count_drafts(self, proposed: int, accepted: int) -> None:
        self.spec_proposed_tokens += proposed
        self.spec_accepted_tokens += accepted


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0       # prompt tokens served from the prefix cache
    metrics: RequestMetrics | None = None
    error: str | None = None         # why the request ended with finish_reason "error"
    prompt_logprobs: list[dict | None] | None = None   # SamplingParams(prompt_logprobs=k): None, then a
                                                       # {token_id: Logprob} per prompt token after the first
