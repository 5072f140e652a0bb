"""Command line:
    python -m minillm generate "PROMPT" [--model M] [--chat] [--max-tokens N] [--temperature T] [--seed S]
    python -m minillm bench throughput [--model M] [--num-prompts 64] [--seed 0] [--json FILE] [--quick]
    python -m minillm bench kv-cache [--model M] [--prompt-tokens 256] [--max-tokens 64]
    python -m minillm serve [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [engine flags]
"""
from __future__ import annotations

import argparse
import sys


def cmd_generate(args) -> int:
    import torch

    from .static_batch import generate_with_cache
    from .models import load_model

    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.model, device=args.device)
    prompt = (tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
              if args.chat else args.prompt)
    from .sampling import SamplingParams
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop)
    out = generate_with_cache(model, tokenizer, prompt, params)
    print(out.text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt")
    g.add_argument("prompt")
    g.add_argument("--model", default=None, help="model name, folder or hub id (default: embedded SmolLM2)")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    from .bench import kv_cache, throughput
    t = bsub.add_parser("throughput", help="offline throughput vs transformers static batching")
    throughput.add_arguments(t)
    t.set_defaults(func=lambda a: (throughput.main(a), 0)[1])
    k = bsub.add_parser("kv-cache", help="naive generation vs the contiguous KV cache")
    kv_cache.add_arguments(k)
    k.set_defaults(func=lambda a: (kv_cache.main(a), 0)[1])
    from .server import cli as serve_cli
    s = sub.add_parser("serve", help="serve the OpenAI API over HTTP (needs the serve extra)")
    serve_cli.add_arguments(s)
    s.set_defaults(func=serve_cli.main)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
