"""The OpenAI API's responses as pydantic models (the subset we serve), with vLLM's additions
(`prompt_logprobs`, `max_model_len` on a model card). Requests are in protocol.py."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[Optional[float]] = []         # None for an echoed prompt's first token
    top_logprobs: list[Optional[dict[str, float]]] = []
    text_offset: list[int] = []


class PromptLogprob(BaseModel):
    """vLLM's shape of one token's entry in `prompt_logprobs` (keyed by token id)."""
    logprob: float
    rank: int
    decoded_token: Optional[str] = None


PromptLogprobs = Optional[list[Optional[dict[str, PromptLogprob]]]]


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
    prompt_logprobs: PromptLogprobs = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class FunctionCallOut(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None              # JSON text of the arguments (streamed in pieces)


class ToolCallOut(BaseModel):
    index: Optional[int] = None                  # in a stream's deltas only
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCallOut


class MessageToolCall(BaseModel):
    """A call in a whole (non-streamed) answer: OpenAI's shape has no `index` (a client that
    appends the message to its history sends back exactly what it got)."""
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]                       # None when the answer is a tool call
    tool_calls: Optional[list[MessageToolCall]] = None


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
    prompt_logprobs: PromptLogprobs = None


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCallOut]] = None


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
    root: Optional[str] = None                # a LoRA adapter's folder (as vLLM)
    parent: Optional[str] = None              # a LoRA adapter's base model (lora_models.py)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
