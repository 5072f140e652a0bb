"""How many operations one decode step asks of PyTorch, llama.py's layers against the fused ones.

    python -m minillm.bench.op_count [--model M] [--batch 1] [--context 128] [engine flags]

Every call into native code here is an operation the dispatcher sees (aten ops, and the C
kernels as `torch.ops.minillm.*`), so a `TorchDispatchMode` counts them all; lesson 08 counts
the same way (1,626 for the embedded model at batch 1 before this engine fused its layers).
Each costs a few microseconds before any arithmetic, which at batch 1 is most of a step.
"plain" runs the engine's model with llama.py's layers as they are (q, k, v, gate, up as
separate linears, RMSNorm and RoPE as torch ops), "fused" with runner/engine_model.py's
default, models/fused_layer.py. Without the C++ ops (no C++ compiler) the C kernels are
ctypes calls the dispatcher does not see, and the counts say less.
"""
from __future__ import annotations

import argparse
import dataclasses
import collections
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..cli.engine_args import add_engine_arguments, engine_config_from_args
from ..engine.engine import LLMEngine
from ..models import load_model
from .decode_step import FakeSequence


class CountOps(TorchDispatchMode):
    """Counts the operations run inside it, by name."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def decode_batch(batch: int, context: int, block_size: int) -> list:
    """`batch` sequences of `context` cached tokens, each about to feed one more."""
    blocks = -(-(context + 1) // block_size)
    return [(FakeSequence(list(range(100 + i, 101 + i + context)), list(range(i * blocks, (i + 1) * blocks))), 1)
            for i in range(batch)]


def count_step_ops(engine, batch: int, context: int) -> collections.Counter:
    scheduled = decode_batch(batch, context, engine.config.block_size)
    engine.runner.execute(scheduled)                     # first call: kernels load, ops go native
    with CountOps() as counter:
        engine.runner.execute(scheduled)
    return counter.counts


def measure(args) -> dict:
    results = {}
    for variant in ("plain", "fused"):
        config = engine_config_from_args(args)
        blocks = args.batch * (-(-(args.context + 1) // config.block_size)) + 1
        config = dataclasses.replace(config, num_kv_blocks=blocks, max_num_seqs=max(args.batch, 1))
        model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype)
        if variant == "plain":                            # the engine's model with llama.py's layers as they are
            with mock.patch("minillm.runner.engine_model.fuse_decoder_layers", lambda m: 0):
                engine = LLMEngine(model, tokenizer, config)
        else:
            engine = LLMEngine(model, tokenizer, config)
        results[variant] = count_step_ops(engine, args.batch, args.context)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--top", type=int, default=12, help="how many op names to list")
    add_engine_arguments(parser, dtype="float32")
    args = parser.parse_args(argv)
    results = measure(args)
    print(f"operations in one decode step, batch {args.batch}, context {args.context}:")
    for variant, counts in results.items():
        print(f"  {variant:>6}: {sum(counts.values()):>5}   " +
              ", ".join(f"{name.split('.')[-1]} {n}" for name, n in counts.most_common(args.top)))


if __name__ == "__main__":
    main()
