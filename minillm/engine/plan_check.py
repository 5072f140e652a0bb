"""The engine's check of each step's plan, before the runner sees it.

The scheduler is a seam a learner fills (lesson 05's `schedule()`, plugged in with
`LLMEngine(scheduler_cls=...)`). A plan that feeds a sequence more tokens than it has left,
or tokens with no slot in its block table, would reach the model as a shape error deep in
attention (`rope_write_kv`), far from the mistake. So every (seq, n) is checked here: a few
integer comparisons per scheduled sequence, nothing that grows with a sequence's length.
A bad entry ends only its request, with an error naming the scheduler class and the
mistake; the rest of the batch runs on.
"""
from __future__ import annotations

from .sequence import Sequence, Status


def plan_errors(scheduled: list[tuple[Sequence, int]], scheduler, block_size: int) -> list[tuple[Sequence, str]]:
    """(seq, message) for each entry of a plan's `scheduled` list the runner must not run."""
    bad, seen, running = [], set(), Status.RUNNING
    for seq, n in scheduled:
        end = seq.num_computed_tokens + n if type(n) is int else 0
        # end > seq's tokens (drafts included) is n > seq.num_uncomputed_tokens, spelled out: the
        # property calls would cost several times the rest of the check at a large batch
        if (end <= seq.num_computed_tokens or seq.seq_id in seen or seq.status is not running
                or end > len(seq.prompt_token_ids) + len(seq.output_token_ids) + len(seq.spec_token_ids)
                or len(seq.block_table) * block_size < end):
            bad.append((seq, f"scheduler {type(scheduler).__name__} planned {_why_bad(seq, n, block_size, seen)}"))
        seen.add(seq.seq_id)
    return bad


def _why_bad(seq: Sequence, n, block_size: int, seen: set) -> str:
    """What is wrong with one entry (only called for a bad one: the messages cost more than the checks)."""
    what = f"request {seq.request_id!r}" + (f" (sample {seq.index})" if seq.index else "")
    if type(n) is not int or n < 1:           # a bool is not a token count
        return f"{n!r} tokens for {what}: a scheduled sequence feeds an int of at least 1 token"
    tokens = f"{n} token" if n == 1 else f"{n} tokens"
    if seq.seq_id in seen:
        return f"{what} twice in one step: each sequence appears once, with all its tokens"
    if seq.status is not Status.RUNNING:
        return (f"{tokens} for {what}, which is not running (status {seq.status.name}): an admitted "
                f"sequence gets its blocks, status RUNNING and a place in scheduler.running")
    left = seq.num_uncomputed_tokens
    if n > left:
        cached = (f"; its first {seq.num_cached_tokens} tokens were prefix-cache hits, which allocate() marks "
                  f"computed: budget a new prompt with block_manager.num_tokens_to_compute(seq)"
                  if seq.num_cached_tokens and not seq.output_token_ids else "")
        return f"{tokens} for {what} but it has only {left} left to compute{cached}"
    slots = len(seq.block_table) * block_size
    return (f"{tokens} for {what} after its {seq.num_computed_tokens} computed ones, but its block table "
            f"has slots for {slots}: call block_manager.append_slots(seq, n) for every scheduled sequence")
