"""A step's sampling stage: from the runner's logits to one token per sampling sequence.

    logits ─► live rows ─► penalties, logit_bias, min_tokens, min_p ─► grammar masks ─► sample()
                           (only the rows that ask: sample/logits_processors.py)

Most batches ask for nothing but greedy tokens: no logprobs, no extras, no grammar. They take
a short road, the argmax of each row read straight from the runner's logits (`greedy_tokens`):
no copy of the rows and no loop over them, and exactly the tokens sample() would give (the
lowest id among ties, in both). Every other batch takes the general road. On either road the
runner's logits are never changed (logprobs are read from them afterwards, raw), and a row
that fails to sample ends only its own request (fault_isolation.py).
"""
from __future__ import annotations

import torch

from ..sample.logits_processors import process_logits, wants_processing
from ..sample.sampler import greedy_tokens
from .fault_isolation import FAILED
from .sequence import Sequence


def plain_greedy(seq: Sequence) -> bool:
    """Does this sequence ask for the greedy token and nothing more?"""
    p = seq.params
    return (p.greedy and p.logprobs is None and not p.structured_outputs
            and not wants_processing(p, len(seq.output_token_ids)))


def sample_greedy(logits: torch.Tensor, params, generators) -> torch.Tensor:
    """sample()'s signature, for the short road: every row is greedy."""
    return greedy_tokens(logits)


def sample_live(live: list[tuple[int, Sequence]], logits: torch.Tensor, sample, faults, outputs) -> list:
    """live: (row of `logits`, sequence) pairs. A token per pair (an Exception where its row could
    not be sampled), by `sample` or, when every sequence is plain greedy, the short road."""
    seqs = [s for _, s in live]
    index = [r for r, _ in live]
    view = index == list(range(len(index)))             # nobody forked or failed: row i is live[i]
    rows = logits[:len(index)] if view else logits[index]
    if all(plain_greedy(s) for s in seqs):
        return faults.sample(sample_greedy, seqs, rows, [None] * len(seqs))
    rows = processed_logits(seqs, rows, view, faults, outputs)
    return faults.sample(sample, seqs, rows, [outputs.generator(s) for s in seqs])


def processed_logits(seqs: list[Sequence], rows: torch.Tensor, view: bool, faults, outputs) -> torch.Tensor:
    """The rows to sample from: each sequence's penalties, logit_bias, min_tokens and min_p
    applied to its own row with its own token history (sample/logits_processors.py), then the
    grammar masks. Rows that ask for none are not touched; when one does, the rows are copied
    first if they are the runner's own (`view`). A fault here ends only its own request."""
    asking = [i for i, s in enumerate(seqs) if wants_processing(s.params, len(s.output_token_ids))]
    if asking or any(s.params.structured_outputs for s in seqs):
        rows = rows.to(torch.float32, copy=view)         # what sample() computes in anyway
    for i in asking:
        seq = seqs[i]
        row = faults.guarded(seq, "applying penalties, logit_bias, min_tokens or min_p", process_logits,
                             rows[i], seq.params, seq.prompt_token_ids, seq.output_token_ids,
                             outputs.eos_token_ids)
        if row is not FAILED:
            rows[i] = row
    outputs.mask_logits(rows, seqs, lambda seq, e: faults.fail(
        seq.request_id, f"structured outputs failed: {e!r}"))          # grammar masks, last
    return rows
