"""Speculative decoding (n-gram proposer): greedy output token-identical to no speculation
(chat prompts, prefix hits, preemption in both modes, stop strings, n > 1, max_tokens landing
mid-run); the rejection sampler keeps the model's distribution (and a planted bug does not);
seeded sampling stays reproducible; rejected drafts give their blocks back."""
import pytest
import torch

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.spec.ngram import propose_ngram
from minillm.spec.rejection import target_probs, verify

from conftest import get_model

SPEC = {"method": "ngram", "num_speculative_tokens": 4}
REPEAT = "one two three four five six seven eight nine ten. " * 4


def test_ngram_proposer_finds_the_latest_longest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert propose_ngram(tokens, 3, 1, 3) == [7, 5, 1]          # the latest earlier "1 2 3"
    assert propose_ngram(tokens, 10, 1, 3) == [7, 5, 1, 2, 3]   # up to the end of what followed
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []           # nothing recurs
    assert propose_ngram([5, 6, 5], 2, 1, 1) == [6, 5]


def engines(model, tokenizer, spec=SPEC, **options):
    base = LLMEngine(model, tokenizer, **options)
    return base, LLMEngine(model, tokenizer, speculative_config=spec, **options)


SELF_DRAFT = {"method": "self_draft", "num_speculative_tokens": 3, "num_draft_layers": 1}


def prompts_for(tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat: " + REPEAT}], True)
    return [chat, REPEAT, "The capital of France is", REPEAT[:40]]


@pytest.mark.parametrize("name, method", [("tiny-llama", SPEC), ("tiny-qwen3", SPEC), ("SmolLM2-135M-Instruct", SPEC),
                                          ("tiny-llama", SELF_DRAFT), ("SmolLM2-135M-Instruct", {
                                              **SELF_DRAFT, "num_draft_layers": 26})])
def test_greedy_is_token_identical_to_no_speculation(name, method):
    model, tokenizer, _ = get_model(name)
    base, spec = engines(model, tokenizer, method, num_kv_blocks=256, block_size=8)
    greedy = [SamplingParams(max_tokens=40, temperature=0), SamplingParams(max_tokens=33, temperature=0),
              SamplingParams(max_tokens=40, temperature=0, stop=["seven"]), SamplingParams(
                  max_tokens=21, temperature=0, n=2, ignore_eos=True)]
    prompts = prompts_for(tokenizer)
    want = [[c.token_ids for c in o.outputs] for o in base.generate(prompts, greedy)]
    for _ in range(2):                         # the second time, every prompt's prefix is cached
        got = [[c.token_ids for c in o.outputs] for o in spec.generate(prompts, greedy)]
        assert got == want
    stats = spec.stats()
    assert stats["spec_accepted_tokens"] > 0 and 0 < stats["spec_acceptance_rate"] <= 1
    assert spec.block_manager.allocator.num_free == 256          # every block back, rejected drafts' too


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("method", [SPEC, {**SELF_DRAFT, "num_draft_layers": 26}], ids=["ngram", "self_draft"])
def test_greedy_is_identical_through_preemption(mode, method):
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")        # it repeats what it read: drafts land
    options = dict(num_kv_blocks=20, block_size=4, preemption_mode=mode, max_num_batched_tokens=64)
    base, spec = engines(model, tokenizer, method, **options)
    prompts = [REPEAT[:60], REPEAT[10:70], REPEAT[20:90]]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params)]
    assert got == want
    assert spec.stats()["num_preemptions"] > 0 and spec.stats()["spec_accepted_tokens"] > 0


def test_seeded_sampling_is_reproducible_and_blocks_come_back():
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")
    spec = LLMEngine(model, tokenizer, num_kv_blocks=128, block_size=4, speculative_config=SPEC,
                     enable_prefix_caching=False)
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=11, ignore_eos=True)
    first = spec.generate([REPEAT], params)[0].outputs[0].token_ids
    assert spec.generate([REPEAT], params)[0].outputs[0].token_ids == first and len(first) == 30
    assert spec.stats()["spec_proposed_tokens"] > 0
    assert spec.block_manager.allocator.num_free == 128           # every block back, drafts' too


