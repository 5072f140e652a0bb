"""The engine's side of speculative decoding, around one ordinary step:

  before the step  propose(): each decoding sequence gets drafts (`seq.spec_token_ids`, plain
                   data: the scheduler budgets them, the runner feeds them after the sequence's
                   last token as extra query rows over the paged cache, like a short chunk)
  after the step   verify(): the model's rows for the last token and each draft decide what is
                   kept (rejection.py); each kept token goes through the engine's usual
                   bookkeeping (stop strings, EOS, max_tokens land mid-run), the accepted
                   drafts' K/V count as computed, and the slots of rejected drafts are given up:
                   the block table is trimmed to what the kept tokens need and no rejected token
                   ever enters a block hash (only computed, full blocks are hashed).

Speculation is skipped for a sequence whose logits are processed per token (penalties,
logit_bias, min_p, min_tokens, a grammar), and for the whole step above `max_batch_size`
running sequences.
"""
from __future__ import annotations

from ..sample.logits_processors import wants_processing
from .config import SpeculativeConfig
from .ngram import propose_ngram
from .rejection import verify


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config, self.max_model_len = config, max_model_len
        self.num_proposed = self.num_accepted = self.num_verifications = 0

    def eligible(self, seq) -> bool:
        p = seq.params
        return (bool(seq.output_token_ids) and seq.num_computed_tokens == len(seq) - 1
                and p.structured_outputs is None and not wants_processing(p, len(seq.output_token_ids)))

    def propose(self, running: list) -> None:
        for seq in running:
            seq.spec_token_ids = []
        if len(running) > self.config.max_batch_size:
            return
        c = self.config
        for seq in running:
            if not self.eligible(seq):
                continue
            room = min(c.num_speculative_tokens, seq.params.max_tokens - len(seq.output_token_ids) - 1,
                       self.max_model_len - len(seq) - 1)
            if room > 0:
                seq.spec_token_ids = propose_ngram(seq.token_ids, room, c.prompt_lookup_min, c.prompt_lookup_max)

    def verify(self, seq, logits, generator, emit, mark_computed, metrics) -> None:
        """Decide the kept tokens from logits [drafts + 1, V]; `emit(seq, token, row)` appends one
        (False once the sequence has finished); an accepted draft's K/V then count as computed.
        The request's metrics count the drafts proposed and accepted."""
        drafts, seq.spec_token_ids = seq.spec_token_ids, []
        tokens = verify(logits, drafts, seq.params, generator)
        self.num_verifications += 1
        self.num_proposed += len(drafts)
        self.num_accepted += len(tokens) - 1
        metrics.count_drafts(len(drafts), len(tokens) - 1)
        for i, token in enumerate(tokens):
            if not emit(seq, token, logits[i]):
                break
            if i < len(tokens) - 1:             # an accepted draft: its K/V were written by this step
                mark_computed(seq, 1)

    def stats(self) -> dict:
        n = self.num_verifications
        return {"spec_proposed_tokens": self.num_proposed, "spec_accepted_tokens": self.num_accepted,
                "spec_acceptance_rate": self.num_accepted / self.num_proposed if self.num_proposed else 0.0,
                "spec_mean_accepted_length": self.num_accepted / n if n else 0.0}
