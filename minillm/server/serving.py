"""From an OpenAI request to engine requests, and from engine outputs back to choices.

    CompletionRequest / ChatCompletionRequest
        │ check model and options, tokenize (chat: through the model's chat template)
        ▼
    one engine request per prompt, each with its SamplingParams ──► AsyncEngine.add
        │ outputs as they arrive (each carries the whole text so far)
        ▼
    Generation.deltas(): (choice index, new text, finish reason)  ──► SSE chunks, or one response

Choices are numbered prompt-major, as OpenAI does: prompt i's j-th sample is choice i * n + j.
The engine's text only ever grows (stopping.py holds back what is unsettled), so a
choice's new text is simply `text[len(sent):]`.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid

from ..outputs import RequestOutput
from ..sampling_params import MAX_LOGIT_BIAS, SamplingParams
from .async_engine import AsyncEngine, QueueFull, RequestStream
from .chat_setup import ChatSettings, bind_chat
from .errors import APIError, bad_request
from .lora_models import ServedAdapters
from .limits import MAX_MESSAGES, check_prompt_count, check_text_fits, off_the_loop
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .structured import constraint_field, structured_spec
from .responses import PromptTokensDetails, Usage


class Served:
    """What the handlers share: the engine's front, its tokenizer, metrics, the model's name."""

    def __init__(self, front: AsyncEngine, tokenizer, model_name: str, vocab_size: int | None = None):
        self.front, self.tokenizer, self.model_name = front, tokenizer, model_name
        self.vocab_size = vocab_size            # the model's logits width (logit_bias ids are checked on it)
        self.metrics = Metrics(front)
        self.chat = ChatSettings()              # templates and tool calls (chat_setup.py; serve sets its flags)
        # LoRA adapters by name (lora_models.py); the engine's LoRAManager when it has enable_lora
        self.adapters = ServedAdapters(model_name, getattr(getattr(front, "engine", None), "lora", None))


def check_options(req: SamplingFields, served: Served) -> None:
    served.adapters.resolve(req.model)          # the base model, a LoRA adapter, or a 404 naming `model`
    name = req.unsupported()
    if name is not None:
        raise APIError(400, f"{name} is not supported yet", name, "unsupported_parameter")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    if req.prompt_logprobs is not None and req.stream:
        raise APIError(400, "prompt_logprobs is not available with stream=true (as in vLLM)", "prompt_logprobs")


async def completion_prompts(req: CompletionRequest, tokenizer, max_model_len: int) -> list[list[int]]:
    """A string, a list of strings, a list of token ids or a list of them -> token id lists.
    Counts and sizes are checked first (limits.py); tokenizing runs off the event loop."""
    p = req.prompt
    if isinstance(p, list) and not p:
        raise APIError(400, "prompt must not be an empty list", "prompt")
    if isinstance(p, str) or isinstance(p[0], str):
        texts = [p] if isinstance(p, str) else p
        check_prompt_count(len(texts))
        check_text_fits(texts, tokenizer, max_model_len, "prompt")
        try:
            return await off_the_loop(lambda: [tokenizer.encode(text) for text in texts])
        except ValueError as e:
            raise APIError(400, str(e), "prompt") from None
    prompts = [p] if isinstance(p[0], int) else list(p)
    check_prompt_count(len(prompts))
    return prompts


async def chat_prompt(req: ChatCompletionRequest, tokenizer, max_model_len: int,
                      chat: ChatSettings | None = None) -> list[list[int]]:
    if len(req.messages) > MAX_MESSAGES:
        raise APIError(400, f"messages holds {len(req.messages)} entries; at most {MAX_MESSAGES}", "messages")
    check_text_fits([t for m in req.messages for t in m.texts()], tokenizer, max_model_len, "messages")
    messages = [m.as_template_input() for m in req.messages]
    if req.continue_final_message and req.generation_prompt():
        raise APIError(400, "add_generation_prompt and continue_final_message cannot both be true",
                       "add_generation_prompt")
    try:
        template_kwargs = tokenizer.check_template_kwargs(req.chat_template_kwargs or {})
    except ValueError as e:
        raise APIError(400, str(e), "chat_template_kwargs") from None
    inputs = bind_chat(req, chat or ChatSettings())         # tools and template
    try:
        return [await off_the_loop(functools.partial(
            tokenizer.apply_chat_template, messages, req.generation_prompt(),
            continue_final_message=req.continue_final_message, template_kwargs=template_kwargs, **inputs))]
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), "chat_template" if req.chat_template is not None else "messages") from None


def logit_bias(req: SamplingFields, vocab_size: int | None) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} -> {token id: bias}, every id in the vocabulary."""
    if req.logit_bias is None:
        return None
    if len(req.logit_bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias has {len(req.logit_bias)} entries; at most {MAX_LOGIT_BIAS}", "logit_bias")
    bad = next((k for k in req.logit_bias if not (k.isascii() and k.isdigit())), None)
    if bad is not None:
        raise APIError(400, f"logit_bias keys are token ids (decimal integers as strings), got {bad!r:.40}",
                       "logit_bias")
    bias = {int(k): v for k, v in req.logit_bias.items()}
    bad = next((t for t in bias if vocab_size is not None and t >= vocab_size), None)
    if bad is not None:
        raise APIError(400, f"logit_bias has token id {bad}, outside the vocabulary [0, {vocab_size})", "logit_bias")
    return bias


def sampling_params(req: SamplingFields, max_tokens: int | None, prompt_len: int, max_model_len: int,
                    bias: dict[int, float] | None = None):
    """SamplingParams for one prompt. Without max_tokens, the request may run to
    max_model_len, as in vLLM. SamplingParams checks every range and names the field."""
    if max_tokens is None:
        max_tokens = max(1, max_model_len - prompt_len)
    given = {k: v for k, v in dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                                   presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                                   repetition_penalty=req.repetition_penalty).items() if v is not None}
    try:
        return SamplingParams(n=req.n, max_tokens=max_tokens, seed=req.seed, stop=req.stop,
                              stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
                              logprobs=req.logprobs_k(), prompt_logprobs=req.prompt_logprobs_k(),
                              logit_bias=bias, min_tokens=req.min_tokens,
                              include_stop_str_in_output=req.include_stop_str_in_output,
                              skip_special_tokens=req.skip_special_tokens,
                              spaces_between_special_tokens=req.spaces_between_special_tokens,
                              structured_outputs=structured_spec(req), **given)
    except (ValueError, TypeError) as e:
        raise bad_request(e, constraint_field(req)) from None


