"""Fault isolation: a step is all or nothing for each request, not for the batch.

The engine's step (engine.py) runs its stages through this object. Whatever raises at a
stage ends only the requests it hit, with finish reason "error" and the message in
`RequestOutput.error`, and hands their blocks back; every other request goes on with
exactly the tokens it would have had alone:
  - a failed block move (swap, copy-on-write) ends the sequences whose KV it moved;
  - a failed batched forward is run again one sequence at a time, so a fault that belongs
    to one request ends that one, and a passing fault ends nobody;
  - a failed batched sampler samples each row alone from its generator's saved state;
  - bookkeeping, forking, logprobs and stop checks are guarded per sequence (`guarded`).
An interrupt (KeyboardInterrupt) ends the step's requests with an error and propagates.
"""
from __future__ import annotations

import time

import torch

from .sequence import Sequence, Status

FAILED = object()     # what `guarded` returns when the call raised


class FaultIsolation:
    def __init__(self, requests: dict, scheduler):
        self.requests, self.scheduler = requests, scheduler
        self.touched: dict[str, None] = {}     # requests the current step worked on or failed

    def begin(self, plan) -> None:
        self.touched = dict.fromkeys(seq.request_id for seq, _ in plan.scheduled)

    def move_blocks(self, apply, plan) -> bool:
        """apply(plan.block_ops); on a fault, end the sequences whose KV the moves carried."""
        try:
            apply(plan.block_ops)
            return True
        except Exception as e:
            hit = [s for s, _ in plan.scheduled] + [s for s in plan.preempted if s.status is Status.SWAPPED]
            for seq in hit:
                self.fail(seq.request_id, f"moving KV blocks failed: {e!r}")
            return False

    def forward(self, execute, scheduled: list[tuple[Sequence, int]]):
        """One forward for the whole batch. If it raises, run each sequence alone: the others'
        logits are those they would have had alone (their K/V slots are simply written again)."""
        try:
            return execute(scheduled)
        except Exception:
            pass
        samplers, rows, scores, drafted = [], [], [], {}
        for seq, n in scheduled:
            try:
                s, logits, prompt_logprobs, drafts = execute([(seq, n)])
            except Exception as e:
                self.fail(seq.request_id, f"the model failed on this request: {e!r}")
                continue
            samplers += s
            rows += [logits] if s else []
            scores += prompt_logprobs
            drafted.update(drafts)
        return samplers, (torch.cat(rows) if rows else torch.zeros(0, 0)), scores, drafted

    def sample(self, sample, seqs: list[Sequence], logits: torch.Tensor, generators: list) -> list:
        """One token per row (an Exception in place of a row that cannot be sampled). If the
        batched sampler raises, each row is sampled alone from its generator's state as it
        was, so a healthy row gets exactly the token it would have had."""
        states = [g.get_state() if g is not None else None for g in generators]
        try:
            return sample(logits, [s.params for s in seqs], generators).tolist()
        except Exception:
            pass
        tokens = []
        for i, (seq, g, state) in enumerate(zip(seqs, generators, states)):
            if g is not None:
                g.set_state(state)
            try:
                tokens.append(int(sample(logits[i:i + 1], [seq.params], [g])[0]))
            except Exception as e:
                tokens.append(e)
        return tokens

    def guarded(self, seq: Sequence, doing: str, fn, *args):
        """fn(*args), or FAILED after ending seq's request with the error."""
        try:
            return fn(*args)
        except Exception as e:
            self.fail(seq.request_id, f"{doing} failed: {e!r}")
            return FAILED

    def fail(self, request_id: str, message: str) -> None:
        """End a request with an error: each of its sequences finishes ("error") and hands
        its blocks back. The request's output reports the message."""
        req = self.requests.get(request_id)
        if req is None or req.error is not None:
            return
        req.error = message
        self.touched[request_id] = None
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "error")
        req.metrics.finished_time = time.monotonic()

    def fail_touched(self, message: str) -> None:
        """An interrupt or a bug outside the guarded stages: end every request of the step."""
        for rid in list(self.touched):
            self.fail(rid, message)
