"""Command line:
    python -m minillm generate "PROMPT" [--model M] [--chat] [--max-tokens N] [--temperature T] [--seed S]
    python -m minillm chat [--model M] [--system TEXT] [--url URL]
    python -m minillm serve [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [engine flags]
    python -m minillm bench throughput [--model M] [--num-prompts 64] [--seed 0] [--json FILE] [--quick]
    python -m minillm bench serve [--request-rate 1 4 inf] [--against transformers] [--json FILE] [--quick]
    python -m minillm bench kv-cache [--model M] [--prompt-tokens 256] [--max-tokens 64]
    python -m minillm bench roofline [--batch-sizes 1 8 32] [--context 512] [--plot FILE] [--json FILE] [--quick]
    python -m minillm bench quant [--model M] [--quick] [--json FILE] [--against llama.cpp] [--compile]
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    from .cli import chat as cli_chat

    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt, streaming the tokens as they come")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    cli_chat.add_sampling_arguments(g)
    g.set_defaults(func=cli_chat.cmd_generate)
    c = sub.add_parser("chat", help="an interactive multi-turn chat in the terminal")
    c.add_argument("--system", default=None, help="a system prompt")
    c.add_argument("--url", default=None, help="talk to a running `minillm serve` at this URL instead")
    c.add_argument("--api-key", default=None, help="the server's key, with --url")
    cli_chat.add_sampling_arguments(c)
    c.set_defaults(func=cli_chat.cmd_chat)
    from .server import cli as serve_cli
    s = sub.add_parser("serve", help="serve the OpenAI API over HTTP (needs the serve extra)")
    serve_cli.add_arguments(s)
    s.set_defaults(func=serve_cli.main)
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    from .bench import kv_cache, quant, roofline, serve, throughput
    for name, module, text in (("throughput", throughput, "offline throughput vs transformers static batching"),
                               ("serve", serve, "a server under Poisson load: TTFT, TPOT, ITL, throughput"),
                               ("kv-cache", kv_cache, "naive generation vs the contiguous KV cache"),
                               ("roofline", roofline, "a decode step's bytes and FLOPs vs the measured roofline"),
                               ("quant", quant, "float32 vs int8 vs int4 weights (and llama.cpp): decode, floors")):
        p = bsub.add_parser(name, help=text)
        module.add_arguments(p)
        p.set_defaults(func=lambda a, module=module: (module.main(a), 0)[1])
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
