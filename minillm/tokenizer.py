"""A thin wrapper over a Hugging Face tokenizer: text <-> token ids, chat template, EOS.

Tokenizing is not what this course teaches, so we borrow it; the wrapper only
pins down the few calls the engine makes, so no transformers API leaks upward.
"""
from __future__ import annotations


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

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Messages [{"role": ..., "content": ...}] -> the prompt token ids the model was trained on."""
        if not getattr(self.hf, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use a plain prompt")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                           tokenize=False)
        return list(self.hf.encode(text, add_special_tokens=False))
