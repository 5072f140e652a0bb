"""What generation returns, in vLLM's shapes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int                       # which of the n samples
    text: str
    token_ids: list[int]
    finish_reason: str | None        # "stop" (EOS / stop string / stop token), "length", or None while running
