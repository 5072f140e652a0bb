"""vLLM's utility endpoints, so tools written for a vLLM server work here unchanged:

    POST /tokenize            {"prompt": text} or {"messages": [...]} (through the chat template)
                              -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize          {"tokens": [ids]} -> {"prompt": text}
    GET  /version             {"version": minillm's}
    GET  /v1/models/{id}      the model card, or 404 model_not_found (OpenAI's retrieve)
    GET|POST /ping            the same answer as /health (SageMaker's probe, which vLLM serves)
    POST /v1/responses        the Responses API (responses_api/)

and /metrics also under vLLM's names (vllm_metrics.py). `install` adds all of them to the app.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr, model_validator

from .. import __version__
from .errors import APIError
from .limits import MAX_MESSAGES, off_the_loop
from .openapi import errors
from .protocol import ChatCompletionRequest, ChatMessage, Strict
from .responses import ModelCard
from .responses_api.protocol import MAX_TEXT
from .responses_api.routes import router as responses_router
from .serving import chat_prompt
from .structured import MAX_TOOLS, Tool
from .vllm_metrics import VllmNames

MAX_TOKENS = 1 << 20          # token ids in one /detokenize


class TokenizeRequest(Strict):
    """vLLM's two shapes in one: a `prompt`, or `messages` rendered by the chat template."""
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = Field(default=None, max_length=MAX_TEXT)
    add_special_tokens: StrictBool = True               # prompt only: the template writes its own
    messages: Optional[list[ChatMessage]] = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: Optional[StrictStr] = None
    chat_template_kwargs: Optional[dict[StrictStr, Any]] = None
    tools: Optional[list[Tool]] = Field(default=None, max_length=MAX_TOOLS)
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt or messages (exactly one)")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(Strict):
    model: Optional[StrictStr] = None
    tokens: list[StrictInt] = Field(max_length=MAX_TOKENS)


class DetokenizeResponse(BaseModel):
    prompt: str


class Version(BaseModel):
    version: str


def install(app: FastAPI, served, created: int) -> None:
    tokenizer, front = served.tokenizer, served.front

    def check_model(model: Optional[str]) -> None:
        served.adapters.resolve(model)               # the base model or a LoRA adapter (same tokenizer), else 404

    @app.post("/tokenize", response_model=TokenizeResponse, responses=errors(400, 401, 404))
    async def tokenize(req: TokenizeRequest):
        check_model(req.model)
        if req.prompt is not None:
            def encode():
                ids = tokenizer.encode(req.prompt)       # refuses text that is not valid Unicode
                return ids if req.add_special_tokens else list(tokenizer.hf.encode(req.prompt,
                                                                                   add_special_tokens=False))
            try:
                ids = await off_the_loop(encode)
            except ValueError as e:
                raise APIError(400, str(e), "prompt") from None
        else:
            chat = ChatCompletionRequest.model_validate(req.model_dump(
                exclude={"return_token_strs", "model", "prompt", "add_special_tokens"}, exclude_none=True))
            ids = (await chat_prompt(chat, tokenizer, front.max_model_len, served.chat))[0]
        strs = tokenizer.hf.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=front.max_model_len, tokens=ids, token_strs=strs)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=errors(400, 401, 404))
    async def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        vocab = len(tokenizer.hf)
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"tokens holds {bad}, outside the vocabulary [0, {vocab})", "tokens")
        return DetokenizeResponse(prompt=await off_the_loop(tokenizer.decode, req.tokens))

    @app.get("/version", response_model=Version)
    async def version():
        return Version(version=__version__)

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=errors(401, 404))
    async def model(model_id: str):
        if model_id != served.model_name:
            card = served.adapters.card(model_id, created, front.max_model_len)      # a LoRA adapter's
            if card is not None:
                return card
            raise APIError(404, f"The model '{model_id}' does not exist", "model", "model_not_found")
        return ModelCard(id=served.model_name, created=created, max_model_len=front.max_model_len)

    health = next(r for r in app.routes if getattr(r, "path", None) == "/health")
    for method in ("GET", "POST"):
        app.add_api_route("/ping", health.endpoint, methods=[method], response_model=health.response_model,
                          responses=errors(503), operation_id=f"ping_{method.lower()}")
    app.include_router(responses_router)
    served.metrics.registry.register(VllmNames(served.metrics, front, served.model_name))
