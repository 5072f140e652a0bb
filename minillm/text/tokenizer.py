"""A thin wrapper over a Hugging Face tokenizer: text <-> token ids, chat template, EOS.

Tokenizing is not what this course teaches, so we borrow it; the wrapper only
pins down the few calls the engine makes, so no transformers API leaks upward.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

from ..utils.validate import is_int, refuse


class Tokenizer:
    def __init__(self, hf_tokenizer, extra_eos_ids: list[int] | None = None):
        self.hf = hf_tokenizer
        eos = set(extra_eos_ids or [])
        if hf_tokenizer.eos_token_id is not None:
            eos.add(hf_tokenizer.eos_token_id)
        self.eos_token_ids: set[int] = eos
        self.special_token_ids: set[int] = set(hf_tokenizer.all_special_ids) | eos

    @classmethod
    def from_folder(cls, folder, extra_eos_ids=None) -> "Tokenizer":
        return cls(_hf_tokenizer(Path(folder)), extra_eos_ids)

    def encode(self, text: str) -> list[int]:
        """Text -> token ids. Text that is not valid Unicode (a lone surrogate such as
        "\\ud800") is refused here with a ValueError, not deep inside the tokenizer."""
        if not isinstance(text, str):
            raise TypeError(f"text to encode must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text is not valid Unicode ({e.reason} at position {e.start}); "
                             "it cannot be tokenized") from None
        return list(self.hf.encode(text))

    def decode(self, token_ids, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> str:
        """spaces_between_special_tokens: honoured by slow tokenizers only (fast ones, which every
        model here has, never add those spaces), as in vLLM."""
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens,
                              spaces_between_special_tokens=spaces_between_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, *,
                            continue_final_message: bool = False, template_kwargs: dict | None = None,
                            tools: list[dict] | None = None, chat_template: str | None = None) -> list[int]:
        """Messages [{"role": ..., "content": ...}] -> the prompt token ids the model was trained on.
        An assistant message may carry "tool_calls" (its content then may be None) and a "tool"
        message answers one: both go to the template as they are, and a template that cannot
        render them is refused by name. `continue_final_message` leaves the last message open
        (the reply continues it); `template_kwargs` are extra variables for the template. `tools`
        (OpenAI's [{"type": "function", "function": {...}}]) go to the template as `tools`;
        `chat_template` (Jinja text) replaces the tokenizer's own."""
        template = chat_template or getattr(self.hf, "chat_template", None)
        if not template:
            raise ValueError("this model's tokenizer has no chat template; use a plain prompt")
        check_messages(messages)
        kwargs = self.check_template_kwargs(template_kwargs or {})
        if add_generation_prompt and continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be true: "
                             "the reply either starts a new assistant message or continues the last one")
        history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if any(m.get("tool_calls") for m in messages) and "tool_calls" not in template:
            raise ValueError(f"this model's chat template never reads 'tool_calls', so it would drop them: "
                             f"{TOOLS_NEED_A_TEMPLATE}")
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                               continue_final_message=continue_final_message, tokenize=False,
                                               tools=tools or None, chat_template=template, **kwargs)
        except Exception as e:       # the template itself refused (jinja raises its own errors)
            hint = f"; {TOOLS_NEED_A_TEMPLATE}" if history else ""
            raise ValueError(f"the chat template could not render these messages: {e}{hint}") from None
        return [int(t) for t in self.hf.encode(self._valid_text(text), add_special_tokens=False)]

    def check_template_kwargs(self, kwargs: dict) -> dict:
        """Template variables only: never one of apply_chat_template's own parameters (a client
        must not swap the template, or ask for tensors)."""
        if not isinstance(kwargs, dict) or len(kwargs) > MAX_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs must be a dict of at most {MAX_TEMPLATE_KWARGS} entries")
        own = set(inspect.signature(self.hf.apply_chat_template).parameters) | {"messages", "conversation"}
        bad = next((k for k in kwargs if not isinstance(k, str) or not k.isidentifier() or k in own), None)
        if bad is not None:
            raise ValueError(f"chat_template_kwargs may not set {bad!r}: it holds template variables "
                             "(e.g. enable_thinking), not apply_chat_template's own arguments")
        return kwargs

    @staticmethod
    def _valid_text(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"a message is not valid Unicode ({e.reason}); it cannot be tokenized") from None
        return text


def _hf_tokenizer(folder: Path):
    """AutoTokenizer's tokenizer for `folder`. A folder minillm converted itself (the embedded
    model: SOURCE.txt) whose tokenizer_config names the generic fast class gets that class
    directly: AutoTokenizer would pick the same one, but only after importing the model's
    config classes, about 2 s of CPU in every process that loads the tokenizer."""
    try:
        ours = "minillm" in (folder / "SOURCE.txt").read_text()
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        ours, config = False, {}
    if ours and config.get("tokenizer_class") in GENERIC_CLASSES and "auto_map" not in config:
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))


GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
MAX_TEMPLATE_KWARGS = 32
TOOLS_NEED_A_TEMPLATE = ("tool messages (assistant tool_calls, role 'tool') need a chat template that "
                         "supports them")


def check_messages(messages) -> None:
    """A conversation is a non-empty list of {"role": str, "content": str} dicts; an assistant
    message with a non-empty "tool_calls" list may have content None."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"messages must be a non-empty list of dicts, got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}]['role'] must be a string, got {m.get('role')!r:.80}")
        calls = m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list)):
            raise ValueError(f"messages[{i}]['tool_calls'] must be a list, in an assistant message")
        if not isinstance(m.get("content"), str) and not (m.get("content") is None and calls):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {m.get('content')!r:.80}")


def prompt_to_ids(tokenizer, prompt) -> list[int]:
    """A prompt is text or a list of token ids (ints, not floats, bools or strings: a
    value is refused, never coerced). Token ids are checked against the vocabulary
    by the engine, which knows the model."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)):
        bad = next((t for t in prompt if not is_int(t)), None)
        if bad is not None:
            refuse("prompt", f"prompt token ids must be integers, got {bad!r:.40} ({type(bad).__name__}) "
                         "in the prompt", TypeError)
        ids = [int(t) for t in prompt]
    else:
        raise TypeError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
    if not ids:
        refuse("prompt", "the prompt is empty")
    return ids
