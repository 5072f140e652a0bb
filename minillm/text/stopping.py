"""When does a sequence end? EOS, a stop token, a stop string, or max_tokens.

Stop strings are matched on decoded text, because one string can span several
tokens and one token can hold several characters. The text shown to the user is
cut just before the stop string, as vLLM does.

`text` is what may be shown so far, and it only ever grows (lesson 07 streams it): at
every step it is a prefix of the final text. So it holds back what is not settled yet:
  - an incomplete character (its bytes decode to U+FFFD until the next tokens complete it;
    the incremental detokenizer waits for them);
  - a tail that could still become a stop string ("...EN" while "END" is a stop string;
    the detokenizer's `settled_text`).
When the sequence ends, `text` is `tokenizer.decode(output_ids)`, cut before the first
stop string.
"""
from __future__ import annotations

from .detokenizer import IncrementalDetokenizer
from ..sampling_params import SamplingParams


class StopChecker:
    def __init__(self, params: SamplingParams, tokenizer=None, eos_token_ids=()):
        if params.stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode text")
        self.params = params
        self.tokenizer = tokenizer
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.detokenizer = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.text = ""             # settled text so far: a prefix of the final text
        self._searched = 0         # detokenized characters already searched for stop strings

    def check(self, output_ids: list[int]) -> str | None:
        """Call after each new token; returns "stop", "length" or None (keep going)."""
        p, last = self.params, output_ids[-1]
        detok = self.detokenizer
        if detok is not None:
            for token in output_ids[len(detok.token_ids):]:
                detok.add(token)
        if last in self.eos_token_ids or last in p.stop_token_ids:
            return self._finish("stop", output_ids, cut=False)
        if p.stop and self._find_new_stop() is not None:
            return self._finish("stop", output_ids)
        if len(output_ids) >= p.max_tokens:
            return self._finish("length", output_ids)
        if detok is not None:
            self.text = detok.settled_text(p.stop)
        return None

    def _finish(self, reason: str, output_ids: list[int], cut: bool = True) -> str:
        """The final text, decoded from all the tokens at once (exactly what a non-streaming
        decode gives, incomplete characters included), cut before the first stop string."""
        if self.tokenizer is None:
            return reason
        text = self.tokenizer.decode(output_ids)
        hit = find_stop(text, self.params.stop) if cut else None
        if hit is not None:
            text, reason = text[:hit], "stop"
        self.text = text
        return reason

    def _find_new_stop(self) -> int | None:
        """Search only the text that is new since the last token (and, before it, the longest
        stop string's length): settled text plus the held-back tail as it decodes now."""
        detok = self.detokenizer
        start = max(0, self._searched - max(len(s) for s in self.params.stop) + 1)
        self._searched = len(detok.text)
        hit = find_stop(detok.text[start:] + detok.pending, self.params.stop)
        return None if hit is None else start + hit


def find_stop(text: str, stops: list[str], start: int = 0) -> int | None:
    """Where the first stop string begins in text[start:] (an index into text), or None."""
    hits = [i for i in (text.find(s, start) for s in stops) if i != -1]
    return min(hits) if hits else None
