"""The engine: requests in, one scheduled step at a time, outputs out.

    add_request ──► Scheduler ──► BlockManager ──► ModelRunner ──► penalties ──► sample ──► stop checks

Built in one direction: the options are resolved once (resolved_config.py), then the runner
(its own model, the KV pool, the attention backend), then the block manager and the
scheduler. `step()` is the diagram: the scheduler's plan (plain data, each entry checked:
plan_check.py), its block moves, one forward for the flat batch, a token for each sampling
sequence, the bookkeeping, and an output per request. A fault inside one request's work
ends only that request (fault_isolation.py).
"""
from __future__ import annotations

import itertools
import time

from ..attention.paged import slot_mapping
from ..config import EngineConfig
from ..kv.block_allocator import BlockAllocator
from ..kv.block_manager import BlockManager
from ..kv.prefix_cache import PrefixCache
from ..lora.manager import attach_lora, register_lora
from ..outputs import RequestOutput
from ..distributed.executor import build_runner
from ..sample.sampler import sample
from ..sampling_params import SamplingParams
from ..structured.matchers import StructuredOutputs
from .fault_isolation import FAILED, FaultIsolation
from .output_processor import OutputProcessor
from .plan_check import plan_errors
from .request import Request, check_request
from .resolved_config import resolve_config
from .sampling_stage import sample_live
from .scheduler import Scheduler, SchedulerOutput
from .stats import engine_stats
from ..spec.speculator import Speculator
from .sequence import Sequence