async def start(served: Served, http_request, req: SamplingFields, prompts: list[list[int]],
                max_tokens: int | None, prefix: str) -> "Generation":
    bias = logit_bias(req, served.vocab_size)
    params = [sampling_params(req, max_tokens, len(p), served.front.max_model_len, bias) for p in prompts]
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    ids = [f"{request_id}-{i}" for i in range(len(prompts))]
    try:
        stream = await served.front.add(ids, prompts, params, req.priority, served.adapters.resolve(req.model))
    except QueueFull as e:
        raise APIError(503, str(e), code="queue_full") from None
    except (ValueError, TypeError) as e:
        raise bad_request(e, constraint_field(req)) from None
    return Generation(served, http_request, stream, request_id, req.n, [len(p) for p in prompts])


class Generation:
    """One HTTP request's generation: its outputs as text deltas, or all at once. With
    `score_only` (echo and max_tokens 0) the one token the engine samples is not shown."""

    def __init__(self, served: Served, http_request, stream: RequestStream, request_id: str, n: int,
                 prompt_lens: list[int]):
        self.http_request, self.stream, self.id, self.n = http_request, stream, request_id, n
        self.score_only = False
        self.prompt_tokens = sum(prompt_lens)
        self.clocks = [served.metrics.clock() for _ in stream.request_ids]
        self.last: list[RequestOutput | None] = [None] * len(stream.request_ids)

    async def deltas(self):
        """Yield (choice index, new text, finish reason or None, logprob steps of the tokens
        generated since the last delta, or None) as the engine produces them."""
        sent: dict[int, str] = {}
        sent_tokens: dict[int, int] = {}
        reported: set[int] = set()
        async with self.stream, abort_on_disconnect(self.http_request, self.stream):
            async for i, out in self.stream:
                self.clocks[i].observe(out)
                self.last[i] = out
                error = getattr(out, "error", None)
                if error is not None:
                    raise APIError(500, f"the engine failed this request: {error}", code="engine_error")
                for o in out.outputs:
                    k = i * self.n + o.index
                    text = "" if self.score_only else o.text[len(sent.get(k, "")):]
                    finish = self.finish_reason(o) if o.finish_reason and k not in reported else None
                    if text or finish:
                        sent[k] = o.text
                        if finish:
                            reported.add(k)
                        steps = None
                        if o.logprobs is not None and not self.score_only:
                            first, sent_tokens[k] = sent_tokens.get(k, 0), len(o.logprobs)
                            steps = (o.logprobs[first:], o.token_ids[first:len(o.logprobs)])
                        yield k, text, finish, steps

    def finish_reason(self, choice) -> str | None:
        """"length" for a score-only request (it asked for no tokens), else the engine's reason."""
        return "length" if self.score_only and choice.finish_reason not in (None, "abort", "error") \
            else choice.finish_reason

    def shown(self, choice) -> tuple[str, list[int], list | None]:
        """(text, token ids, logprob steps) of a finished choice as the client sees them."""
        if self.score_only:
            return "", [], None
        return choice.text, choice.token_ids, choice.logprobs

    async def final(self) -> list[RequestOutput]:
        """Run to the end; the last output of each prompt."""
        async for _ in self.deltas():
            pass
        if any(out is None or not out.finished for out in self.last):
            raise APIError(400, "the client closed the connection", code="client_disconnected")
        return self.last

    def usage(self) -> Usage:
        """The token counts so far (final once every output finished)."""
        outs = [o for o in self.last if o is not None]
        prompt = self.prompt_tokens
        completion = 0 if self.score_only else sum(len(c.token_ids) for o in outs for c in o.outputs)
        cached = sum(o.num_cached_tokens for o in outs)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


@contextlib.asynccontextmanager
async def abort_on_disconnect(http_request, stream: RequestStream):
    """Abort the stream as soon as the client disconnects, even while it waits in the queue
    and no chunk is being sent (a failed send would notice only at the next token)."""
    async def watch():
        while (await http_request.receive())["type"] != "http.disconnect":
            pass
        stream.abort()

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
