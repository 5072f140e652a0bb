"""The runner's step inputs kept cheap: block tables kept as tensor rows between steps
(runner/block_tables.py) and a sequence's fed tokens read without copying the whole sequence
(Sequence.input_tokens): always exactly what building them afresh gives."""
import random

import torch

from minillm.engine.sequence import Sequence
from minillm.runner.block_tables import BlockTableRows
from minillm.sampling_params import SamplingParams


class Seq:
    def __init__(self, seq_id, table):
        self.seq_id, self.block_table = seq_id, table


def padded_afresh(seqs):
    width = max(len(s.block_table) for s in seqs)
    return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.long)


def test_block_table_rows_match_the_padded_lists_through_any_churn():
    rng = random.Random(0)
    rows = BlockTableRows(min_width=0)
    new = lambda i: Seq(i, [rng.randrange(100) for _ in range(rng.randrange(1, 6))])
    pool = [new(i) for i in range(30)]
    for step in range(1500):
        batch = rng.sample(pool, rng.randrange(1, 20))
        if rng.random() < 0.3:
            batch.sort(key=lambda s: s.seq_id)
        for s in batch:
            change = rng.random()
            if change < 0.2:
                s.block_table.append(rng.randrange(100))                 # a new block
            elif change < 0.3:
                s.block_table[rng.randrange(len(s.block_table))] = rng.randrange(100)   # copy-on-write
            elif change < 0.33:
                s.block_table[:] = [rng.randrange(100) for _ in range(rng.randrange(1, 40))]   # swapped back in
        if rng.random() < 0.05:                    # a sequence leaves; a new object may reuse its id
            i = rng.randrange(len(pool))
            pool[i] = new(pool[i].seq_id if rng.random() < 0.5 else 100 + step)
        got = rows.padded(batch)
        assert torch.equal(got, padded_afresh(batch)) and got.is_contiguous(), step
    same = [Seq(7, [1, 2]), Seq(7, [3])]          # ids that do not tell sequences apart: object ids instead
    assert torch.equal(rows.padded(same), padded_afresh(same))


def test_short_tables_are_left_to_paged_step_build():
    rows = BlockTableRows(min_width=3)
    assert rows.padded([Seq(0, [1, 2, 3]), Seq(1, [4])]) is None
    assert rows.padded([Seq(0, [1, 2, 3, 5]), Seq(1, [4])]).tolist() == [[1, 2, 3, 5], [4, 0, 0, 0]]


def test_the_returned_tensor_is_the_step_s_own():
    rows, s = BlockTableRows(min_width=0), Seq(0, [4, 5])
    first = rows.padded([s])
    s.block_table.append(6)
    rows.padded([s])
    assert first.tolist() == [[4, 5]]


def test_input_tokens_is_a_slice_of_input_token_ids():
    rng = random.Random(1)
    for _ in range(3000):
        seq = Sequence(0, "r", [rng.randrange(100) for _ in range(rng.randrange(1, 8))], SamplingParams(),
                       output_token_ids=[rng.randrange(100) for _ in range(rng.randrange(0, 8))],
                       spec_token_ids=[rng.randrange(100) for _ in range(rng.randrange(0, 4))])
        n = len(seq.input_token_ids)
        start = rng.randrange(0, n + 2)
        end = rng.randrange(start, n + 3)
        assert seq.input_tokens(start, end) == seq.input_token_ids[start:end]


def test_an_engine_gives_the_same_tokens_with_its_tables_kept_as_rows():
    """Long tables (block_size 2) through preemption, swapping and shared prefixes: kept as rows
    or converted afresh each step, the same tokens."""
    from conftest import get_model
    from minillm.engine.engine import LLMEngine
    model, tokenizer, _ = get_model("tiny-llama")
    shared = list(range(300, 360))
    prompts = [shared + list(range(1000 + 40 * i, 1000 + 40 * i + 6 + 7 * i)) for i in range(5)]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=4, max_tokens=20, ignore_eos=True, n=2)] * 2
    params.append(SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))

    def run(min_width):
        engine = LLMEngine(model, tokenizer, block_size=2, num_kv_blocks=200, max_num_seqs=6,
                           preemption_mode="swap", enable_prefix_caching=True)
        engine.runner.block_tables.min_width = min_width
        outs = engine.generate(prompts, params)
        return [[c.token_ids for c in o.outputs] for o in outs], engine.stats()
    rows, stats = run(0)
    assert stats["num_preemptions"] > 0 and stats["num_swapped_in_blocks"] > 0 and stats["num_cow_copies"] > 0
    assert rows == run(10**9)[0]
