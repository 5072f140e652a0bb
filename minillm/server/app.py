"""The HTTP routes of the OpenAI-compatible server (lesson 07).

    GET  /v1/models             the one model served
    POST /v1/completions        prompt(s) -> text; stream=true sends Server-Sent Events
    POST /v1/chat/completions   messages -> the assistant's reply, through the chat template
    GET  /health                200 while the engine can serve, else 503 and why (readiness; health.py)
    GET  /live                  200 unless the engine can never serve again (liveness)
    GET  /metrics               Prometheus text format (metrics.py)

A streamed response is a series of `data: {json}\\n\\n` events (one chunk per choice's new
text), then `data: [DONE]\\n\\n`; with stream_options.include_usage, a last chunk before
[DONE] carries the token counts (with vLLM's continuous_usage_stats, every chunk carries the
counts so far). The app owns the AsyncEngine: it starts the engine loop
when the server starts and stops it when the server stops. A body above 64 KB is parsed and
validated in a worker process, never on the event loop (body_parsing.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .async_engine import AsyncEngine, RequestStream
from .body_parsing import BodyParser, ParseBigBodiesOffTheLoop
from .errors import APIError, error_body, install_error_handlers
from .guards import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, Guards
from .health import install_health_routes
from . import lora_routes, vllm_surface
from .openapi import STREAMED, errors, install_truthful_openapi
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse,
                        CompletionChoice, CompletionResponse, Delta, ModelCard, ModelList)
from .echo import Echo
from .logprobs import chat_logprobs, completion_logprobs, prompt_logprobs_json
from .serving import Served, chat_prompt, check_options, completion_prompts, start
from .tool_calls import ToolCallStream

log = logging.getLogger("minillm.server")


def build_app(engine, model_name: str, *, api_key: str | None = None,
              max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_waiting_requests: int | None = None, stream_cls: type = RequestStream,
              body_timeout: float = DEFAULT_BODY_TIMEOUT) -> FastAPI:
    """An app serving `engine` (an LLMEngine, which the app now owns) as `model_name`.
    `stream_cls`: a RequestStream subclass for each request's stream (lesson 07's seam)."""
    front = AsyncEngine(engine, max_waiting_requests, stream_cls)
    served = Served(front, engine.tokenizer, model_name, engine.resolved.vocab_size)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        front.start()
        try:
            yield
        finally:
            app.state.body_parser.close()
            await asyncio.to_thread(front.shutdown)

    app = FastAPI(title="minillm", lifespan=lifespan)
    app.router.route_class = ParseBigBodiesOffTheLoop
    install_truthful_openapi(app, api_key)
    app.state.served, app.state.body_parser = served, BodyParser()
    app.add_middleware(Guards, api_key=api_key, max_body_bytes=max_request_body_bytes, body_timeout=body_timeout)
    install_error_handlers(app)
    install_health_routes(app, front)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format"}, **errors()})
    async def metrics():
        return Response(served.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=errors(401))
    async def models():
        return ModelList(data=[ModelCard(id=model_name, created=created, max_model_len=front.max_model_len),
                               *served.adapters.cards(created, front.max_model_len)])     # LoRA adapters

    @app.post("/v1/completions", response_model=CompletionResponse,
              responses={**STREAMED, **errors(400, 401, 404, 500, 503)})
    async def completions(req: CompletionRequest, request: Request):
        check_options(req, served)
        prompts = await completion_prompts(req, served.tokenizer, front.max_model_len)
        gen = await start(served, request, req, prompts, 1 if req.score_only() else req.max_tokens_asked(), "cmpl")
        gen.score_only = req.score_only()
        try:                              # after start(): the engine has checked every token id
            echo = await Echo.of(req, prompts, served.tokenizer) if req.echo else None
        except BaseException:
            gen.stream.abort()
            raise
        now = int(time.time())

        def response(choices, usage=None):
            return CompletionResponse(id=gen.id, created=now, model=req.model or model_name,   # or a LoRA adapter
                                      choices=choices, usage=usage)

        k_top = req.logprobs_k()
        every = req.usage_in_every_chunk()

        if req.stream:
            async def chunks():
                offsets: dict[int, int] = {}
                async for k, text, finish, steps in gen.deltas():
                    lp = None if steps is None else completion_logprobs(*steps, k_top, offsets.get(k, 0))
                    if echo is not None and k not in offsets:          # the choice's first chunk
                        text, lp = echo.prepend(k // req.n, gen.last[k // req.n], text, lp)
                    offsets[k] = lp.text_offset[-1] + len(lp.tokens[-1]) if lp and lp.tokens else offsets.get(k, 0)
                    yield response([CompletionChoice(index=k, text=text, finish_reason=finish, logprobs=lp)],
                                   gen.usage() if every else None)
                if req.stream_options and req.stream_options.include_usage:
                    yield response([], gen.usage())
            return server_sent_events(chunks())
        outs = await gen.final()
        choices = []
        for i, out in enumerate(outs):
            for c in out.outputs:
                text, token_ids, steps = gen.shown(c)
                lp = None if steps is None else completion_logprobs(steps, token_ids, k_top)
                if echo is not None:
                    text, lp = echo.prepend(i, out, text, lp)
                choices.append(CompletionChoice(
                    index=i * req.n + c.index, text=text, finish_reason=gen.finish_reason(c), logprobs=lp,
                    prompt_logprobs=prompt_logprobs_json(out.prompt_logprobs) if req.prompt_logprobs is not None
                    else None))
        return response(sorted(choices, key=lambda c: c.index), gen.usage())

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses={**STREAMED, **errors(400, 401, 404, 500, 503)})
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        check_options(req, served)
        max_tokens = req.max_tokens_asked()
        try:
            k_top = req.logprobs_k()
        except ValueError as e:
            raise APIError(400, str(e), "top_logprobs") from None
        prompts = await chat_prompt(req, served.tokenizer, front.max_model_len, served.chat)
        gen = await start(served, request, req, prompts, max_tokens, "chatcmpl")
        now = int(time.time())
        every = req.usage_in_every_chunk()

        if req.stream:
            def chunk(choices, usage=None):
                usage = usage or (gen.usage() if every else None)
                return ChatCompletionChunk(id=gen.id, created=now, model=req.model or model_name, choices=choices,
                                           usage=usage)

            async def chunks():
                for k in range(req.n):           # OpenAI opens each choice with the role
                    yield chunk([ChatChunkChoice(index=k, delta=Delta(role="assistant", content=""))])
                calls = ToolCallStream(req)
                async for k, text, finish, steps in gen.deltas():
                    lp = None if steps is None else chat_logprobs(*steps, k_top)
                    delta = calls.delta(k, text, finish) if calls.active else Delta(content=text or None)
                    yield chunk([ChatChunkChoice(index=k, delta=delta, finish_reason=calls.finish_reason(finish),
                                                 logprobs=lp)])
                if req.stream_options and req.stream_options.include_usage:
                    yield chunk([], gen.usage())
            return server_sent_events(chunks())
        (out,) = await gen.final()
        calls = ToolCallStream(req)
        choices = [ChatChoice(index=c.index, message=calls.message(c.text), finish_reason=calls.finish_reason(
                              c.finish_reason), logprobs=None if c.logprobs is None else
                              chat_logprobs(c.logprobs, c.token_ids, k_top))
                   for c in sorted(out.outputs, key=lambda c: c.index)]
        return ChatCompletionResponse(id=gen.id, created=now, model=req.model or model_name, choices=choices,
                                      usage=gen.usage(),
                                      prompt_logprobs=prompt_logprobs_json(out.prompt_logprobs))

    vllm_surface.install(app, served, created)      # /tokenize, /v1/responses, vllm:* metrics, ...
    lora_routes.install(app, served.adapters)       # /v1/load_lora_adapter, ... when the environment allows
    return app


def server_sent_events(chunks) -> StreamingResponse:
    """pydantic chunks -> `data: {json}` events, then `data: [DONE]`. The status (200) is sent
    with the first event, so an error after that travels as an event in OpenAI's shape."""
    async def events():
        try:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json()}\n\n"
        except APIError as e:
            yield f"data: {json.dumps(error_body(e.status, e.message, e.param, e.code))}\n\n"
        except Exception as e:
            log.exception("internal error while streaming")
            yield f"data: {json.dumps(error_body(500, f'internal error: {type(e).__name__}'))}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")
