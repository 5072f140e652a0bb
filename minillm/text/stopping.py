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

As in vLLM, the text leaves out the stop string that ended the sequence unless
`include_stop_str_in_output`. Special tokens are decoded only with `skip_special_tokens=False`,
and then a special token that ended the sequence (EOS, or a special stop token id) is still left
out unless `include_stop_str_in_output`, as vLLM does. A stop token id that is an ordinary token
keeps its text (lesson 01: text == decode(token_ids)); vLLM would drop it. With `min_tokens`, nothing but max_tokens ends a sequence before it
has that many tokens: stop tokens are ignored (the sampler masks them anyway), and a stop string
counts only if it ends after the first min_tokens tokens' text.
"""
from __future__ import annotations

from .detokenizer import IncrementalDetokenizer
from ..sampling_params import SamplingParams


class StopChecker:
    def __init__(self, params: SamplingParams, tokenizer=None, eos_token_ids=()):
        if params.stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode text")
        self.params = params
        self.tokenizer = tokenizer = decoding_as_asked(tokenizer, params)
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.detokenizer = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.text = ""             # settled text so far: a prefix of the final text
        self._searched = 0         # detokenized characters already searched for stop strings
        self._floor = 0            # a stop string must end after this many characters (min_tokens)

    def check(self, output_ids: list[int]) -> str | None:
        """Call after each new token; returns "stop", "length" or None (keep going)."""
        p, last = self.params, output_ids[-1]
        detok = self.detokenizer
        if detok is not None:
            for token in output_ids[len(detok.token_ids):]:
                detok.add(token)
        if len(output_ids) >= p.min_tokens and (last in self.eos_token_ids or last in p.stop_token_ids):
            return self._finish("stop", output_ids, cut=False)
        if p.stop and len(output_ids) <= p.min_tokens:
            self._searched = self._floor = len(detok.text)    # the first min_tokens tokens' text
        elif p.stop and self._find_new_stop() is not None:
            return self._finish("stop", output_ids)
        if len(output_ids) >= p.max_tokens:
            return self._finish("length", output_ids)
        if detok is not None:
            self.text = detok.settled_text(p.stop)
        return None

    def _finish(self, reason: str, output_ids: list[int], cut: bool = True) -> str:
        """The final text, decoded from all the tokens at once (exactly what a non-streaming
        decode gives, incomplete characters included), cut before the first stop string (or
        after it, with include_stop_str_in_output). A special stop token is left out too."""
        if self.tokenizer is None:
            return reason
        keep = self.params.include_stop_str_in_output
        shown = self.params.skip_special_tokens or keep or cut or output_ids[-1] not in self._special_ids()
        text = self.tokenizer.decode(output_ids if shown else output_ids[:-1])
        hit = find_stop(text, self.params.stop, self._floor) if cut else None
        if hit is not None:
            at, stop = hit
            text, reason = text[:at + len(stop) if keep else at], "stop"
        self.text = text
        return reason

    def _special_ids(self) -> set[int]:
        return getattr(self.tokenizer, "special_token_ids", self.eos_token_ids)

    def _find_new_stop(self) -> tuple[int, str] | None:
        """Search only the text that is new since the last token (and, before it, the longest
        stop string's length): settled text plus the held-back tail as it decodes now."""
        detok = self.detokenizer
        start = max(0, self._searched - max(len(s) for s in self.params.stop) + 1)
        hit = find_stop(detok.text[start:] + detok.pending, self.params.stop, self._searched - start)
        self._searched = len(detok.text)
        return None if hit is None else (start + hit[0], hit[1])


def find_stop(text: str, stops: list[str], floor: int = 0) -> tuple[int, str] | None:
    """The first stop string in text that ends after text[:floor] (text already searched, or
    the first min_tokens tokens' text): (where it begins, which one), or None."""
    hits = [(i, s) for s in stops if (i := text.find(s, max(0, floor - len(s) + 1))) != -1]
    return min(hits, key=lambda hit: hit[0]) if hits else None


class _Decoding:
    """A tokenizer whose decode(ids) applies the request's decode options (the incremental
    detokenizer calls decode(ids) and nothing else)."""

    def __init__(self, tokenizer, **options):
        self.tokenizer, self.options = tokenizer, options

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(token_ids, **self.options)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def decoding_as_asked(tokenizer, params: SamplingParams):
    """The tokenizer itself when the request keeps the default decode options, else one that
    decodes with skip_special_tokens / spaces_between_special_tokens as asked."""
    if tokenizer is None or (params.skip_special_tokens and params.spaces_between_special_tokens):
        return tokenizer
    return _Decoding(tokenizer, skip_special_tokens=params.skip_special_tokens,
                     spaces_between_special_tokens=params.spaces_between_special_tokens)
