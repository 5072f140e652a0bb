"""The terminal front ends: `python -m minillm chat`, and what it shares with `generate` (generate.py).

Both run on the engine (not on lesson 02's loop) and print tokens as they come: each
engine step returns the request's text so far, and only the new part is printed.
`chat` keeps the conversation and sends it through the model's chat template every
turn (the prefix cache makes the repeated history cheap); with `--url` it talks to a
running `python -m minillm serve` through the official `openai` client instead.
"""
from __future__ import annotations

import sys

from ..sampling_params import SamplingParams
from .engine_args import add_engine_arguments, engine_config_from_args


def stream_engine(engine, request_id: str, prompt, params: SamplingParams, out=None):
    """Run one request on `engine`, writing its text as it grows (to `out`, default: the
    sys.stdout of the moment, not of import time); returns the final output."""
    out = sys.stdout if out is None else out
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
    """(engine, tokenizer) as the engine flags ask; a bad flag fails before the model loads."""
    from ..engine.engine import LLMEngine
    from ..models import load_model
    config = engine_config_from_args(args)
    model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype,
                                  load_format=config.load_format)
    return LLMEngine(model, tokenizer, config), tokenizer


def cmd_chat(args, stdin=None, out=None) -> int:
    """An interactive multi-turn chat; an empty line or EOF ends it."""
    stdin, out = sys.stdin if stdin is None else stdin, sys.stdout if out is None else out
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
    """What `generate` and `chat` share: the model, the sampling flags and every engine flag."""
    p.add_argument("--model", default=None, help="model name, folder or hub id (default: embedded SmolLM2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    add_engine_arguments(p)


def add_arguments(p) -> None:
    p.add_argument("--system", default=None, help="a system prompt")
    p.add_argument("--url", default=None, help="talk to a running `minillm serve` at this URL instead")
    p.add_argument("--api-key", default=None, help="the server's key, with --url")
    add_sampling_arguments(p)


main = cmd_chat
