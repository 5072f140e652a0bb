"""The OpenAI API's requests and responses as pydantic models (the subset we serve).

Requests are strict: a field of the wrong type is refused, never coerced (`"n": "2"` or
`"max_tokens": 1.5` is a 400, as with OpenAI), and an unknown field is refused too, so a
client never believes an option took effect when it was silently dropped. Options we
know but do not implement yet (penalties, logit_bias, echo, ...) are accepted only at
their neutral value; `unsupported()` names any that is set.
Ranges (temperature in [0, 100], top_p in (0, 1], ...) are checked once, by
`SamplingParams`, which the engine needs anyway.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = Union[StrictInt, StrictFloat]
TokenIds = list[StrictInt]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: StrictBool = False


class SamplingFields(Strict):
    """Fields both endpoints share. top_k, priority and ignore_eos are vLLM's extras."""
    model: Optional[StrictStr] = None          # None: the served model
    max_tokens: Optional[StrictInt] = None     # None: up to max_model_len, as vLLM does
    n: StrictInt = 1
    temperature: Optional[Number] = None       # None: 1.0
    top_p: Optional[Number] = None
    top_k: Optional[StrictInt] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: StrictBool = False
    priority: StrictInt = 0
    user: Optional[StrictStr] = None           # an end-user id for the caller's logs; no effect
    # known, not implemented yet: only their neutral value is accepted
    presence_penalty: Optional[Number] = None
    frequency_penalty: Optional[Number] = None
    logit_bias: Optional[dict[str, Number]] = None

    def logprobs_k(self) -> Optional[int]:
        return None

    def unsupported(self) -> Optional[str]:
        """The first option that is set but not implemented, or None."""
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty" if self.presence_penalty else "frequency_penalty"
        return "logit_bias" if self.logit_bias else None


class CompletionRequest(SamplingFields):
    prompt: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
    logprobs: Optional[StrictInt] = None
    echo: StrictBool = False
    suffix: Optional[StrictStr] = None
    best_of: Optional[StrictInt] = None

    def logprobs_k(self) -> Optional[int]:
        """How many top logprobs to return per token (None: no logprobs)."""
        return self.logprobs

    def unsupported(self) -> Optional[str]:
        if self.echo or self.suffix or (self.best_of is not None and self.best_of != self.n):
            return "echo" if self.echo else ("suffix" if self.suffix else "best_of")
        return super().unsupported()


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[StrictStr, list[TextPart]]
    name: Optional[StrictStr] = None

    def as_template_input(self) -> dict:
        """{"role", "content"} as a chat template expects: text parts joined, and
        "developer" (OpenAI's newer name for the system role) as "system"."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = None     # OpenAI's newer name for max_tokens
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None

    def logprobs_k(self) -> Optional[int]:
        """How many top logprobs to return per token (None: no logprobs), as the engine counts."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("SamplingParams.logprobs must be requested (logprobs: true) to use top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


# -- responses -----------------------------------------------------------------------

class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = []


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "minillm"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
