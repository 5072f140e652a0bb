"""vLLM's sampling extras: the arithmetic of each logits stage on hand-computed logits, the
checks at the door, the stop rules (min_tokens, include_stop_str_in_output,
skip_special_tokens), and the engine: untouched rows stay exact, a batch gives each request
its solo tokens, a fault in the stage ends only its request."""
import math

import pytest
import torch

import minillm.engine.sampling_stage as sampling_stage
from minillm.baselines.naive_generation import next_token_logits_naive
from minillm.engine.engine import LLMEngine
from minillm.sample.logits_processors import (apply_frequency_presence, apply_logit_bias, apply_min_p,
                                              apply_min_tokens, apply_repetition_penalty, process_logits,
                                              wants_processing)
from minillm.sampling_params import MAX_LOGIT_BIAS, SamplingParams
from minillm.text.stopping import StopChecker

from conftest import get_model

INF = float("inf")
LOGITS = torch.tensor([2.0, -1.0, 0.5, 0.0, 3.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    # token 0 in the prompt (2.0 > 0: / 2), token 1 in the output (-1.0: * 2), the rest unseen
    out = apply_repetition_penalty(LOGITS, prompt_ids=[0], output_ids=[1, 1], penalty=2.0)
    assert out.tolist() == [1.0, -2.0, 0.5, 0.0, 3.0]


def test_frequency_and_presence_count_generated_tokens_only():
    # output: token 4 twice, token 2 once; the prompt (tokens 0, 3) does not count
    out = apply_frequency_presence(LOGITS, output_ids=[4, 4, 2], frequency=0.5, presence=0.25)
    assert out.tolist() == [2.0, -1.0, 0.5 - 0.5 - 0.25, 0.0, 3.0 - 2 * 0.5 - 0.25]
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    assert process_logits(LOGITS, p, prompt_ids=[0, 3], output_ids=[4, 4, 2]).tolist() == out.tolist()


def test_negative_penalties_encourage_repeats():
    out = apply_frequency_presence(LOGITS, output_ids=[1, 1, 1], frequency=-1.0, presence=-0.5)
    assert out[1].item() == -1.0 + 3.0 + 0.5


def test_logit_bias_adds_and_refuses_ids_outside_the_vocabulary():
    assert apply_logit_bias(LOGITS, {1: 5.0, 3: -100.0}).tolist() == [2.0, 4.0, 0.5, -100.0, 3.0]
    with pytest.raises(ValueError, match="logit_bias has token id 5, outside the vocabulary"):
        apply_logit_bias(LOGITS, {5: 1.0})


def test_bias_comes_before_the_repetition_penalty_as_in_vllm():
    # token 1: -1 + 2 = 1 (> 0), then / 2 = 0.5 (the other order would give -2 + 2 = 0)
    p = SamplingParams(logit_bias={1: 2.0}, repetition_penalty=2.0)
    assert process_logits(LOGITS, p, prompt_ids=[1], output_ids=[])[1].item() == 0.5


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached():
    p = SamplingParams(min_tokens=3, stop_token_ids=[2])
    masked = process_logits(LOGITS, p, prompt_ids=[0], output_ids=[3, 3], eos_token_ids={4})
    assert masked.tolist() == [2.0, -1.0, -INF, 0.0, -INF]
    assert not wants_processing(p, num_generated=3)           # reached: the row is left alone
    ignore = SamplingParams(min_tokens=3, stop_token_ids=[2], ignore_eos=True)
    assert process_logits(LOGITS, ignore, [0], [], {4}).tolist() == [2.0, -1.0, -INF, 0.0, 3.0]
    assert torch.equal(apply_min_tokens(LOGITS, {99}), LOGITS)    # outside the vocabulary: never drawn anyway


def test_min_p_keeps_tokens_at_least_min_p_times_the_best_after_temperature():
    # p_i / p_max = exp((l_i - 3) / T). T = 1: [0.37, 0.018, 0.082, 0.050, 1]
    assert apply_min_p(LOGITS, 0.1, 1.0).tolist() == [2.0, -INF, -INF, -INF, 3.0]
    # T = 2: [0.61, 0.14, 0.29, 0.22, 1]
    assert apply_min_p(LOGITS, 0.25, 2.0).tolist() == [2.0, -INF, 0.5, -INF, 3.0]
    probs = (LOGITS / 2).softmax(-1)
    kept = torch.isfinite(apply_min_p(LOGITS, 0.25, 2.0))
    assert torch.equal(kept, probs >= 0.25 * probs.max())
    assert not wants_processing(SamplingParams(min_p=0.5, temperature=0), 0)   # greedy: argmax unchanged


def test_defaults_ask_for_nothing():
    assert not wants_processing(SamplingParams(), 0)
    neutral = SamplingParams(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias={},
                             min_p=0.0, min_tokens=0)
    assert not wants_processing(neutral, 0)


@pytest.mark.parametrize("field, value, error", [
    ("presence_penalty", 2.5, ValueError), ("presence_penalty", -2.1, ValueError),
    ("presence_penalty", True, TypeError), ("frequency_penalty", "1", TypeError),
    ("frequency_penalty", math.nan, ValueError), ("repetition_penalty", 0, ValueError),
    ("repetition_penalty", -1.0, ValueError), ("repetition_penalty", math.inf, ValueError),
    ("min_p", 1.1, ValueError), ("min_p", -0.1, ValueError), ("min_tokens", -1, ValueError),
    ("min_tokens", 17, ValueError), ("min_tokens", 1.0, TypeError), ("min_tokens", True, TypeError),
    ("logit_bias", {"5": 1.0}, TypeError), ("logit_bias", {True: 1.0}, TypeError),
    ("logit_bias", {5: 101}, ValueError), ("logit_bias", {5: math.inf}, ValueError),
    ("logit_bias", {-1: 1.0}, ValueError),
    ("logit_bias", {5: "1"}, TypeError), ("logit_bias", [(5, 1.0)], TypeError),
    ("logit_bias", {t: 1.0 for t in range(MAX_LOGIT_BIAS + 1)}, ValueError),
    ("include_stop_str_in_output", 1, TypeError), ("skip_special_tokens", "yes", TypeError),
    ("spaces_between_special_tokens", None, TypeError),
])
def test_bad_values_are_refused_naming_the_field(field, value, error):
    with pytest.raises(error, match=f"SamplingParams.{field} must be"):
        SamplingParams(max_tokens=16, **{field: value})
    p = SamplingParams(max_tokens=16)
    with pytest.raises(error, match=f"SamplingParams.{field} must be"):
        setattr(p, field, value)                       # after construction too


def test_logit_bias_is_copied_and_normalised():
    given = {5: 1, 7: -2.5}
    p = SamplingParams(logit_bias=given)
    given[5] = 1000
    assert p.logit_bias == {5: 1.0, 7: -2.5} and all(isinstance(v, float) for v in p.logit_bias.values())
    assert SamplingParams(logit_bias={t: 100.0 for t in range(MAX_LOGIT_BIAS)}).logit_bias[0] == 100.0


class CharTokenizer:
    """One character per token; id 0 is a special token that decodes only when asked."""
    eos_token_ids = {0}

    def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True):
        return "".join("<eos>" if i == 0 else chr(i) for i in ids if i != 0 or not skip_special_tokens)


def feed(checker, text, ids=None):
    ids = [] if ids is None else ids
    reasons = []
    for ch in text:
        ids.append(ord(ch))
        reasons.append(checker.check(ids))
        if reasons[-1]:
            break
    return reasons


def test_include_stop_str_in_output_keeps_the_stop_string():
    tok = CharTokenizer()
    plain = StopChecker(SamplingParams(stop=["END"], max_tokens=100), tok, {0})
    kept = StopChecker(SamplingParams(stop=["END"], max_tokens=100, include_stop_str_in_output=True), tok, {0})
    assert feed(plain, "abcENDxyz")[-1] == "stop" and plain.text == "abc"
    assert feed(kept, "abcENDxyz")[-1] == "stop" and kept.text == "abcEND"


def test_an_ordinary_stop_tokens_text_stays_as_lesson_01_defines():
    tok = CharTokenizer()
    plain = StopChecker(SamplingParams(stop_token_ids=[ord("X")], max_tokens=10), tok, {0})
    assert feed(plain, "abX")[-1] == "stop" and plain.text == "abX" == tok.decode([97, 98, 88])


def test_skip_special_tokens_false_shows_them_but_not_the_eos_that_ended_it():
    tok = CharTokenizer()
    shown = StopChecker(SamplingParams(max_tokens=10, ignore_eos=False, skip_special_tokens=False,
                                       stop_token_ids=[ord("!")]), tok, set())
    ids = []
    feed(shown, "a", ids)
    ids.append(0)
    assert shown.check(ids) is None                            # not EOS here: an ordinary special token
    assert feed(shown, "b!", ids)[-1] == "stop" and shown.text == "a<eos>b!"     # "!" is an ordinary token
    hidden = StopChecker(SamplingParams(max_tokens=10), tok, {0})
    assert hidden.check([97, 0]) == "stop" and hidden.text == "a"
    eos_shown = StopChecker(SamplingParams(max_tokens=10, skip_special_tokens=False), tok, {0})
    assert eos_shown.check([97, 0]) == "stop" and eos_shown.text == "a"        # vLLM leaves the EOS out
    eos_kept = StopChecker(SamplingParams(max_tokens=10, skip_special_tokens=False,
                                          include_stop_str_in_output=True), tok, {0})
    assert eos_kept.check([97, 0]) == "stop" and eos_kept.text == "a<eos>"


def test_min_tokens_ignores_stop_tokens_and_strings_in_the_first_tokens():
    tok = CharTokenizer()
    checker = StopChecker(SamplingParams(max_tokens=10, min_tokens=3), tok, {0})
    assert checker.check([97, 0]) is None                      # EOS before min_tokens: ignored
    assert checker.check([97, 0, 0]) == "stop"
    # "ab" lies inside the first three tokens' text: never a stop; the second one is
    early = StopChecker(SamplingParams(stop=["ab"], max_tokens=10, min_tokens=3), tok, {0})
    assert feed(early, "abcab") == [None, None, None, None, "stop"] and early.text == "abc"
    # one that ends after the first min_tokens tokens counts, even if it begins before (vLLM)
    straddle = StopChecker(SamplingParams(stop=["cd"], max_tokens=10, min_tokens=3), tok, {0})
    assert feed(straddle, "abcd") == [None, None, None, "stop"] and straddle.text == "ab"


def test_min_tokens_final_cut_ignores_an_early_stop_string_at_length():
    tok = CharTokenizer()
    checker = StopChecker(SamplingParams(stop=["ab"], max_tokens=4, min_tokens=2), tok, {0})
    assert feed(checker, "abxy") == [None, None, None, "length"] and checker.text == "abxy"


# -- the engine ------------------------------------------------------------------------

OPTIONS = dict(block_size=4, num_kv_blocks=64, max_num_seqs=8)
PROMPT_IDS = [[3000 + 7 * i + j for j in range(5 + 2 * i)] for i in range(4)]
EOS = 2


@pytest.fixture(scope="module")
def tiny_llama():
    model, tokenizer, _ = get_model("tiny-llama")
    return model, tokenizer


def run(tiny_llama, prompts, params):
    engine = LLMEngine(*tiny_llama, **OPTIONS)
    return engine.generate(prompts, params)


def test_rows_that_ask_for_nothing_are_never_touched(tiny_llama, monkeypatch):
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, presence_penalty=0.0,
                             frequency_penalty=0.0, repetition_penalty=1.0, min_p=0.0, logit_bias={}, min_tokens=0)]
    prompts = [PROMPT_IDS[0], PROMPT_IDS[1], PROMPT_IDS[1]]
    before = [o.outputs[0].token_ids for o in run(tiny_llama, prompts, params)]

    def untouchable(*args):
        raise AssertionError("the logits stage ran on a row that asked for nothing")
    monkeypatch.setattr(sampling_stage, "process_logits", untouchable)
    after = run(tiny_llama, prompts, params)
    assert all(o.error is None for o in after)
    assert [o.outputs[0].token_ids for o in after] == before
    assert before[1] == before[2]                 # explicit neutral values: the same tokens as none


