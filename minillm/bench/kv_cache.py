"""Naive generation (recompute everything each step) vs the contiguous KV cache, same
prompt, same greedy tokens, measured side by side in one run.

    python -m minillm bench kv-cache [--model M] [--prompt-tokens 256] [--max-tokens 64]
"""
from __future__ import annotations

import time

import torch

from ..baselines.static_batching import generate_with_cache
from ..models import load_model
from ..baselines.naive_generation import generate_naive
from ..sampling_params import SamplingParams


def main(args) -> dict:
    model, tokenizer = load_model(args.model, device=args.device)
    text = "The history of the city goes back many centuries. " * 200
    prompt = tokenizer.encode(text)[:args.prompt_tokens]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = {}
    for name, fn in (("naive (no cache)", generate_naive), ("contiguous KV cache", generate_with_cache)):
        generate_with_cache(model, tokenizer, prompt[:8], SamplingParams(temperature=0, max_tokens=2))  # warm up
        start = time.perf_counter()
        out = fn(model, tokenizer, prompt, params)
        rows[name] = (time.perf_counter() - start, out.token_ids)
    (t_naive, naive), (t_cache, cached) = rows.values()
    assert naive == cached, "the two paths disagree on greedy tokens"
    print(f"prompt {len(prompt)} tokens, {args.max_tokens} generated, device {model.device}, "
          f"{torch.get_num_threads()} threads")
    for name, (t, _) in rows.items():
        print(f"{name:<22}{t:>8.2f} s{args.max_tokens / t:>10.1f} tok/s")
    print(f"speed-up of the cache: {t_naive / t_cache:.1f}x")
    return {"naive_tok_per_s": args.max_tokens / t_naive, "cache_tok_per_s": args.max_tokens / t_cache}


def add_arguments(p) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default=None)
