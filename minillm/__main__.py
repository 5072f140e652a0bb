"""Command line:
    python -m minillm generate "PROMPT" [--model M] [--chat] [--max-tokens N] [--temperature T] [engine flags]
    python -m minillm chat [--model M] [--system TEXT] [--url URL] [engine flags]
    python -m minillm serve [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [engine flags]
    python -m minillm worker --nnodes N --node-rank R --dist-init-addr HOST:PORT [--pipeline-parallel-size P]
    python -m minillm bench throughput [--model M] [--num-prompts 64] [--json FILE] [--quick] [engine flags]
    python -m minillm bench serve [--request-rate 1 4 inf] [--against transformers] [--quick] [engine flags]
    python -m minillm bench kv-cache [--model M] [--prompt-tokens 256] [--max-tokens 64]
    python -m minillm bench roofline [--batch-sizes 1 8 32] [--context 512] [--plot FILE] [--quick] [engine flags]
    python -m minillm bench quant [--model M] [--quick] [--against llama.cpp] [--compile] [engine flags]
    python -m minillm bench spec [--model M] [--max-tokens 96] [--json FILE] [--quick] [engine flags]
    python -m minillm bench overhead [--batch 1 8 64] [--context 128] [--profile N] [--json FILE] [engine flags]
    python -m minillm bench tp [--model M] [--sizes 1 3] [--batch 8] [--json FILE] [--quick]
    python -m minillm bench pp [--model M] [--stages 1 2] [--batch 8] [--json FILE] [--quick]
    python -m minillm bench lora [--model M] [--adapters 1 4 16] [--delta grouped packed] [--json FILE] [--quick]

Engine flags: every EngineConfig field (--block-size, --enable-prefix-caching, ...; see `--help`
of a command, and minillm/cli/engine_args.py).
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; each sets `func`, what runs the parsed command."""
    from .bench import kv_cache, lora, overhead, pp, quant, roofline, serve, spec, throughput, tp
    from .cli import chat, generate
    from .server import cli as serve_cli
    from .distributed import launch

    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, text in (("generate", generate, "complete one prompt, streaming the tokens as they come"),
                               ("chat", chat, "an interactive multi-turn chat in the terminal"),
                               ("serve", serve_cli, "serve the OpenAI API over HTTP (needs the serve extra)"),
                               ("worker", launch, "a headless node of a multi-node group (distributed/launch.py)")):
        p = sub.add_parser(name, help=text)
        module.add_arguments(p)
        p.set_defaults(func=module.main)
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name, module, text in (("throughput", throughput, "offline throughput vs transformers static batching"),
                               ("serve", serve, "a server under Poisson load: TTFT, TPOT, ITL, throughput"),
                               ("kv-cache", kv_cache, "naive generation vs the contiguous KV cache"),
                               ("roofline", roofline, "a decode step's bytes and FLOPs vs the measured roofline"),
                               ("quant", quant, "float32 vs int8 vs int4 weights (and llama.cpp): decode, floors"),
                               ("spec", spec, "speculative decoding (n-gram) vs none and transformers' prompt lookup"),
                               ("overhead", overhead, "the engine's own time per decode step, outside the forward"),
                               ("tp", tp, "tensor parallelism: step time split into compute and collectives, bytes"),
                               ("pp", pp, "pipeline parallelism: compute vs transfers per stage, the idle fraction"),
                               ("lora", lora, "batched LoRA over 1/4/16 adapters vs the base model vs merged copies")):
        p = bsub.add_parser(name, help=text)
        module.add_arguments(p)
        p.set_defaults(func=lambda a, module=module: (module.main(a), 0)[1])
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
