"""Lesson 07's detokenizer grader, `check_detokenizer`: the learner's IncrementalDetokenizer
(add, flush, settled_text) on the real SmolLM2 byte-level tokenizer, with text whose
characters span several tokens (emoji, CJK, accents), then inside the engine's StopChecker,
as every request uses it, with stop strings that span tokens and characters. What a
streaming client would be sent is compared with the reference at every token: a wrong
detokenizer does not crash, it shows U+FFFD, loses the last characters, or sends text
that has to be taken back.
"""
from __future__ import annotations

from .harness import Grader, expect, grader, tiny_model

R = "\ufffd"                                   # U+FFFD, what decode gives for an unfinished character
TEXTS = ["Hello 👋🏽 wörld! 你好，世界。 café naïve 🇫🇷 done",
         "日本語のテキストです。😀😃😄 emoji run 🧑‍🚀 and ÅÄÖ åäö ß",
         "Ünïcödé everywhere: ñandú, façade, jalapeño — “quotes” … ✓ ✗ → ∞"]
# (text, stop strings): greedy text as the engine would generate it, token by token
STOP_CASES = [("Hello 👋🏽 wörld! 你好，世界。 done", ["世界"]), ("abc ENx END tail", ["END"]),
              ("say hi 👋 now", ["hi "]), ("café naïve façade", ["ïve f", "zzz"]), ("ab 你好 cd", ["好"]),
              ("no stop here at all 🇫🇷", ["🇫🇷!"])]
# (text, stop strings, what settled_text must return)
SETTLED = [("abc EN", ["END"], "abc "), ("abc E", ["END"], "abc "), ("abc ENx", ["END"], "abc ENx"),
           ("hello wor", ["world", "or!"], "hello "), ("abc", ["bcd", "c!"], "a"), ("x", ["x"], "x"),
           ("no stops", [], "no stops"), ("", ["END"], "")]


class _Counting:
    """A tokenizer that records how many tokens each decode call sees."""

    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self.tok.decode(ids)


def _stream(g, cls, tok, ids, doing, before_flush=None):
    with g.case(f"constructing cls(tokenizer) and calling add() token by token ({doing})"):
        detok = cls(tok)
        deltas = [detok.add(t) for t in ids]
    for d in deltas:
        expect(isinstance(d, str), f"add() returned {d!r}: it returns the new text as a str ('' when none)")
    if before_flush:
        before_flush(detok)
    with g.case(f"calling flush() at the end ({doing})"):
        tail = detok.flush()
    expect(isinstance(tail, str), f"flush() returned {tail!r}: it returns the held-back text as a str")
    return detok, deltas, tail


def _characters(g, cls, tok) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        detok, deltas, tail = _stream(g, cls, tok, ids, repr(text))
        for i, d in enumerate(deltas):
            expect(R not in d, f"broken UTF-8: add() returned {d!r} for token {i} of {text!r}: U+FFFD ('{R}') "
                               "is what decode gives for a character whose bytes are not all there yet (an emoji "
                               "or a CJK character spans several tokens), and the final text has none. Hold a "
                               "delta that ends in U+FFFD back (return '' and keep it in self.pending) until the "
                               "next tokens complete the character; tokenizer.decode([token]) alone cannot work")
        got = "".join(deltas) + tail
        expect(got == text, f"the deltas of {text!r} concatenate to {got!r}, not to what decoding all its tokens "
                            "gives. " + ("Text is repeated: after emitting a delta, move prefix_offset to "
                                         "read_offset and read_offset to len(self.token_ids)"
                                         if len(got) > len(text) else
                                         "Text is lost: a delta is the window's new decode minus its old one"))
        expect(detok.text == text, f"after streaming {text!r}, self.text is {detok.text!r}: self.text must be "
                                   "every delta returned so far, concatenated (the engine's StopChecker reads it)")
    ids = tok.encode("ok 👋")[:-1]                   # the stream ends inside the emoji
    def pending_kept(detok):
        expect(detok.pending.endswith(R),
               f"after the first bytes of '👋' (an unfinished character), self.pending is {detok.pending!r}: keep "
               "the held-back text, as it decodes now, in self.pending (StopChecker searches self.text + "
               "self.pending for stop strings, so a stop string is found at the token that completes it)")
    detok, deltas, tail = _stream(g, cls, tok, ids, "'ok 👋' cut inside the emoji", pending_kept)
    expect("".join(deltas) + tail == tok.decode(ids),
           f"dropped last delta: the stream of 'ok 👋' cut inside the emoji gave {''.join(deltas)!r} + flush() "
           f"{tail!r}, but decoding its tokens gives {tok.decode(ids)!r}. When generation ends, flush() must "
           "return what is still held back (self.pending), even an unfinished character")
    ids = tok.encode(" ".join(TEXTS) * 3)
    counting = _Counting(tok)
    with g.case("streaming a 300-token text"):
        detok = cls(counting)
        deltas = [detok.add(t) for t in ids]
    expect(max(counting.sizes) <= 16,
           f"add() decoded {max(counting.sizes)} tokens in one call while streaming {len(ids)} tokens: decoding "
           "the whole output at every token costs O(n²) per request. Decode only the window "
           "self.token_ids[self.prefix_offset:] (the last delta's tokens, then the new ones)")


