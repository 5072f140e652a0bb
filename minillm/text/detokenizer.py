"""Token ids -> text, one token at a time, for streaming (lesson 07).

Two things make this harder than `tokenizer.decode([token])`:
  - one character can span several tokens. A byte-level BPE (SmolLM2, Llama 3, Qwen)
    splits an emoji into up to four byte tokens; decoding only some of its bytes gives
    the replacement character U+FFFD. So a delta that ends in U+FFFD is held back
    until the next tokens complete the character.
  - decoding the whole output again at every token costs O(length) per token, O(n²) per
    request. So we decode only a window: the tokens of the last emitted delta (the
    "prefix", context for tokenizers whose decode of a token depends on its neighbour,
    such as a SentencePiece leading space) plus the tokens not yet emitted.

    ids:   ... | prefix_offset ... read_offset | ... end
                 (emitted last time)            (not yet emitted)
    delta = decode(ids[prefix_offset:]) minus decode(ids[prefix_offset:read_offset])

This is the same scheme as vLLM's and Hugging Face's TextStreamer.

A third thing decides what a client may be shown: text that could still become a stop string
("...EN" while "END" is one) is held back too (`settled_text`), or the stream would have to
take back text it already sent. vLLM's detokenizer holds a fixed buffer of len(stop) - 1
characters; we hold only a tail that really is the beginning of a stop string.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

REPLACEMENT_CHAR = "\ufffd"


class DetokenizerBase(ABC):
    """The state every incremental detokenizer starts from; `add`, `flush` and `settled_text`
    are what lesson 07's exercise writes (its class subclasses this, not the reference)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""             # every delta returned so far, concatenated
        self.prefix_offset = 0     # window start: the tokens of the last emitted delta
        self.read_offset = 0       # the first token whose text is not yet emitted
        self.pending = ""          # the held-back tail as it decodes now (may end in U+FFFD)

    @abstractmethod
    def add(self, token_id: int) -> str:
        """Feed one token; return the text it completes ("" while a character is unfinished)."""

    @abstractmethod
    def flush(self) -> str:
        """Emit the held-back tail as it decodes now; call once, when generation has ended."""

    @abstractmethod
    def settled_text(self, stop: list[str]) -> str:
        """`self.text` without its longest tail that is the beginning of a stop string."""


class IncrementalDetokenizer(DetokenizerBase):

    def add(self, token_id: int) -> str:
        """Feed one token; return the text it completes ("" while a character is unfinished)."""
        self.token_ids.append(token_id)
        window = self.token_ids[self.prefix_offset:]
        prefix_text = self.tokenizer.decode(window[:self.read_offset - self.prefix_offset])
        new_text = self.tokenizer.decode(window)
        delta = new_text[len(prefix_text):]
        if not delta or delta.endswith(REPLACEMENT_CHAR):
            self.pending = delta   # nothing new yet, or the last character is incomplete: wait
            return ""
        self.pending = ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit the held-back tail as it decodes now, incomplete characters included (U+FFFD).
        Call once, when generation has ended."""
        delta, self.pending = self.pending, ""
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def settled_text(self, stop: list[str]) -> str:
        """`self.text` without its longest tail that is the beginning of a stop string: what a
        client may be shown now and will never have to take back. `self.text` is unchanged."""
        longest = 0
        for s in stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return self.text[:len(self.text) - longest]