MAX_IDLE_STEPS = 100     # generate(): steps in a row that schedule nothing before it calls it a deadlock


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig | None = None, *,
                 allocator_cls=BlockAllocator, prefix_cache_cls=PrefixCache, scheduler_cls=Scheduler,
                 block_manager_cls=BlockManager, slot_mapping_fn=slot_mapping, shard_layer_fn=None, partition_fn=None,
                 structured_outputs_cls=StructuredOutputs, speculator_cls=Speculator, **options):
        """Pass an EngineConfig or its fields as keyword options, not both. The *_cls and *_fn
        arguments are the seams where a lesson plugs in the learner's piece. The engine runs
        its own copy of the model's module tree (runner/engine_model.py says what that costs)."""
        if config is not None and options:
            raise TypeError(f"pass either an EngineConfig or engine options, not both (got config and "
                            f"{', '.join(sorted(options))}); e.g. dataclasses.replace(config, ...)")
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.config = config = config or EngineConfig(**options)
        self.resolved = resolved = resolve_config(config, model)
        self.runner = build_runner(model, resolved, config, slot_mapping_fn, shard_layer_fn, partition_fn)
        self.block_manager = block_manager_cls(resolved.num_kv_blocks, config.block_size,
                                               config.enable_prefix_caching, num_cpu_blocks=resolved.num_swap_blocks,
                                               allocator_cls=allocator_cls, prefix_cache_cls=prefix_cache_cls)
        self.scheduler = scheduler_cls(self.block_manager, resolved.scheduler_config(config))
        self.lora = attach_lora(self.runner, self.scheduler, config) if config.enable_lora else None
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_ids if tokenizer is not None else set(model.config.eos_token_ids)
        self.output_processor = OutputProcessor(tokenizer, eos, resolved.device, resolved.vocab_size,
                                                structured_outputs_cls)
        self.requests: dict[str, Request] = {}
        self.faults = FaultIsolation(self.requests, self.scheduler)
        self._held: dict[str, RequestOutput] = {}     # outputs generate() stepped past (see step)
        self._seq_ids = itertools.count()
        self._last_plan = SchedulerOutput()
        spec = config.speculative_config
        self.speculator = speculator_cls(spec, resolved.max_model_len) if spec is not None else None

    # what the lessons and the server read
    model = property(lambda self: self.runner.model, doc="the model this engine runs (its own tree)")
    kv_cache = property(lambda self: self.runner.kv_cache)
    max_model_len = property(lambda self: self.resolved.max_model_len)
    last_plan = property(lambda self: self._last_plan, doc="the latest step's plan (lessons draw it)")

    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    priority: int = 0, lora_request=None) -> None:
        """Queue a prompt (text or token ids), under a LoRA adapter if `lora_request` names one. Refuses,
        with a ValueError or TypeError naming the field, what is malformed or can never run; nothing is queued then."""
        params = params if params is not None else SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        r = self.resolved
        ids = check_request(request_id, prompt, params, priority, self.tokenizer, vocab_size=r.vocab_size,
                            max_model_len=r.max_model_len, max_num_seqs=self.config.max_num_seqs)
        self.output_processor.structured.check(params.structured_outputs)      # a bad grammar: refused here
        register_lora(self.lora, lora_request)                                 # a bad adapter: refused here
        req = Request(request_id, prompt if isinstance(prompt, str) else None, ids, params,
                      priority, time.monotonic(), lora_request)
        req.seqs.append(self._new_sequence(req, index=0))
        self.requests[request_id] = req
        self.scheduler.add(req.seqs[0])

    def _new_sequence(self, req: Request, index: int) -> Sequence:
        seq = Sequence(seq_id=next(self._seq_ids), request_id=req.request_id, prompt_token_ids=req.prompt_ids,
                       params=req.params, index=index, priority=req.priority, arrival=req.metrics.arrival_time,
                       lora_request=req.lora_request)
        self.output_processor.add(seq)
        return seq

    def _unused_request_id(self) -> str:
        """An id for generate()'s own requests that no request in the engine has (checked: a
        caller's add_request may use any string, "gen-0-0" included)."""
        while True:
            rid = f"gen-{next(self._seq_ids)}"
            if rid not in self.requests and rid not in self._held:
                return rid

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away)."""
        req = self.requests.pop(request_id, None)
        self._held.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        self.output_processor.remove(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._held)

    def shutdown(self) -> None:
        """End every request (finish reason "abort") and free its blocks; the engine stays usable.
        The server calls it when it stops; `with LLMEngine(...) as engine:` calls it on leaving."""
        for request_id in list(self.requests):
            self.abort_request(request_id)
        self._held.clear()

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def step(self) -> list[RequestOutput]:
        """One iteration. Returns an output for each request that made progress (plus any
        that a `generate` call stepped past for requests it did not own)."""
        held, self._held = self._held, {}
        for out in self._step():
            held[out.request_id] = out
        return list(held.values())

    def stats(self) -> dict:
        return engine_stats(self)

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, on_finish=None, lora_request=None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. `on_finish(output)` is
        called as each request ends (progress bars hook in here). Requests added by
        others with add_request keep running alongside; their outputs wait for step()."""
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a list, got {type(prompts).__name__}")
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if any(len(x) != len(prompts) for x in (params_list, loras, prompts if priority is None else priority)):
            raise ValueError("sampling params, priorities and lora requests must be one, or one per prompt")
        ids = [self._unused_request_id() for _ in prompts]      # never one the caller uses
        own, added = set(ids), []
        final: dict[str, RequestOutput] = {}
        try:
            for i, (rid, prompt, p) in enumerate(zip(ids, prompts, params_list)):
                self.add_request(rid, prompt, p, priority[i] if priority else 0, loras[i])
                added.append(rid)
            idle = 0
            while len(final) < len(ids):
                outputs = self._step()
                idle = 0 if outputs else idle + 1
                if idle > MAX_IDLE_STEPS:
                    raise RuntimeError(f"the engine scheduled nothing for {idle} steps with "
                                       f"{len(ids) - len(final)} request(s) unfinished: the scheduler is stuck")
                for out in outputs:
                    if out.request_id not in own:
                        self._held[out.request_id] = out       # someone else's: step() delivers it
                    elif out.finished:
                        final[out.request_id] = out
                        if on_finish is not None:
                            on_finish(out)
        except BaseException:
            for rid in added:              # a bad prompt or an interrupt: leave nothing of ours behind
                if rid not in final:
                    self.abort_request(rid)
            raise
        return [final[r] for r in ids]

    def _step(self) -> list[RequestOutput]:
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.output_processor.grammar)   # drafts, on each seq
        plan = self._last_plan = self.scheduler.plan_step()           # who feeds which tokens, block moves
        faults = self.faults                                          # a fault ends only the requests it hits
        faults.begin(plan)
        try:
            self._drop_bad_plan_entries(plan)
            self._record_schedule(plan)
            if faults.move_blocks(self.runner.apply_block_ops, plan) and plan.scheduled:
                samplers, logits, scores, drafted = faults.forward(self.runner.execute, plan.scheduled)
                self.output_processor.record_prompt_logprobs(scores)
                for seq, n in plan.scheduled:                    # their K/V are in (drafts: once accepted)
                    if not seq.is_finished:
                        faults.guarded(seq, "recording computed tokens", self.scheduler.mark_computed, seq,
                                       n - len(seq.spec_token_ids))
                rows, seqs = self._fork(samplers)                                     # n > 1: prompt done
                live = [(r, s) for r, s in zip(rows, seqs) if not s.is_finished]
                tokens = self._sample(live, logits)
                for (row, seq), token in zip(live, tokens):                           # append, stop checks
                    self._emit(seq, token, logits[row] if seq.params.logprobs is not None else None)
                self._verify_drafts(drafted)                                          # speculation: keep what the model agrees with
        except BaseException as e:          # an interrupt, or a bug outside the guarded stages
            faults.fail_touched(f"the step failed: {e!r}")
            self._held.update((out.request_id, out) for out in self._collect_outputs())   # the next step()
            raise
        return self._collect_outputs()

    def _drop_bad_plan_entries(self, plan: SchedulerOutput) -> None:
        """A plan entry the runner cannot run (more tokens than the sequence has left, no
        slots for them: plan_check.py) ends its request with an error naming the scheduler."""
        bad = plan_errors(plan.scheduled, self.scheduler, self.config.block_size)
        for seq, message in bad:
            self.faults.fail(seq.request_id, message)
        if bad:
            plan.scheduled = [(s, n) for s, n in plan.scheduled if not s.is_finished]

    def _verify_drafts(self, drafted: dict) -> None:
        for seq, rows in drafted.values():
            if not seq.is_finished:
                self.faults.guarded(seq, "verifying drafted tokens", self.speculator.verify, seq, rows,
                                    self.output_processor.generator(seq), self._emit, self.scheduler.mark_computed,
                                    self.requests[seq.request_id].metrics, self.output_processor.grammar(seq))
                self.block_manager.trim(seq)            # rejected drafts' slots given back

    def _record_schedule(self, plan: SchedulerOutput) -> None:
        now = time.monotonic()
        for seq in plan.preempted:
            self.requests[seq.request_id].metrics.num_preemptions += 1
        for seq, _ in plan.scheduled:
            m = self.requests[seq.request_id].metrics
            m.first_scheduled_time = m.first_scheduled_time or now

    def _fork(self, samplers: list[Sequence]) -> tuple[list[int], list[Sequence]]:
        """Each sampling sequence's logits row; a request whose prompt just finished (n > 1)
        forks its n - 1 other samples here, sharing the parent's row and blocks."""
        rows, seqs = [], []
        for row, seq in enumerate(samplers):
            if seq.is_finished:
                continue
            rows.append(row)
            seqs.append(seq)
            req = self.requests[seq.request_id]
            if seq.index == 0 and len(req.seqs) < req.params.n:
                for i in range(1, req.params.n):
                    child = self._new_sequence(req, index=i)
                    req.seqs.append(child)
                    if self.faults.guarded(seq, "forking", self.scheduler.add_fork, seq, child) is FAILED:
                        break
                    rows.append(row)
                    seqs.append(child)
        return rows, seqs

    def _sample(self, live: list[tuple[int, Sequence]], logits) -> list:
        """A token per live (row, sequence), or the Exception its row raised (sampling_stage.py)."""
        return sample_live(live, logits, sample, self.faults, self.output_processor)

    def _emit(self, seq: Sequence, token, logits_row) -> bool:
        """A new token (or a sampling failure): logprobs, appended, stop checks. True while it runs on."""
        faults, outputs = self.faults, self.output_processor
        if seq.is_finished:                 # a sibling's failure ended the whole request
            return False
        if isinstance(token, Exception):
            faults.fail(seq.request_id, f"sampling failed: {token!r}")
            return False
        token = int(token)
        if seq.params.logprobs is not None and faults.guarded(
                seq, "computing logprobs", outputs.record_logprobs, seq, logits_row, token) is FAILED:
            return False
        req, now = self.requests[seq.request_id], time.monotonic()
        req.metrics.first_token_time = req.metrics.first_token_time or now
        self.scheduler.append_token(seq, token)
        reason = faults.guarded(seq, "checking stop conditions", outputs.check_stop, seq)
        if reason is FAILED:
            return False
        if reason is None and len(seq) >= self.max_model_len:
            reason = "length"               # unreachable when add_request checked max_tokens
        if reason:
            self.scheduler.finish(seq, reason)
            if req.finished:
                req.metrics.finished_time = now
        return not reason

    def _collect_outputs(self) -> list[RequestOutput]:
        """An output for each request the step touched (or failed); finished ones leave."""
        outputs = [self.output_processor.output(self.requests[r]) for r in self.faults.touched if r in self.requests]
        for out in outputs:
            if out.finished:
                self.output_processor.remove(self.requests.pop(out.request_id))
        return outputs
