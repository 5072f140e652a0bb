"""The OpenAI API's requests as pydantic models (the subset we serve; responses.py has the answers).

Requests are strict: a field of the wrong type is refused, never coerced (`"n": "2"` or
`"max_tokens": 1.5` is a 400, as with OpenAI), and an unknown field is refused too, so a
client never believes an option took effect when it was silently dropped. Options we
know but do not implement (suffix, best_of other than n) are accepted only at their
neutral value; `unsupported()` names any that is set.
Ranges (temperature in [0, 100], top_p in (0, 1], penalties in [-2, 2], ...) are checked
once, by `SamplingParams`, which the engine needs anyway.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator, model_validator)

from .structured import ResponseFormat, Tool, ToolChoice

Number = Union[StrictInt, StrictFloat]
TokenIds = list[StrictInt]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False     # vLLM's: with include_usage, usage in every chunk


class SamplingFields(Strict):
    """Fields both endpoints share. OpenAI's, then vLLM's extras (top_k, min_p, ...)."""
    model: Optional[StrictStr] = None          # None: the served model
    max_tokens: Optional[StrictInt] = None     # None: up to max_model_len, as vLLM does
    max_completion_tokens: Optional[StrictInt] = None     # OpenAI's newer name for max_tokens (wins)
    n: StrictInt = 1
    temperature: Optional[Number] = None       # None: 1.0
    top_p: Optional[Number] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None           # an end-user id for the caller's logs; no effect
    presence_penalty: Optional[Number] = None
    frequency_penalty: Optional[Number] = None
    logit_bias: Optional[dict[StrictStr, Number]] = None     # {"token id": bias}
    # vLLM's extras (SamplingParams documents each)
    top_k: Optional[StrictInt] = None
    min_p: Optional[Number] = None
    repetition_penalty: Optional[Number] = None
    min_tokens: StrictInt = 0
    stop_token_ids: Optional[list[StrictInt]] = None
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    ignore_eos: StrictBool = False
    priority: StrictInt = 0
    prompt_logprobs: Optional[StrictInt] = None    # each prompt token's logprob and the top k (not streamed)
    # the output must match a schema, regex, choice or grammar (structured.py)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict[StrictStr, Any]] = None    # vLLM's: json, regex, choice, grammar, json_object

    def logprobs_k(self) -> Optional[int]:
        return None

    def prompt_logprobs_k(self) -> Optional[int]:
        return self.prompt_logprobs

    def max_tokens_asked(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def usage_in_every_chunk(self) -> bool:
        o = self.stream_options
        return o is not None and o.include_usage and o.continuous_usage_stats

    def unsupported(self) -> Optional[str]:
        """The first option that is set but not implemented, or None."""
        return None


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
        if self.suffix or (self.best_of is not None and self.best_of != self.n):
            return "suffix" if self.suffix else "best_of"
        return super().unsupported()

    def score_only(self) -> bool:
        """echo with max_tokens 0: the prompt and its logprobs, nothing generated (lm-eval's
        loglikelihood requests). The engine samples one token, which is not shown."""
        return self.echo and self.max_tokens_asked() == 0

    def prompt_logprobs_k(self) -> Optional[int]:
        """echo with logprobs needs the prompt's logprobs (as vLLM: at least as many as logprobs)."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(Strict):
    name: StrictStr
    arguments: StrictStr                       # JSON text of an object, as OpenAI sends it

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            ok = isinstance(json.loads(value), dict)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError("arguments must be the JSON text of an object, such as '{\"city\": \"Paris\"}'")
        return value


class ToolCall(Strict):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Optional[StrictInt] = None             # a streamed delta's field, echoed back by some clients (litellm); ignored


class ChatMessage(Strict):
    """A turn of the conversation. An assistant message may carry tool_calls (its content may
    then be null); a "tool" message answers one (tool_call_id). The model's chat template
    renders them (text/tokenizer.py refuses a template that cannot)."""
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[StrictStr, list[TextPart]]] = None
    name: Optional[StrictStr] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[StrictStr] = None
    # Fields of an answer that clients send back when they append it to the history as they got
    # it (openai's and litellm's message objects): accepted when empty, ignored.
    refusal: Optional[StrictStr] = None
    function_call: None = None
    audio: None = None
    annotations: Optional[list[Any]] = Field(default=None, max_length=0)
    provider_specific_fields: None = None

    @model_validator(mode="after")
    def _shape(self) -> "ChatMessage":
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"only an assistant message carries tool_calls, not a {self.role!r} one")
        if (self.tool_call_id is None) != (self.role != "tool"):
            raise ValueError("a tool message needs the tool_call_id it answers (and only a tool message has one)")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required: it may be null only in an assistant message with tool_calls")
        return self

    def text(self) -> Optional[str]:
        return self.content if not isinstance(self.content, list) else "".join(p.text for p in self.content)

    def texts(self) -> list[str]:
        """Every string the template will render (for the size bound before templating)."""
        calls = self.tool_calls or []
        return [self.text() or ""] + [c.function.name + c.function.arguments for c in calls]

    def as_template_input(self) -> dict:
        """{"role", "content", ...} as a chat template expects: text parts joined, "developer"
        (OpenAI's newer name for the system role) as "system", and tool call arguments as a
        dict (as Hugging Face's tool-use templates expect, and vLLM passes them)."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None
    # vLLM's extras for the chat template
    add_generation_prompt: Optional[StrictBool] = None    # None: true unless continue_final_message
    continue_final_message: StrictBool = False
    chat_template_kwargs: Optional[dict[StrictStr, Any]] = None
    chat_template: Optional[StrictStr] = None     # vLLM's: this request's template (--trust-request-chat-template)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None      # "auto" (the default with tools), "required", a function, "none"
    parallel_tool_calls: Optional[StrictBool] = None   # false: at most one call in an "auto" answer
    _chat: Any = PrivateAttr(default=None)        # the server's ChatSettings (chat_setup.bind_chat)

    def logprobs_k(self) -> Optional[int]:
        """How many top logprobs to return per token (None: no logprobs), as the engine counts."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("SamplingParams.logprobs must be requested (logprobs: true) to use top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def generation_prompt(self) -> bool:
        return not self.continue_final_message if self.add_generation_prompt is None else self.add_generation_prompt