EXTRAS = [
    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=0.2),   # < 1: repeat
    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=5, max_tokens=16, ignore_eos=True, presence_penalty=1.5,
                   frequency_penalty=0.7, min_p=0.05),
    SamplingParams(temperature=0, max_tokens=16, logit_bias={EOS: 100.0}, min_tokens=4),
]


def test_a_mixed_batch_gives_each_request_its_solo_tokens(tiny_llama):
    batch = run(tiny_llama, PROMPT_IDS, EXTRAS)
    for prompt, params, out in zip(PROMPT_IDS, EXTRAS, batch):
        (solo,) = run(tiny_llama, [prompt], [params])
        assert out.error is None and out.outputs[0].token_ids == solo.outputs[0].token_ids
    # and the extras took effect: repetition_penalty < 1 makes the prompt's tokens come back
    plain = run(tiny_llama, [PROMPT_IDS[0]], [EXTRAS[1]])[0].outputs[0].token_ids
    assert batch[0].outputs[0].token_ids != plain and set(batch[0].outputs[0].token_ids) & set(PROMPT_IDS[0])
    assert batch[3].outputs[0].token_ids[-1] == EOS and len(batch[3].outputs[0].token_ids) == 5
    assert batch[3].outputs[0].finish_reason == "stop"


def reference_penalised_greedy(model, prompt, params, eos_ids):
    """The model's logits step by step (no cache, no batch), penalties written out token by token."""
    output = []
    while len(output) < params.max_tokens:
        logits = next_token_logits_naive(model, prompt + output).float().clone()
        if len(output) < params.min_tokens:
            for t in set(params.stop_token_ids) | set(eos_ids):
                logits[t] = -INF
        for t, b in (params.logit_bias or {}).items():
            logits[t] += b
        rp = params.repetition_penalty
        for t in set(prompt) | set(output):
            logits[t] = logits[t] / rp if logits[t] > 0 else logits[t] * rp
        for t in set(output):
            logits[t] -= params.frequency_penalty * output.count(t) + params.presence_penalty
        output.append(int(logits.argmax()))
        if output[-1] in eos_ids and len(output) >= params.min_tokens:
            break
    return output


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, repetition_penalty=0.3),
    SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, repetition_penalty=1.6),
    SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, frequency_penalty=1.2, presence_penalty=0.6),
    SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, logit_bias={4000: 8.0, 4001: 9.0},
                   presence_penalty=2.0),
    SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, frequency_penalty=-2.0, presence_penalty=-2.0),
], ids=["repetition<1", "repetition>1", "frequency+presence", "bias+presence", "negative"])
def test_greedy_with_penalties_equals_the_written_out_reference(tiny_llama, params):
    model, _ = tiny_llama
    (out,) = run(tiny_llama, [PROMPT_IDS[1]], [params])
    assert out.outputs[0].token_ids == reference_penalised_greedy(model, PROMPT_IDS[1], params, set())


