"""`python -m minillm serve`: load a model, build the engine, serve it with uvicorn.

Engine flags use vLLM's spelling (--max-num-seqs, --enable-prefix-caching, ...); a flag
left out keeps EngineConfig's default. Binds 127.0.0.1 unless told otherwise: a server
that anyone on the network can use should be a decision, not a default.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..attention import backend_names
from ..config import DTYPES, PREEMPTION_MODES, SCHEDULING_POLICIES
from ..quant import quantization_names
from .guards import DEFAULT_MAX_BODY_BYTES

ENGINE_INT_FLAGS = ["block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "swap_space"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name, folder or hub id (default: embedded SmolLM2)")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $MINILLM_API_KEY)")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="answer 503 when this many requests wait already (default: unbounded)")
    for name in ENGINE_INT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        p.add_argument("--" + name.replace("_", "-"), action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default=None)
    p.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default=None)
    p.add_argument("--attention-backend", choices=backend_names(), default=None)
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="auto (default): bfloat16 on GPUs that have it, float16 on older ones, float32 on CPU")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="run decode steps through torch.compile (slow first start; cached after)")
    p.add_argument("--enforce-eager", action="store_true", default=None, help="on CUDA: no CUDA graphs")
    p.add_argument("--quantization", choices=quantization_names(), default=None,
                   help="quantized linears: int8, int4 weight-only; w4a8 int4 weights x int8 activations (default: float)")


def engine_options(args) -> dict:
    names = ENGINE_INT_FLAGS + ["enable_prefix_caching", "enable_chunked_prefill", "scheduling_policy",
                                "preemption_mode", "attention_backend", "dtype", "device", "compile",
                                "enforce_eager", "quantization"]
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def main(args) -> int:
    import torch

    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    from ..models import load_model
    from ..models.loader import DEFAULT_MODEL
    from .app import build_app
    from .run import serve

    if args.max_request_body_bytes < 1 or (args.max_waiting_requests is not None and args.max_waiting_requests < 0):
        raise ValueError("--max-request-body-bytes must be >= 1 and --max-waiting-requests >= 0")
    torch.set_grad_enabled(False)
    config = EngineConfig(**engine_options(args))            # a bad option fails here, before loading
    model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype)
    engine = LLMEngine(model, tokenizer, config)
    name = args.served_model_name or args.model or DEFAULT_MODEL
    app = build_app(engine, name, api_key=args.api_key, max_request_body_bytes=args.max_request_body_bytes,
                    max_waiting_requests=args.max_waiting_requests)
    try:
        serve(app, args.host, args.port)
    except OSError as e:                                     # e.g. the port is taken
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0