def _settled(g, cls, tok) -> None:
    for text, stop, expected in SETTLED:
        detok = cls(tok)
        detok.text = text
        with g.case(f"calling settled_text({stop!r}) with self.text = {text!r}"):
            got = detok.settled_text(stop)
        expect(detok.text == text, f"settled_text({stop!r}) changed self.text from {text!r} to {detok.text!r}: "
                                   "return the settled part; self.text keeps every delta (the tail may still "
                                   "turn out not to be a stop string)")
        if got != expected and text.startswith(got) and len(got) > len(expected):
            s = next(s for s in stop if any(got.endswith(s[:k]) for k in range(1, len(s))))
            raise AssertionError(
                f"stop string leaked: settled_text({stop!r}) with self.text = {text!r} returned {got!r}, so the "
                f"client would be sent {got[len(expected):]!r}, the beginning of the stop string {s!r}. If the "
                "rest of it comes next, the final text is cut before it and the client already has text that "
                "is not in the answer. Hold back the longest tail of self.text that is a beginning of a stop "
                "string (text.endswith(s[:k]) for k < len(s))")
        expect(got == expected, f"settled_text({stop!r}) with self.text = {text!r} returned {got!r}, expected "
                                f"{expected!r}: hold back only a tail that is a beginning of a stop string "
                                "(the longest one); whatever else can never become a stop string, so send it")


def _checker_run(tok, detok, text, stop):
    from ..sampling_params import SamplingParams
    from ..text.stopping import StopChecker
    ids = tok.encode(text)
    checker = StopChecker(SamplingParams(stop=stop, max_tokens=len(ids)), tok, tok.eos_token_ids)
    if detok is not None:
        checker.detokenizer = detok
    shown, reason = [], None
    for n in range(1, len(ids) + 1):
        reason = checker.check(ids[:n])
        shown.append(checker.text)
        if reason:
            break
    return reason, shown


def _through_stop_checker(g, cls, tok) -> None:
    for text, stop in STOP_CASES:
        ref_reason, ref_shown = _checker_run(tok, None, text, stop)
        with g.case(f"generating {text!r} with stop={stop!r} through StopChecker, your detokenizer in it"):
            reason, shown = _checker_run(tok, cls(tok), text, stop)
        where = f"(streaming {text!r} with stop={stop!r}, through the engine's StopChecker)"
        final = ref_shown[-1]
        for i, s in enumerate(shown[:len(ref_shown)]):
            expect(R not in s or R in final, f"broken UTF-8: after token {i} the client would be sent {s!r}, "
                                             f"with a U+FFFD the final text lacks {where}")
            if not final.startswith(s):
                leaked = [x for x in stop if any(s.endswith(x[:k]) for k in range(1, len(x) + 1))]
                raise AssertionError(
                    (f"stop string leaked: after token {i} the client would be sent {s!r}, which ends with the "
                     f"beginning of the stop string {leaked[0]!r}; the final text is {final!r}. "
                     "settled_text(stop) must hold back the longest tail that begins a stop string "
                     if leaked else f"after token {i} the client would be sent {s!r}, which the final text "
                     f"{final!r} does not begin with: streamed text can never be taken back ") + where)
        expect(len(shown) <= len(ref_shown),
               f"the stop string was complete at token {len(ref_shown) - 1} but StopChecker found it only at "
               f"token {len(shown) - 1}: the request generated tokens past its stop string {where}. A stop "
               "string can end inside a character that is still held back: keep that tail in self.pending")
        expect(len(shown) == len(ref_shown) and reason == ref_reason,
               f"the request stopped at token {len(shown) - 1} ({reason!r}) but should stop at token "
               f"{len(ref_shown) - 1} ({ref_reason!r}) {where}: is self.pending reset to '' when a delta is "
               "emitted? StopChecker searches self.text + self.pending")
        for i, (s, r) in enumerate(zip(shown, ref_shown)):
            expect(s == r, f"after token {i} the client would be sent {s!r}, the reference sends {r!r} {where}")


@grader
def check_detokenizer(cls) -> bool:
    """cls(tokenizer), like `detokenizer.IncrementalDetokenizer`: add(token_id) -> the new text
    ('' while a character is unfinished), flush() -> the held-back tail when generation ends,
    settled_text(stop) -> self.text minus its longest tail that begins a stop string; attributes
    token_ids, text (every delta so far), pending (the held-back tail, as it decodes now).

    On SmolLM2's byte-level tokenizer: no delta holds a U+FFFD that the text lacks, the deltas
    and flush() concatenate to the full decode (also when the stream ends inside a character),
    each add() decodes a short window (not the whole output), settled_text holds back exactly
    the beginnings of stop strings. Then, inside the engine's StopChecker, with stop strings
    that span tokens and characters, the client is sent what the reference sends at every
    token, and the request stops at the same token.
    """
    g = Grader("check_detokenizer", "your detokenizer")
    tok = tiny_model()[1]                          # the real SmolLM2 tokenizer
    _characters(g, cls, tok)
    _settled(g, cls, tok)
    _through_stop_checker(g, cls, tok)
    return g.passed()