def test_a_fault_in_the_logits_stage_ends_only_its_request(tiny_llama):
    """An id outside the vocabulary is refused at the door; one that slips past it (the
    params changed after the request was accepted) ends only its own request."""
    engine = LLMEngine(*tiny_llama, **OPTIONS)
    with pytest.raises(ValueError, match="logit_bias names token id"):
        engine.add_request("x", PROMPT_IDS[1], SamplingParams(logit_bias={10**7: 1.0}))
    bad = SamplingParams(temperature=0, max_tokens=8, logit_bias={5: 1.0})
    for i, params in enumerate([EXTRAS[0], bad, EXTRAS[2], EXTRAS[1]]):
        engine.add_request(str(i), PROMPT_IDS[i], params)
    bad.logit_bias = {10**7: 1.0}                      # slipped through: outside the vocabulary
    final = {}
    while engine.has_unfinished_requests():
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    outs = [final[str(i)] for i in range(4)]
    assert outs[1].error is not None and "logit_bias" in outs[1].error
    assert outs[1].outputs[0].finish_reason == "error"
    for i, params in ((0, EXTRAS[0]), (2, EXTRAS[2]), (3, EXTRAS[1])):
        (solo,) = run(tiny_llama, [PROMPT_IDS[i]], [params])
        assert outs[i].error is None and outs[i].outputs[0].token_ids == solo.outputs[0].token_ids
