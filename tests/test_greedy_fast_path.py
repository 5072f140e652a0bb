"""The engine's short road for greedy rows (engine/sampling_stage.py, sample/sampler.py's
greedy_tokens): exactly the tokens of the general road, sample(), ties and NaNs included,
taken only by rows that ask for nothing else, and never changing the runner's logits."""
import pytest
import torch

import minillm.engine.sampling_stage as sampling_stage
from minillm.engine.engine import LLMEngine
from minillm.engine.fault_isolation import FaultIsolation
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.sampling_stage import plain_greedy, sample_live
from minillm.engine.sequence import Sequence
from minillm.sample.sampler import ARGMAX_CHUNK, CHUNKED_MIN_ROWS, greedy_tokens, sample
from minillm.sampling_params import SamplingParams

from conftest import get_model

GREEDY = SamplingParams(temperature=0)


def general(logits):
    return sample(logits, [GREEDY] * logits.shape[0], [None] * logits.shape[0])


def lowest_argmax(row: torch.Tensor) -> int:
    """The lowest id holding the row's max (the first NaN, if any: torch.argmax's rule)."""
    nan = torch.isnan(row)
    if nan.any():
        return int(nan.nonzero()[0])
    return int((row == row.max()).nonzero()[0])


@pytest.mark.parametrize("batch", [0, 1, CHUNKED_MIN_ROWS, CHUNKED_MIN_ROWS + 3, 64])
@pytest.mark.parametrize("vocab", [7, 3 * ARGMAX_CHUNK + 17, 64 * 37, ARGMAX_CHUNK, 49152, 128256])
def test_greedy_tokens_are_sample_s_tokens_ties_included(batch, vocab):
    """Chunks of 1024, 256 (Llama 3's 128,256 logits) or 64; no chunk divides 7 or 3089 (argmax)."""
    g = torch.Generator().manual_seed(batch * 100_003 + vocab)
    for kind in ("random", "ties", "nan", "edges"):
        if kind == "random":
            logits = torch.randn(batch, vocab, generator=g)
        else:                             # a few distinct values: the max is held by many ids
            logits = torch.randint(-3, 3, (batch, vocab), generator=g).float()
        if kind == "nan" and batch:
            logits[torch.rand(batch, vocab, generator=g) < 0.002] = float("nan")
        if kind == "edges" and batch:
            logits[0] = float("-inf")                     # an all -inf row: id 0, as argmax
            logits[-1, -1] = float("inf")                 # the max in the last id
        got = greedy_tokens(logits)
        assert got.dtype == torch.long and got.shape == (batch,)
        assert torch.equal(got, general(logits)), kind
        assert got.tolist() == [lowest_argmax(row) for row in logits], kind
        assert torch.equal(greedy_tokens(logits.bfloat16()), general(logits.bfloat16())), kind


def test_ties_go_to_the_lowest_id_across_chunks():
    logits = torch.zeros(CHUNKED_MIN_ROWS, 4 * ARGMAX_CHUNK)
    logits[0, [5, ARGMAX_CHUNK + 1, 3 * ARGMAX_CHUNK]] = 2.0       # in three chunks: the first chunk's
    logits[1, [2 * ARGMAX_CHUNK + 9, 2 * ARGMAX_CHUNK + 3]] = 1.0   # twice in one chunk: the lower
    logits[2] = 1.0                                                 # all tied: id 0
    want = [5, 2 * ARGMAX_CHUNK + 3, 0] + [0] * (CHUNKED_MIN_ROWS - 3)
    assert greedy_tokens(logits).tolist() == general(logits).tolist() == want


@pytest.mark.parametrize("params, plain", [
    (SamplingParams(temperature=0), True),
    (SamplingParams(temperature=0, seed=3, min_p=0.5), True),          # min_p never changes a greedy pick
    (SamplingParams(temperature=0, logprobs=2), False),                # logprobs: the general road
    (SamplingParams(temperature=0, repetition_penalty=1.3), False),
    (SamplingParams(temperature=0, logit_bias={3: 1.0}), False),
    (SamplingParams(temperature=0, min_tokens=2), False),              # until 2 tokens exist
    (SamplingParams(temperature=0, structured_outputs={"choice": ["a", "b"]}), False),
    (SamplingParams(temperature=0.7), False),
])
def test_only_rows_asking_for_nothing_but_the_greedy_token_take_the_short_road(params, plain):
    assert plain_greedy(Sequence(0, "r", [1, 2], params)) is plain


def stage_inputs(params_list, vocab=3000):
    outputs = OutputProcessor(None, {0}, torch.device("cpu"), vocab)
    seqs = [Sequence(i, f"r{i}", [1, 2, 3], p, output_token_ids=[4, 4]) for i, p in enumerate(params_list)]
    for s in seqs:
        outputs.add(s)
    logits = torch.randint(-2, 3, (len(seqs), vocab), generator=torch.Generator().manual_seed(1)).float()
    return seqs, logits, outputs


@pytest.mark.parametrize("mixed", [False, True])
def test_both_roads_leave_the_runner_s_logits_alone(mixed, monkeypatch):
    params = [GREEDY, SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.5)]
    params += [SamplingParams(temperature=0.8, seed=1)] if mixed else []
    seqs, logits, outputs = stage_inputs(params)
    before = logits.clone()
    roads = []
    monkeypatch.setattr(sampling_stage, "greedy_tokens", lambda x: roads.append("short") or x.argmax(-1))
    tokens = sample_live(list(enumerate(seqs)), logits, sample, FaultIsolation({}, None), outputs)
    assert torch.equal(logits, before) and roads == []            # a penalized row: the general road
    assert tokens[0] == lowest_argmax(before[0])
    plain = sample_live(list(enumerate(seqs[:1])), logits, sample, FaultIsolation({}, None), outputs)
    assert roads == ["short"] and plain == tokens[:1] and torch.equal(logits, before)


def test_forked_rows_read_their_parent_s_row():
    seqs, logits, outputs = stage_inputs([GREEDY, GREEDY, GREEDY])
    live = [(0, seqs[0]), (0, seqs[1]), (2, seqs[2])]              # n > 1: two samples share row 0
    tokens = sample_live(live, logits, sample, FaultIsolation({}, None), outputs)
    assert tokens == [lowest_argmax(logits[0])] * 2 + [lowest_argmax(logits[2])]


def test_the_engine_gives_the_same_tokens_on_either_road(monkeypatch):
    model, tokenizer, _ = get_model("tiny-llama")
    prompts = [[5, 6, 7, 8], [9, 10], list(range(100, 130)), [42]]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, n=2),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)]

    def run():
        engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4)
        return [[(c.token_ids, c.logprobs) for c in o.outputs] for o in engine.generate(prompts, params)]
    short = run()
    monkeypatch.setattr(sampling_stage, "plain_greedy", lambda seq: False)     # every batch: the general road
    assert run() == short
