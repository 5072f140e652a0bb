"""What a faster float costs: the engine's greedy tokens in another dtype against float32's, and
whether a request's tokens depend on the batch it ran in.

    python -m minillm.bench.dtype_cost [--dtype bfloat16] [--num-prompts 16] [--max-tokens 64] [--model M]

Why: on a CPU with AMX or AVX-512 BF16, torch's bfloat16 matmuls (oneDNN) run several times
faster than float32's, so `--dtype bfloat16` speeds a batch up (`bench throughput --dtype bfloat16`
says how much). But bfloat16 keeps 8 bits of mantissa, so its greedy tokens leave float32's
sooner or later, and its matmuls pick their kernels by the number of rows, so a row's sums can
change with its batch. This measures both on the throughput workload's prompts (same seed, real
weights: on dummy weights the tokens mean nothing):

  - tokens against float32: how many requests produce float32's greedy tokens all the way, and
    at which output position the others first differ;
  - batch dependence, for float32 and for the dtype: each request run alone against the same
    request among all of them; how many come out different.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from ..engine.engine import LLMEngine
from ..sampling_params import SamplingParams
from .model_args import add_model_arguments, load, print_header, resolve_model_args
from .throughput import make_workload


def greedy(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in engine.generate(prompts, [params] * len(prompts))]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output position where a and b differ, or None if they are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def batch_dependence(engine, prompts, max_tokens) -> tuple[list[list[int]], int]:
    """(tokens of the whole batch, how many requests gave other tokens when run alone)."""
    together = greedy(engine, prompts, max_tokens)
    alone = [greedy(engine, [p], max_tokens)[0] for p in prompts]
    return together, sum(a != t for a, t in zip(alone, together))


@torch.inference_mode()
def measure(model, tokenizer, prompts, max_tokens: int, dtype: str, **options) -> dict:
    reference, ref_moved = batch_dependence(LLMEngine(model, tokenizer, dtype="float32", **options),
                                            prompts, max_tokens)
    tokens, moved = batch_dependence(LLMEngine(model, tokenizer, dtype=dtype, **options), prompts, max_tokens)
    diverged = [d for d in (first_difference(t, r) for t, r in zip(tokens, reference)) if d is not None]
    return {"requests": len(prompts), "max_tokens": max_tokens, "dtype": dtype,
            "equal_to_float32": len(prompts) - len(diverged), "first_difference_positions": diverged,
            "batch_dependent_float32": ref_moved, "batch_dependent": moved}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = resolve_model_args(parser.parse_args(argv))
    print_header(args)
    model, tokenizer = load(args, device="cpu")
    prompts = [p for p, _ in make_workload(args.num_prompts, args.seed, model.config.vocab_size)]
    r = measure(model, tokenizer, prompts, args.max_tokens, args.dtype, max_num_seqs=len(prompts))
    spread = r["first_difference_positions"]
    print(f"{r['requests']} requests of the throughput workload (seed {args.seed}), {r['max_tokens']} greedy tokens each")
    print(f"{args.dtype} tokens equal to float32's all the way: {r['equal_to_float32']} of {r['requests']}"
          + (f"; the others first differ at output position median {statistics.median(spread):.0f} "
             f"(min {min(spread)}, max {max(spread)})" if spread else ""))
    print(f"requests whose tokens change between alone and in the batch: float32 "
          f"{r['batch_dependent_float32']} of {r['requests']}, {args.dtype} {r['batch_dependent']} of {r['requests']}")
    return r


if __name__ == "__main__":
    main()
