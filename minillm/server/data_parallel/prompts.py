"""The text a request is routed by: its prompt as one string, read from the raw JSON body.

The router does not validate requests (the replica does, and answers in OpenAI's shape);
it only needs a string whose prefixes follow the prompt's: for /v1/completions the prompt
(the first one of a batch; token ids spelled as numbers), for /v1/chat/completions the
messages one after the other (role, then text), so two chats with the same system prompt
and first turns share a prefix, as their templated token ids will. A body it cannot read
gives None: the request still goes to a replica (the least loaded), which answers the error;
except a body nested deeper than Python's parser goes (RecursionError, which a replica answers
with a 400 too): that one the front refuses itself (TooDeep), before it costs a replica anything.
The text starts with the request's `model`: a LoRA adapter's KV cache is its own (the engine's
block hashes include the adapter), so the same prompt under another adapter is another prefix.
"""
from __future__ import annotations

import json


class TooDeep(ValueError):
    """The body's JSON nests deeper than the parser's recursion limit."""


def routing_text(path: str, body: bytes) -> str | None:
    try:
        request = json.loads(body)
    except RecursionError:
        raise TooDeep("the request body's JSON is nested too deeply") from None
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    if path.endswith("/chat/completions"):
        text = chat_text(request.get("messages"))
    else:
        text = prompt_text(request.get("prompt"))
    model = request.get("model")
    return f"{model}\n{text}" if text is not None and isinstance(model, str) else text


def prompt_text(prompt) -> str | None:
    """A completion's prompt: a string, token ids, or a batch of either (the first leads)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                          # one level only: deeper is no prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return " ".join(map(str, prompt)) + " "
    return None


def chat_text(messages) -> str | None:
    """The messages as one string: "role: text" per message, each ended by a newline."""
    if not isinstance(messages, list):
        return None
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):               # text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{m.get('role')}: {content if isinstance(content, str) else ''}\n")
    return "".join(parts)