def empirical(fn, logits, draft, samples, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.shape[-1])
    for _ in range(samples):
        counts[fn(logits, [draft], SamplingParams(temperature=1.0), g)[0]] += 1
    return counts / samples


def buggy_verify(logits, drafts, params, generator=None):
    """A planted bug: on rejection, resample from p instead of max(0, p - q)."""
    probs = target_probs(logits, params)
    if torch.rand(1, generator=generator) < probs[0, drafts[0]]:
        return [drafts[0]]
    return [int(torch.multinomial(probs[0], 1, generator=generator))]


def test_the_rejection_sampler_keeps_the_target_distribution():
    torch.manual_seed(0)
    for trial in range(3):
        logits = torch.randn(2, 8) * 1.5
        p = torch.softmax(logits[0], dim=-1)
        draft = int(torch.argmax(p))                    # a likely draft: accepted often
        distances = [0.5 * (empirical(verify, logits, draft, n, trial) - p).abs().sum() for n in (500, 8000)]
        assert distances[1] < 0.03 and distances[1] < distances[0] + 0.01, distances
        bug = 0.5 * (empirical(buggy_verify, logits, draft, 8000, trial) - p).abs().sum()
        assert bug > 2 * distances[1] + 0.02, (bug, distances)       # the test can tell a wrong sampler


def test_greedy_verification_accepts_exactly_the_argmax_run():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 3, 1, 4]):
        logits[row, best] = 5.0
    params = SamplingParams(temperature=0)
    assert verify(logits, [2, 3, 1], params) == [2, 3, 1, 4]        # all accepted, plus the bonus
    assert verify(logits, [2, 0, 1], params) == [2, 3]              # stops at the first miss, corrected
    assert verify(logits, [5, 3, 1], params) == [2]


def test_bad_speculative_config_is_refused_before_loading():
    model, tokenizer, _ = get_model("tiny-llama")
    for bad in ({"method": "eagle"}, {"num_speculative_tokens": 0}, {"numspec": 3}, "ngram",
                {"method": "self_draft", "num_draft_layers": 2}):
        with pytest.raises((ValueError, TypeError), match="speculative_config|SpeculativeConfig"):
            LLMEngine(model, tokenizer, speculative_config=bad)


def test_counts_per_request_and_in_metrics():
    import httpx
    from minillm.server.app import build_app
    from minillm.server.run import serve_in_thread, stop_server
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=128, speculative_config=SPEC)
    out = engine.generate([REPEAT], SamplingParams(max_tokens=20, temperature=0))[0]
    m = out.metrics
    assert 0 < m.spec_accepted_tokens <= m.spec_proposed_tokens
    srv = serve_in_thread(build_app(engine, "smol"))
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": REPEAT, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200
        text = httpx.get(srv.url + "/metrics").text
        accepted = next(float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith("minillm:spec_decode_num_accepted_tokens"))
        assert accepted >= m.spec_accepted_tokens and "minillm:spec_decode_acceptance_rate" in text
    finally:
        stop_server(srv)


def test_speculation_with_a_grammar_keeps_both_promises():
    """Structured outputs and drafts together: the answers validate, and greedy tokens equal a
    run without speculation (drafts the grammar refuses are cut; rows are masked per position)."""
    import json
    import jsonschema
    model, tokenizer, _ = get_model("SmolLM2-135M-Instruct")
    base, spec = engines(model, tokenizer, num_kv_blocks=256)
    schema = {"type": "array", "items": {"enum": ["one", "two", "three", "four"]}, "maxItems": 12}
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": 'List as JSON: ["one", "two", "one", '
                                                                         '"two", "one", "two", "one"]'}], True)
    params = [SamplingParams(max_tokens=60, temperature=0, structured_outputs={"json": schema}),
              SamplingParams(max_tokens=60, temperature=0.7, seed=2, structured_outputs={"json": schema})]
    want = base.generate([prompt, prompt], params)
    got = spec.generate([prompt, prompt], params)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    for out in got:
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    assert spec.stats()["spec_accepted_tokens"] > 0
