"""A thin wrapper over a Hugging Face tokenizer: text <-> token ids, chat template, EOS.

Tokenizing is not what this course teaches, so we borrow it; the wrapper only
pins down the few calls the engine makes, so no transformers API leaks upward.
"""
from __future__ import annotations

from ..utils.validate import is_int


class Tokenizer:
    def __init__(self, hf_tokenizer, extra_eos_ids: list[int] | None = None):
        self.hf = hf_tokenizer
        eos = set(extra_eos_ids or [])
        if hf_tokenizer.eos_token_id is not None:
            eos.add(hf_tokenizer.eos_token_id)
        self.eos_token_ids: set[int] = eos

    @classmethod
    def from_folder(cls, folder, extra_eos_ids=None) -> "Tokenizer":
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(str(folder)), extra_eos_ids)

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

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Messages [{"role": ..., "content": ...}] -> the prompt token ids the model was trained on."""
        if not getattr(self.hf, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use a plain prompt")
        check_messages(messages)
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                               tokenize=False)
        except Exception as e:       # the template itself refused (jinja raises its own errors)
            raise ValueError(f"the chat template could not render these messages: {e}") from None
        return [int(t) for t in self.hf.encode(self._valid_text(text), add_special_tokens=False)]

    @staticmethod
    def _valid_text(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"a message is not valid Unicode ({e.reason}); it cannot be tokenized") from None
        return text


def check_messages(messages) -> None:
    """A conversation is a non-empty list of {"role": str, "content": str} dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"messages must be a non-empty list of dicts, got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"messages[{i}]['{key}'] must be a string, got {m.get(key)!r:.80}")


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
            raise TypeError(f"prompt token ids must be integers, got {bad!r:.40} "
                            f"({type(bad).__name__}) in the prompt")
        ids = [int(t) for t in prompt]
    else:
        raise TypeError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty")
    return ids
