"""Time one decode step, eager against the static step (eager or compiled), per batch size.

    python -m minillm.bench.decode_step [--model M] [--batch 1 8 32] [--context 128] [--compile]
                                        [--freezing] [--max-autotune] [--threads N] [engine flags]

Each batch is `batch` sequences of `context` tokens feeding one token each, the model's
decode forward plus the logits of every row. "eager" is the engine's usual runner;
"static" the padded static step run eagerly; "compiled" that step through torch.compile
(the first call's time, cold or warm from the inductor cache, is printed as compile_s).
Times are the best of `--repeats` calls, the variants taking turns. The engine flags are
cli/engine_args.py's (CPU, float32 by default); the bench sets the KV pool, seats and length
for its batches itself, and `--compile` adds the "compiled" variant (the engine stays eager).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_config_from_args
from ..sampling_params import SamplingParams
from ..utils import cdiv


class FakeSequence:
    """Just what the runner reads of a sequence in the middle of its decode."""

    def __init__(self, token_ids: list[int], block_table: list[int]):
        self.token_ids, self.block_table = token_ids, block_table
        self.num_computed_tokens = len(token_ids) - 1
        self.prompt_token_ids = self.input_token_ids = token_ids
        self.params, self.spec_token_ids = SamplingParams(), []     # no prompt logprobs, no drafts

    def __len__(self) -> int:
        return len(self.token_ids)

    def input_tokens(self, start: int, end: int) -> list[int]:
        return self.input_token_ids[start:end]


def interleaved_ms(fns: dict, repeats: int) -> dict:
    """Best time in ms of each function, the functions taking turns: on a shared machine a
    burst of someone else's work then slows every contender alike, and the best of many
    tries is the least disturbed one."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return {f"{name}_ms": 1000 * t for name, t in best.items()}


def main(args) -> dict:
    from ..runner.compiled_decode import compile_decode_step
    from ..engine.engine import LLMEngine
    from ..models import load_model
    from ..runner.fixed_shape_decode import StaticDecodeStep

    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    torch.set_num_threads(args.threads or torch.get_num_threads())
    model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype)
    batches, bs = args.batch, config.block_size
    blocks_per_seq = cdiv(args.context + 1, bs)
    engine = LLMEngine(model, tokenizer, dataclasses.replace(
        config, num_kv_blocks=max(batches) * blocks_per_seq + 1, max_num_seqs=max(batches),
        max_model_len=args.context + 64, compile=False))
    step = StaticDecodeStep(model, engine.kv_cache, max(batches), engine.max_model_len)
    run_compiled = compile_decode_step(step, freezing=args.freezing, max_autotune=args.max_autotune) \
        if args.compile else None
    results = {}
    for b in batches:
        seqs = [FakeSequence(list(range(100 + i, 100 + i + args.context + 1)),
                             list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))) for i in range(b)]
        fns = {"eager": lambda: engine.runner.execute([(s, 1) for s in seqs]), "static": lambda: step.run(seqs)}
        row = {}
        if run_compiled is not None:
            t = time.perf_counter()
            run_compiled(seqs)
            row["compile_s"] = time.perf_counter() - t
            fns["compiled"] = lambda: run_compiled(seqs)
        with torch.inference_mode():
            row |= interleaved_ms(fns, args.repeats)
        results[b] = {k: round(v, 2) for k, v in row.items()}
        print(f"batch {b}: {results[b]}", flush=True)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--freezing", action="store_true")
    p.add_argument("--max-autotune", action="store_true")
    add_engine_arguments(p, device="cpu", dtype="float32")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    main(parser.parse_args())
