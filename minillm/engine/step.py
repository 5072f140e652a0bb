"""How one engine step runs, all or nothing for each request (LLMEngine inherits this).

    schedule ──► apply block moves ──► forward ──► mark computed ──► sample (+ fork) ──► stop checks

Whatever raises at a stage ends only the requests it hit, with finish reason "error"
and the message in `RequestOutput.error`, and hands their blocks back; every other
request goes on with exactly the tokens it would have had alone:
  - a failed block move (swap, copy-on-write) ends the sequences whose KV it moved;
  - a failed batched forward is run again one sequence at a time (`_run_isolated`), so a
    fault that belongs to one request ends that one, and a passing fault ends nobody;
  - a failed batched sampler samples each row alone from its generator's saved state;
  - bookkeeping, forking, logprobs and stop checks are guarded per sequence.
An interrupt (KeyboardInterrupt) ends the step's requests with an error and propagates.
"""
from __future__ import annotations

import time

import torch

from ..sample.logprobs import token_logprobs
from ..outputs import CompletionOutput, RequestOutput
from .request import Request
from ..sample.sampler import sample
from .scheduler import SchedulerOutput
from .sequence import Sequence, Status


class EngineStep:
    """The step machinery of LLMEngine; it uses the engine's scheduler, block_manager,
    kv_cache, runner, requests, tokenizer and max_model_len."""

    def _step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self.requests[seq.request_id].metrics.num_preemptions += 1
        self._touched = dict.fromkeys(seq.request_id for seq, _ in plan.scheduled)
        try:
            self._run(plan)
        except BaseException as e:          # an interrupt, or a bug outside the guarded stages
            for rid in list(self._touched):
                self._fail(rid, f"the step failed: {e!r}")
            for out in self._collect_outputs():
                self._held[out.request_id] = out        # the next step() reports them
            raise
        return self._collect_outputs()

    def _collect_outputs(self) -> list[RequestOutput]:
        """An output for each request the step touched (or failed); finished ones leave."""
        outputs = [self._output(self.requests[r]) for r in self._touched if r in self.requests]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs

    def _run(self, plan: SchedulerOutput) -> None:
        try:
            self.kv_cache.apply(self.block_manager.take_ops())
        except Exception as e:              # the moves' sequences lost KV: end them, keep the rest
            hit = [s for s, _ in plan.scheduled] + [s for s in plan.preempted if s.status is Status.SWAPPED]
            for seq in hit:
                self._fail(seq.request_id, f"moving KV blocks failed: {e!r}")
            return
        if not plan.scheduled:
            return
        now = time.monotonic()
        for seq, _ in plan.scheduled:
            m = self.requests[seq.request_id].metrics
            m.first_scheduled_time = m.first_scheduled_time or now
        samplers, logits = self._run_isolated(plan.scheduled)
        for seq, n in plan.scheduled:
            if not seq.is_finished:
                self._guarded(seq, "recording computed tokens", self.block_manager.mark_computed, seq, n)
        alive = [(i, s) for i, s in enumerate(samplers) if not s.is_finished]
        if alive:
            self._sample_and_stop([s for _, s in alive], logits[[i for i, _ in alive]])

    def _run_isolated(self, scheduled: list[tuple[Sequence, int]]) -> tuple[list[Sequence], torch.Tensor]:
        """One forward for the whole batch. If it raises, run each sequence alone: a fault
        that belongs to one request ends only that one, and the others' logits are those
        they would have had alone (their K/V slots are simply written again)."""
        try:
            return self.runner.execute(scheduled)
        except Exception:
            pass
        samplers, rows = [], []
        for seq, n in scheduled:
            try:
                s, logits = self.runner.execute([(seq, n)])
            except Exception as e:
                self._fail(seq.request_id, f"the model failed on this request: {e!r}")
                continue
            samplers += s
            rows += [logits] if s else []
        return samplers, (torch.cat(rows) if rows else torch.zeros(0, 0))

    def _sample_and_stop(self, samplers: list[Sequence], logits: torch.Tensor) -> None:
        rows, seqs = [], []
        for row, seq in enumerate(samplers):
            req = self.requests[seq.request_id]
            rows.append(row)
            seqs.append(seq)
            if seq.index == 0 and len(req.seqs) < req.params.n:    # prompt done: fork the n-1 others
                for i in range(1, req.params.n):
                    child = self._new_sequence(req, index=i)
                    req.seqs.append(child)
                    if self._guarded(seq, "forking", self.scheduler.add_fork, seq, child) is _FAILED:
                        break
                    rows.append(row)
                    seqs.append(child)
        live = [(r, s) for r, s in zip(rows, seqs) if not s.is_finished]
        if not live:
            return
        tokens = self._sample([s for _, s in live], logits[[r for r, _ in live]])
        now = time.monotonic()
        for (row, seq), token in zip(live, tokens):
            if seq.is_finished:             # a sibling's failure ended the whole request
                continue
            if isinstance(token, Exception):
                self._fail(seq.request_id, f"sampling failed: {token!r}")
                continue
            if seq.params.logprobs is not None and self._guarded(
                    seq, "computing logprobs", self._record_logprobs, seq, logits[row], token) is _FAILED:
                continue
            req = self.requests[seq.request_id]
            req.metrics.first_token_time = req.metrics.first_token_time or now
            seq.output_token_ids.append(token)
            reason = self._guarded(seq, "checking stop conditions", seq.stopper.check, seq.output_token_ids)
            if reason is _FAILED:
                continue
            if reason is None and len(seq) >= self.max_model_len:
                reason = "length"           # unreachable when add_request checked max_tokens
            if reason:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                if req.finished:
                    req.metrics.finished_time = now

    def _record_logprobs(self, seq: Sequence, logits: torch.Tensor, token: int) -> None:
        seq.logprobs = seq.logprobs if seq.logprobs is not None else []
        seq.logprobs.append(token_logprobs(logits, token, seq.params.logprobs, self.tokenizer))

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list:
        """One token per row (an Exception in place of a row that cannot be sampled). If the
        batched sampler raises, each row is sampled alone from its generator's state as it
        was, so a healthy row gets exactly the token it would have had."""
        gens = [s.generator for s in seqs]
        states = [g.get_state() if g is not None else None for g in gens]
        try:
            return sample(logits, [s.params for s in seqs], gens).tolist()
        except Exception:
            pass
        tokens = []
        for i, (seq, g, state) in enumerate(zip(seqs, gens, states)):
            if g is not None:
                g.set_state(state)
            try:
                tokens.append(int(sample(logits[i:i + 1], [seq.params], [g])[0]))
            except Exception as e:
                tokens.append(e)
        return tokens

    def _guarded(self, seq: Sequence, doing: str, fn, *args):
        """fn(*args), or _FAILED after ending seq's request with the error."""
        try:
            return fn(*args)
        except Exception as e:
            self._fail(seq.request_id, f"{doing} failed: {e!r}")
            return _FAILED

    def _fail(self, request_id: str, message: str) -> None:
        """End a request with an error: each of its sequences finishes ("error") and
        hands its blocks back. The request's output reports the message."""
        req = self.requests.get(request_id)
        if req is None or req.error is not None:
            return
        req.error = message
        self._touched[request_id] = None
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "error"
                self.scheduler.finish(seq)
        req.metrics.finished_time = time.monotonic()

    def _output(self, req: Request) -> RequestOutput:
        outs = [CompletionOutput(s.index, s.stopper.text, list(s.output_token_ids), s.finish_reason,
                                 None if s.logprobs is None else list(s.logprobs)) for s in req.seqs]
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids, outs, req.finished,
                             req.seqs[0].num_cached_tokens, req.metrics, req.error)


_FAILED = object()     # what _guarded returns when the call raised
