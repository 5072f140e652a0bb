"""Incremental detokenization and stop strings for streaming (lesson 07), on SmolLM2's real
byte-level tokenizer: characters that span several tokens, stop strings that span tokens."""
import pytest
from hypothesis import given, settings, strategies as st

from minillm.text.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minillm.models.loader import load_tokenizer
from minillm.sampling_params import SamplingParams
from minillm.text.stopping import StopChecker

TEXTS = [
    "Hello 👋🏽 wörld! 你好，世界。 café naïve 🇫🇷 done",
    "日本語のテキストです。😀😃😄 emoji run 🧑‍🚀 and ÅÄÖ åäö ß",
    "Ünïcödé everywhere: ñandú, façade, jalapeño — “quotes” … ✓ ✗ → ∞",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")        # the real SmolLM2 tokenizer


class CountingTokenizer:
    """Records how many tokens each decode call sees (to prove the window stays small)."""
    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self.tok.decode(ids)


def stream(detok, ids):
    return [detok.add(t) for t in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode(tok, text):
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids) + [detok.flush()]
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in d for d in deltas)
    assert deltas.count("") >= 3            # some characters really did span several tokens


def test_a_character_is_held_until_its_last_byte_arrives(tok):
    ids = tok.encode(" 👋")                     # one character, four UTF-8 bytes
    assert len(ids) >= 3
    detok = IncrementalDetokenizer(tok)
    assert stream(detok, ids[:-1]) == [""] * (len(ids) - 1)
    assert detok.pending.endswith(REPLACEMENT_CHAR)
    assert detok.add(ids[-1]) == " 👋"


def test_flush_emits_an_unfinished_character_as_the_tokenizer_decodes_it(tok):
    ids = tok.encode("ok 👋")[:-1]               # cut inside the emoji
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids)
    tail = detok.flush()
    assert "".join(deltas) + tail == tok.decode(ids)
    assert tail.endswith(REPLACEMENT_CHAR) and REPLACEMENT_CHAR not in "".join(deltas)


def test_only_a_window_of_recent_tokens_is_decoded(tok):
    ids = tok.encode(" ".join(TEXTS) * 4)
    assert len(ids) > 300
    counting = CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting)
    deltas = stream(detok, ids)
    assert "".join(deltas) == tok.decode(ids)
    assert max(counting.sizes) <= 10          # never the whole output


def old_stop_checker(params, tok, ids):
    """The reference: decode everything at every token, cut at the first stop string."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        if ids[n - 1] in tok.eos_token_ids:
            return "stop", n, text
        hits = [i for i in (text.find(s) for s in params.stop) if i != -1]
        if hits:
            return "stop", n, text[:min(hits)]
        if n >= params.max_tokens:
            return "length", n, text
    return None, len(ids), tok.decode(ids)


def run_checker(params, tok, ids):
    checker = StopChecker(params, tok, tok.eos_token_ids)
    shown, reason, n = [], None, 0
    for n in range(1, len(ids) + 1):
        reason = checker.check(ids[:n])
        shown.append(checker.text)
        if reason:
            break
    return reason, n, shown


def assert_streams_like_the_reference(params, tok, ids):
    reason, n, shown = run_checker(params, tok, ids)
    ref_reason, ref_n, ref_text = old_stop_checker(params, tok, ids)
    assert (reason, n) == (ref_reason, ref_n)
    final = shown[-1]
    assert final == ref_text                                   # the final text is unchanged
    for text in shown:
        assert final.startswith(text)                          # each step only appends
        assert REPLACEMENT_CHAR not in text or REPLACEMENT_CHAR in final
        assert not any(s in text for s in params.stop)         # a stop string never leaks
    return shown


@pytest.mark.parametrize("text,stop,expected", [
    ("Hello 👋🏽 wörld! 你好，世界。 done", ["世界"], "Hello 👋🏽 wörld! 你好，"),
    ("Hello 👋🏽 wörld! 你好，世界。 done", ["🏽"], "Hello 👋"),
    ("abc ENx END tail", ["END"], "abc ENx "),                 # a false start is released
    ("café naïve façade", ["ïve f", "zzz"], "café na"),
    ("no stop here at all 🇫🇷", ["🇫🇷!"], "no stop here at all 🇫🇷"),
    ("STOP right away", ["STOP"], ""),
    ("say hi 👋 now", ["hi "], "say "),     # found while the emoji's first byte is still pending
])
def test_stop_strings_spanning_tokens_never_leak(tok, text, stop, expected):
    ids = tok.encode(text)
    params = SamplingParams(stop=stop, max_tokens=len(ids))
    shown = assert_streams_like_the_reference(params, tok, ids)
    assert shown[-1] == expected


def test_text_that_could_start_a_stop_string_is_held_back(tok):
    ids = tok.encode("abc ENx END tail")
    params = SamplingParams(stop=["END"], max_tokens=len(ids))
    _, _, shown = run_checker(params, tok, ids)
    assert not any(t.endswith(("E", "EN")) for t in shown)
    assert "abc ENx " in shown


def test_length_on_an_unfinished_character_reports_what_decode_gives(tok):
    ids = tok.encode("ok 👋")
    reason, n, shown = run_checker(SamplingParams(max_tokens=len(ids) - 1), tok, ids)
    assert reason == "length" and shown[-1] == tok.decode(ids[:-1])
    assert shown[-1].endswith(REPLACEMENT_CHAR) and REPLACEMENT_CHAR not in shown[-2]


POOL = sorted({t for text in TEXTS for t in load_tokenizer("tiny-llama").encode(text)})


@settings(max_examples=150)
@given(ids=st.lists(st.sampled_from(POOL), min_size=1, max_size=40),
       stops=st.lists(st.sampled_from(["世", "é", "👋🏽", "or", "ld! ", " w", "😀😃", "— ", "s "]), max_size=2))
def test_any_token_sequence_streams_like_the_reference(ids, stops):
    """Random mixes of byte tokens (broken characters included) and stop strings."""
    tok = load_tokenizer("tiny-llama")
    params = SamplingParams(stop=stops or None, max_tokens=len(ids))
    assert_streams_like_the_reference(params, tok, ids)
