"""Bounded work per request: every count and size a request sends is checked before work starts.

One request must not be able to stall or sink the server:
  - prompts per request: a list of 300k prompts would queue 300k engine requests;
  - prompt text before tokenizing: a text longer than max_model_len tokens could ever hold is
    refused without tokenizing it (tokenizing 4 MB takes seconds). The bound is exact: no token
    of the vocabulary spells more than `longest_token` characters;
  - the waiting queue: finite by default, sized from the KV pool; a request's prompts x n count;
  - stop strings and stop token ids: SamplingParams bounds them (sampling_params.py).
Tokenizing and templating run on one worker thread, never on the event loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools

from .errors import APIError

MAX_PROMPTS_PER_REQUEST = 256      # a batch of prompts in one /v1/completions call
MIN_WAITING_REQUESTS = 256         # the default queue bound is max(this, KV blocks in the pool)
MAX_MESSAGES = 1024                # chat history entries


def default_max_waiting_requests(engine) -> int:
    """A finite queue: at least MIN_WAITING_REQUESTS, or one request per block of the pool."""
    return max(MIN_WAITING_REQUESTS, engine.resolved.num_kv_blocks)


@functools.lru_cache(maxsize=8)
def longest_token(tokenizer) -> int:
    """Characters in the vocabulary's longest token (its byte-level spelling is never shorter
    than the text it decodes to), so len(text) > longest * max_model_len can never fit."""
    return max(len(t) for t in tokenizer.hf.get_vocab())


def check_text_fits(texts: list[str], tokenizer, max_model_len: int, param: str) -> None:
    bound = longest_token(tokenizer) * max_model_len
    total = sum(len(t) for t in texts)
    if any(len(t) > bound for t in texts) or (param == "messages" and total > bound):
        raise APIError(400, f"the {param} has {total} characters: more than max_model_len={max_model_len} "
                            f"tokens can ever hold ({bound} characters at most); shorten it", param)


def check_prompt_count(count: int) -> None:
    if count > MAX_PROMPTS_PER_REQUEST:
        raise APIError(400, f"prompt is a list of {count} prompts; at most {MAX_PROMPTS_PER_REQUEST} "
                            "per request: send several requests", "prompt")


_TOKENIZER_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minillm-tokenizer")


async def off_the_loop(fn, *args):
    """fn(*args) on the tokenizer's thread: the event loop keeps serving every other stream."""
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_THREAD, functools.partial(fn, *args))
