"""The terminal front ends: `python -m minillm generate` and `python -m minillm chat`.

Both run on the engine (not on lesson 02's loop) and print tokens as they come: each
engine step returns the request's text so far, and only the new part is printed.
`chat` keeps the conversation and sends it through the model's chat template every
turn (the prefix cache makes the repeated history cheap); with `--url` it talks to a
running `python -m minillm serve` through the official `openai` client instead.
"""
from __future__ import annotations

import sys

from ..config import DTYPES
from ..quant import quantization_names
from ..sampling_params import SamplingParams


def stream_engine(engine, request_id: str, prompt, params: SamplingParams, out=sys.stdout):
    """Run one request on `engine`, writing its text as it grows; returns the final output."""
    engine.add_request(request_id, prompt, params)
    shown, final = 0, None
    while final is None:
        for o in engine.step():
            if o.request_id != request_id:
                continue
            text = o.outputs[0].text
            out.write(text[shown:])
            out.flush()
            shown = len(text)
            if o.finished:
                final = o
    if final.error:
        raise RuntimeError(final.error)
    return final


def params_from(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop=args.stop)


def make_engine(args):
    from ..engine.engine import LLMEngine
    from ..models import load_model
    model, tokenizer = load_model(args.model, device=args.device, dtype=getattr(args, "dtype", "auto"))
    return LLMEngine(model, tokenizer, compile=getattr(args, "compile", False),
                     quantization=getattr(args, "quantization", None)), tokenizer


def cmd_generate(args) -> int:
    engine, tokenizer = make_engine(args)
    prompt = (tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
              if args.chat else args.prompt)
    stream_engine(engine, "generate", prompt, params_from(args))
    print()
    return 0


def cmd_chat(args, stdin=sys.stdin, out=sys.stdout) -> int:
    """An interactive multi-turn chat; an empty line or EOF ends it."""
    messages = [{"role": "system", "content": args.system}] if args.system else []
    reply = _openai_reply(args) if args.url else _engine_reply(args)
    out.write("minillm chat: type a message, an empty line to quit.\n")
    turn = 0
    while True:
        out.write("\n> ")
        out.flush()
        line = stdin.readline()
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line.strip()})
        answer = reply(messages, turn, out)
        messages.append({"role": "assistant", "content": answer})
        out.write("\n")
        turn += 1


def _engine_reply(args):
    engine, tokenizer = make_engine(args)
    params = params_from(args)

    def reply(messages, turn, out):
        ids = tokenizer.apply_chat_template(messages)
        return stream_engine(engine, f"chat-{turn}", ids, params, out).outputs[0].text
    return reply


def _openai_reply(args):
    from openai import OpenAI
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key or "none")
    model = args.model or client.models.list().data[0].id

    def reply(messages, turn, out):
        parts = []
        stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                                max_tokens=args.max_tokens, temperature=args.temperature,
                                                top_p=args.top_p, seed=args.seed, stop=args.stop)
        for chunk in stream:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                out.write(delta)
                out.flush()
                parts.append(delta)
        return "".join(parts)
    return reply


def add_sampling_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model name, folder or hub id (default: embedded SmolLM2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="auto (default): bfloat16 on GPUs that have it, float16 on older ones, float32 on CPU")
    p.add_argument("--compile", action="store_true",
                   help="run decode steps through torch.compile (slow first start; cached after)")
    p.add_argument("--quantization", choices=quantization_names(), default=None,
                   help="quantized linears: int8, int4 weight-only; w4a8 int4 weights x int8 activations (default: float)")
