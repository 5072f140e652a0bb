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

A sequence with a grammar (structured outputs) speculates too: its drafts are cut at the
first token the grammar would refuse, and each verified row is masked by the grammar as it
stands after the drafts before it (the matcher consumes the drafts, then rolls back; only the
kept tokens advance it for good). Speculation is skipped for a sequence whose logits are
processed per token (penalties, logit_bias, min_p, min_tokens), and for the whole step above
`max_batch_size` running sequences.

The proposer and the rejection sampler are two methods, `draft_tokens` and `kept_tokens`: the
seam where lesson 11 plugs the learner's pieces in (`LLMEngine(..., speculator_cls=...)`).
"""
from __future__ import annotations

from ..sample.logits_processors import wants_processing
from .config import SpeculativeConfig
from .ngram import propose_ngram     # (self_draft drafts in the runner: self_draft.py)
from .rejection import verify
from ..structured.matchers import apply_masks


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config, self.max_model_len = config, max_model_len
        self.num_proposed = self.num_accepted = self.num_verifications = 0

    def eligible(self, seq) -> bool:
        return (bool(seq.output_token_ids) and seq.num_computed_tokens == len(seq) - 1
                and not wants_processing(seq.params, len(seq.output_token_ids)))

    def propose(self, running: list, grammar_of=lambda seq: None) -> None:
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
            grammar = grammar_of(seq)
            if room <= 0:
                continue
            if c.method != "ngram":               # placeholders: the runner drafts them (self_draft.py, draft_model.py)
                seq.spec_token_ids = [0] * room if grammar is None else []
                continue
            seq.spec_token_ids = self.draft_tokens(seq.token_ids, room)
            if grammar is not None and seq.spec_token_ids:      # only drafts the grammar allows
                fit = grammar.matcher.try_consume_tokens(seq.spec_token_ids)
                grammar.matcher.rollback(fit)
                del seq.spec_token_ids[fit:]

    def verify(self, seq, logits, generator, emit, mark_computed, metrics, grammar=None) -> None:
        """Decide the kept tokens from logits [drafts + 1, V]; `emit(seq, token, row)` appends one
        (False once the sequence has finished); an accepted draft's K/V then count as computed.
        The request's metrics count the drafts proposed and accepted."""
        drafts, seq.spec_token_ids = seq.spec_token_ids, []
        scored = logits if grammar is None else masked_by_grammar(logits, drafts, grammar)
        tokens = self.kept_tokens(scored, drafts, seq.params, generator)   # (logprobs stay the model's own: logits)
        self.num_verifications += 1
        self.num_proposed += len(drafts)
        self.num_accepted += len(tokens) - 1
        metrics.count_drafts(len(drafts), len(tokens) - 1)
        for i, token in enumerate(tokens):
            if not emit(seq, token, logits[i]):
                break
            if i < len(tokens) - 1:             # an accepted draft: its K/V were written by this step
                mark_computed(seq, 1)

    # The two pieces lesson 11 has the learner write, as methods: a subclass passed to
    # LLMEngine(speculator_cls=...) runs its own proposer and rejection sampler in the engine.
    def draft_tokens(self, tokens: list[int], k: int) -> list[int]:
        """Up to k drafts to follow `tokens`: the n-gram proposal (ngram.py)."""
        c = self.config
        return propose_ngram(tokens, k, c.prompt_lookup_min, c.prompt_lookup_max)

    def kept_tokens(self, logits, drafts: list[int], params, generator) -> list[int]:
        """The tokens to emit, from the model's rows for the last token and each draft (rejection.py)."""
        return verify(logits, drafts, params, generator)

    def stats(self) -> dict:
        n = self.num_verifications
        return {"spec_proposed_tokens": self.num_proposed, "spec_accepted_tokens": self.num_accepted,
                "spec_acceptance_rate": self.num_accepted / self.num_proposed if self.num_proposed else 0.0,
                "spec_mean_accepted_length": self.num_accepted / n if n else 0.0}


def masked_by_grammar(logits, drafts: list[int], grammar):
    """Row i keeps what the grammar allows after drafts[:i] (consumed, then rolled back)."""
    masks = []
    for i in range(len(drafts) + 1):
        masks.append(grammar.allowed())
        if i < len(drafts):
            grammar.matcher.consume_token(drafts[i])
    grammar.matcher.rollback(len(drafts))
    rows = logits.float().clone()
    apply_masks(rows, masks, list(range(len(drafts) + 1)))
    return rows
