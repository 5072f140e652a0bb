"""`python -m minillm serve`: load a model, build the engine, serve it with uvicorn.

Engine flags come from EngineConfig's fields with vLLM's spelling (--max-num-seqs,
--enable-prefix-caching, ...: cli/engine_args.py); a flag left out keeps EngineConfig's default.
With --data-parallel-size N > 1, N such servers run as replicas behind a routing front
(data_parallel/). Binds 127.0.0.1 unless told otherwise: a server that anyone on the network
can use should be a decision, not a default.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..cli.engine_args import add_engine_arguments, engine_config_from_args, engine_options
from .data_parallel.choice import DEFAULT_LOAD_BOUND
from .data_parallel.healing import MAX_RESTARTS
from .data_parallel.health import REPLICA_TIMEOUT
from .data_parallel.lifeline import exit_with_parent
from .data_parallel.router import POLICIES
from .chat_setup import add_chat_arguments
from .guards import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES
from .lora_models import parse_lora_modules
from .run import Timeouts
from ..distributed.launch import add_node_addr, from_env, headless

__all__ = ["add_arguments", "engine_options", "main"]      # engine_options: engine_args's, for callers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name, folder or hub id (default: embedded SmolLM2)")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $MINILLM_API_KEY)")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="answer 503 when this many sequences wait already (a request's prompts x n count; "
                        "default: max(256, the KV pool's blocks))")
    p.add_argument("--shutdown-timeout", type=float, default=Timeouts.shutdown,
                   help="seconds requests in flight get after SIGTERM/SIGINT; then they end with an error")
    p.add_argument("--header-timeout", type=float, default=Timeouts.header,
                   help="seconds a client has to send a request's headers")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
                   help="seconds a client has to send a request's body")
    p.add_argument("--timeout-keep-alive", type=float, default=Timeouts.keep_alive,
                   help="an idle keep-alive connection is closed after this many seconds")
    p.add_argument("--data-parallel-size", type=int, default=1,
                   help="replicas, each its own process and KV pool, behind one routing front (default: 1, "
                        "no front)")
    p.add_argument("--router-policy", choices=POLICIES, default=None,
                   help="how the front picks a replica: cache-aware (the longest cached prompt prefix, within "
                        "a load bound; the default) or round-robin")
    p.add_argument("--router-load-bound", type=int, default=DEFAULT_LOAD_BOUND,
                   help="cache-aware: requests in flight the best match may be ahead of the least loaded replica")
    p.add_argument("--replica-timeout", type=float, default=REPLICA_TIMEOUT,
                   help="seconds a replica may leave its health checks unanswered before its requests in flight "
                        "end with an error (a silent replica, not a slow generation)")
    p.add_argument("--max-replica-restarts", type=int, default=MAX_RESTARTS,
                   help="times in a row the front starts a replica that exited again, with backoff (0: never)")
    p.add_argument("--replica-url", action="append", default=None, metavar="URL",
                   help="a running `minillm serve` (any machine) the front routes to beside its own replicas "
                        "(repeatable; health-checked, never restarted; requests are forwarded to it as they came)")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)   # a replica's lifeline
    p.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help="LoRA adapters served by name (needs --enable-lora): name=path or "
                        '\'{"name": ..., "path": ...}\'; a request\'s "model" picks one (lora_models.py)')
    add_chat_arguments(p)
    add_node_addr(p)                                          # multi-node: distributed/launch.py
    add_engine_arguments(p)


def main(args) -> int:
    from_env(args)                                            # torchrun / env:// variables: distributed/launch.py
    if (args.node_rank or 0) > 0:                             # a headless node of a multi-node group
        return headless(args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1, args.nnodes or 1,
                        args.node_rank, args.dist_init_addr, args.node_addr)
    front = args.data_parallel_size > 1 or bool(args.replica_url)      # replicas behind a routing front
    if args.data_parallel_size < (0 if args.replica_url else 1) or args.router_load_bound < 0:
        raise ValueError("--data-parallel-size must be >= 1 (>= 0 with --replica-url) and --router-load-bound >= 0")
    if args.router_policy is not None and args.data_parallel_size + len(args.replica_url or []) < 2:
        raise ValueError("--router-policy routes between replicas: it needs --data-parallel-size 2 or more "
                         "(or --replica-url)")
    if args.exit_with_parent:
        exit_with_parent()
    if args.max_request_body_bytes < 1 or (args.max_waiting_requests is not None and args.max_waiting_requests < 0):
        raise ValueError("--max-request-body-bytes must be >= 1 and --max-waiting-requests >= 0")
    timeouts = Timeouts(args.shutdown_timeout, args.header_timeout, args.timeout_keep_alive)
    if min(timeouts.shutdown, timeouts.header, timeouts.keep_alive, args.body_timeout) <= 0:
        raise ValueError("--shutdown-timeout, --header-timeout, --body-timeout and --timeout-keep-alive must be > 0")
    lora_modules = parse_lora_modules(args.lora_modules)
    if lora_modules and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    if front:                                                # LoRA too: every replica gets the adapters
        from .data_parallel.main import main as serve_data_parallel
        return serve_data_parallel(args)
    import torch

    from ..engine.engine import LLMEngine
    from ..models import load_model
    from ..models.loader import DEFAULT_MODEL
    from ..models.embedded import HUB_ID
    from .app import build_app
    from .chat_setup import chat_settings_from_args
    from .run import serve

    torch.set_grad_enabled(False)
    config = engine_config_from_args(args)                   # a bad option fails here, before loading
    model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype,
                                  load_format=config.load_format)
    chat = chat_settings_from_args(args, tokenizer, embedded=args.model in (None, DEFAULT_MODEL, HUB_ID))
    engine = LLMEngine(model, tokenizer, config)
    engine.output_processor.structured.allow_additional_properties = chat.allow_additional_properties
    name = args.served_model_name or args.model or DEFAULT_MODEL
    if getattr(model, "dummy_weights", None) and not args.served_model_name:
        name = f"dummy-weights/{name}"                       # seeded random weights: said in the name clients see
    app = build_app(engine, name, api_key=args.api_key, max_request_body_bytes=args.max_request_body_bytes,
                    max_waiting_requests=args.max_waiting_requests, body_timeout=args.body_timeout)
    app.state.served.chat = chat
    for lora_name, lora_path in lora_modules:                # read and checked now: a bad folder fails here
        app.state.served.adapters.add_now(lora_name, lora_path)
    try:
        serve(app, args.host, args.port, timeouts)
    except OSError as e:                                     # e.g. the port is taken
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    if app.state.served.front.fatal:                         # the engine gave up: let the orchestrator restart us
        print(f"error: the engine stopped: {app.state.served.front.failure}", file=sys.stderr)
        return 1
    return 0
