"""The Responses API's request and answer as pydantic models (the subset vLLM serves).

A request is strict like the chat one (protocol.py): a wrong type or an unknown field is a 400
naming it. Every list and string has a bound, so no request can make the server hold or walk
an unbounded structure before the engine's own limits apply. Answers mirror the `openai`
package's types (openai/types/responses/): the client parses them into its own objects.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from ..limits import MAX_MESSAGES
from ..structured import MAX_TOOLS

MAX_TEXT = 1 << 20            # characters in one string (the body limit, 4 MB, comes first anyway)
MAX_PARTS = 64                # content parts in one message
MAX_ID = 128                  # characters in an id, a call id, a name
Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]
Number = Union[StrictInt, StrictFloat]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextPart(Strict):
    """A piece of a message: what the user sent (input_text) or what the model said (output_text)."""
    type: Literal["input_text", "output_text"]
    text: StrictStr = Field(max_length=MAX_TEXT)
    annotations: Optional[list[Any]] = Field(default=None, max_length=0)    # output_text's, always empty here


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[Text, Annotated[list[TextPart], Field(max_length=MAX_PARTS)]]
    id: Optional[StrictStr] = Field(default=None, max_length=MAX_ID)
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class FunctionCallItem(Strict):
    """A call the model made earlier (sent back so the model sees its own call)."""
    type: Literal["function_call"]
    call_id: StrictStr = Field(max_length=MAX_ID)
    name: StrictStr = Field(max_length=MAX_ID)
    arguments: StrictStr = Field(max_length=MAX_TEXT)
    id: Optional[StrictStr] = Field(default=None, max_length=MAX_ID)
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class FunctionCallOutputItem(Strict):
    """What the caller's tool returned for call_id."""
    type: Literal["function_call_output"]
    call_id: StrictStr = Field(max_length=MAX_ID)
    output: StrictStr = Field(max_length=MAX_TEXT)
    id: Optional[StrictStr] = Field(default=None, max_length=MAX_ID)
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


InputItem = Union[FunctionCallItem, FunctionCallOutputItem, MessageItem]


class FunctionTool(Strict):
    """The Responses API's flat tool: name and parameters beside type (chat nests them in "function")."""
    type: Literal["function"]
    name: StrictStr = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[StrictStr] = Field(default=None, max_length=MAX_TEXT)
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[StrictBool] = None


class NamedFunction(Strict):
    type: Literal["function"]
    name: StrictStr = Field(max_length=MAX_ID)


class TextFormat(Strict):
    """text.format: plain text, any JSON object, or JSON that matches `schema`."""
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[StrictStr] = Field(default=None, max_length=MAX_ID)
    description: Optional[StrictStr] = Field(default=None, max_length=MAX_TEXT)
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[StrictBool] = None


class TextConfig(Strict):
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


class ResponsesRequest(Strict):
    model: Optional[StrictStr] = Field(default=None, max_length=MAX_ID * 4)
    input: Union[Text, Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]]
    instructions: Optional[StrictStr] = Field(default=None, max_length=MAX_TEXT)
    tools: Optional[list[FunctionTool]] = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedFunction]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    stream: Optional[StrictBool] = None          # None (or absent): false
    store: Optional[StrictBool] = None           # None (or absent): true, as OpenAI
    previous_response_id: Optional[StrictStr] = Field(default=None, max_length=MAX_ID)
    text: Optional[TextConfig] = None
    metadata: Optional[dict[StrictStr, StrictStr]] = Field(default=None, max_length=16)
    user: Optional[StrictStr] = Field(default=None, max_length=MAX_ID * 4)
    # sent by clients at their neutral values; anything else is refused by name (unsupported())
    include: Optional[list[StrictStr]] = Field(default=None, max_length=16)
    truncation: Optional[Literal["disabled"]] = None
    background: Optional[Literal[False]] = None
    reasoning: Optional[dict[str, Any]] = Field(default=None, max_length=0)
    # vLLM's sampling extras
    top_k: Optional[StrictInt] = None
    min_p: Optional[Number] = None
    repetition_penalty: Optional[Number] = None
    seed: Optional[StrictInt] = None

    def items(self) -> list:
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input


# ---- answers (openai.types.responses) ----

class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []
    logprobs: list = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    incomplete_details: Optional[dict] = None
    error: Optional[dict] = None
    instructions: Optional[str] = None
    output: list[Union[OutputMessage, FunctionCallOut]] = []
    tools: list[dict] = []
    tool_choice: Union[str, dict] = "auto"
    parallel_tool_calls: bool = True
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_output_tokens: Optional[int] = None
    previous_response_id: Optional[str] = None
    store: bool = True
    metadata: Optional[dict] = None
    text: dict = {"format": {"type": "text"}}
    truncation: str = "disabled"
    usage: Optional[ResponseUsage] = None
