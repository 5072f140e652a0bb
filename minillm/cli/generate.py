"""`python -m minillm generate "PROMPT"`: complete one prompt on the engine, printing tokens as they come.

Shares the model, sampling and engine flags with `chat` (chat.add_sampling_arguments).
"""
from __future__ import annotations

from .chat import add_sampling_arguments, make_engine, params_from, stream_engine


def add_arguments(p) -> None:
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_sampling_arguments(p)


def main(args) -> int:
    engine, tokenizer = make_engine(args)
    prompt = (tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
              if args.chat else args.prompt)
    stream_engine(engine, "generate", prompt, params_from(args))
    print()
    return 0
