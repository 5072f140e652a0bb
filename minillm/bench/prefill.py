"""Time to first token of one long prompt, alone: how fast prefill runs.

A prompt of `PREFILL_TOKENS` random token ids, `max_tokens=1`, timed from `add_request` to
the request's end (its first token sampled): the engine's scheduling, the prefill forward
and the sampling, as a user waits for them. Each run gets its own prompt, so the prefix
cache has nothing to reuse; the first run warms up (threads, buffers), the fastest of the
rest counts. llama.cpp gets the same prompts (`llama_cpp_batched.prefill`).
"""
from __future__ import annotations

import random
import time

from ..sampling_params import SamplingParams

PREFILL_TOKENS = 512
PREFILL_RUNS = 3


def prefill_prompts(vocab_size: int, seed: int = 0, runs: int = PREFILL_RUNS,
                    length: int = PREFILL_TOKENS) -> list[list[int]]:
    """runs + 1 prompts (the first a warm-up) of token ids clear of the special tokens."""
    rng = random.Random(f"prefill-{seed}")
    return [[rng.randrange(1000, vocab_size) for _ in range(length)] for _ in range(runs + 1)]


def timed_prefill(engine, prompts: list[list[int]]) -> dict:
    """{"ttft_s", "tok_per_s", "first_tokens"}: the fastest of prompts[1:] (prompts[0] warms up)."""
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times, first = [], []
    for n, prompt in enumerate(prompts):
        start = time.perf_counter()
        engine.add_request(f"prefill-{n}-{time.monotonic_ns()}", prompt, params)
        outputs = []
        while engine.has_unfinished_requests():
            outputs = engine.step() or outputs
        times.append(time.perf_counter() - start)
        first.append(outputs[0].outputs[0].token_ids[0])
    best = min(range(1, len(prompts)) if len(prompts) > 1 else [0], key=lambda i: times[i])
    return {"ttft_s": times[best], "tok_per_s": len(prompts[best]) / times[best], "first_tokens": first}
