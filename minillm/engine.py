"""The engine: requests in, one scheduled step at a time, outputs out.

    add_request ──► Scheduler ──► BlockManager ──► ModelRunner ──► sample ──► stop checks

`step()` runs one iteration: the scheduler picks who feeds which tokens, the
block manager's queued block moves (swap, copy-on-write) are applied, the runner does one
forward for the whole flat batch, each sampling sequence gets its token, and
finished sequences hand their blocks back at once.
"""
from __future__ import annotations

import itertools
import time

import torch

from .config import EngineConfig
from .attention.cpu_paged import CPUPagedAttention, kernel_available
from .attention.paged import TorchPagedAttention
from .kv.block_allocator import BlockAllocator
from .kv.block_manager import BlockManager
from .kv.prefix_cache import PrefixCache
from .kv.paged_cache import PagedKVCache
from .naive import prompt_to_ids
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .runner import ModelRunner
from .sampling import SamplingParams, make_generator, sample
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .stopping import StopChecker


class Request:
    """A prompt and its n sequences (only the first exists until the prompt is computed)."""

    def __init__(self, request_id, prompt, prompt_ids, params, priority, arrival):
        self.request_id, self.prompt, self.prompt_ids = request_id, prompt, prompt_ids
        self.params, self.priority = params, priority
        self.seqs: list[Sequence] = []
        self.metrics = RequestMetrics(arrival_time=arrival)

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)


def choose_backend(name: str, model):
    """"auto": the in-place C decode kernel for float32 on CPU when it builds, else the
    torch reference (same tokens either way; the kernel is faster at decode)."""
    if name == "auto":
        fast = model.device.type == "cpu" and model.dtype == torch.float32 and kernel_available()
        name = "cpu-kernel" if fast else "torch"
    return CPUPagedAttention() if name == "cpu-kernel" else TorchPagedAttention()


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig | None = None, *,
                 allocator_cls=BlockAllocator, prefix_cache_cls=PrefixCache, scheduler_cls=Scheduler,
                 block_manager_cls=BlockManager, **options):
        """Options are EngineConfig's fields. The *_cls arguments are the seams where a
        lesson plugs in the learner's class in place of the reference one."""
        self.config = config = config or EngineConfig(**options)
        self.model, self.tokenizer = model, tokenizer
        cfg = model.config
        self.max_model_len = min(config.max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        num_blocks = config.num_kv_blocks or self._blocks_from_memory()
        if num_blocks * config.block_size < self.max_model_len:
            self.max_model_len = num_blocks * config.block_size   # one sequence must always fit alone
        budget = config.max_num_batched_tokens or max(2048, self.max_model_len)
        if not config.enable_chunked_prefill and budget < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={budget} < max_model_len={self.max_model_len}: "
                             "a long prompt could never be scheduled; enable chunked prefill or raise it")
        swap_blocks = (config.swap_space or num_blocks) if config.preemption_mode == "swap" else 0
        self.block_manager = block_manager_cls(num_blocks, config.block_size, config.enable_prefix_caching,
                                               num_cpu_blocks=swap_blocks, allocator_cls=allocator_cls,
                                               prefix_cache_cls=prefix_cache_cls)
        self.kv_cache = PagedKVCache.for_model(model, num_blocks, config.block_size,
                                               choose_backend(config.attention_backend, model))
        if swap_blocks:
            self.kv_cache.enable_swap(swap_blocks)
        self.runner = ModelRunner(model, self.kv_cache)
        self.scheduler = scheduler_cls(self.block_manager, config.max_num_seqs, budget,
                                   config.enable_chunked_prefill, config.scheduling_policy,
                                   config.preemption_mode, config.static_batching)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer is not None else set(cfg.eos_token_ids)

    def _blocks_from_memory(self) -> int:
        per_block = PagedKVCache.bytes_per_block_for(self.model, self.config.block_size)
        budget = self.config.kv_cache_memory_bytes
        if budget is None:
            if self.model.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.model.device)
                budget = int(0.4 * free)
            else:
                budget = 1 << 30
        return max(1, budget // per_block)

    # -- public face -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    priority: int = 0) -> None:
        """Queue a prompt (text or token ids). Refuses, with a clear error, what can never run."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids = prompt_to_ids(self.tokenizer, prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit: max_model_len is "
                             f"{self.max_model_len} (prompt + at least one generated token)")
        vocab = self.model.config.vocab_size
        if max(ids) >= vocab or min(ids) < 0:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        req = Request(request_id, prompt if isinstance(prompt, str) else None, ids, params,
                      priority, time.monotonic())
        req.seqs.append(self._new_sequence(req, index=0))
        self.requests[request_id] = req
        self.scheduler.add(req.seqs[0])

    def _new_sequence(self, req: Request, index: int) -> Sequence:
        return Sequence(seq_id=next(self._seq_ids), request_id=req.request_id,
                        prompt_token_ids=req.prompt_ids, params=req.params, index=index,
                        generator=make_generator(req.params, self.model.device, offset=index),
                        stopper=StopChecker(req.params, self.tokenizer, self.eos_token_ids),
                        priority=req.priority, arrival=req.metrics.arrival_time)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """One iteration. Returns an output for each request that made progress."""
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self.requests[seq.request_id].metrics.num_preemptions += 1
        if not plan.scheduled:
            return []
        self.kv_cache.apply(self.block_manager.take_ops())
        now = time.monotonic()
        for seq, _ in plan.scheduled:
            m = self.requests[seq.request_id].metrics
            m.first_scheduled_time = m.first_scheduled_time or now
        samplers, logits = self.runner.execute(plan.scheduled)
        for seq, n in plan.scheduled:
            self.block_manager.mark_computed(seq, n)
        self._sample_and_stop(samplers, logits)
        touched = dict.fromkeys(seq.request_id for seq, _ in plan.scheduled)
        outputs = [self._output(self.requests[r]) for r in touched]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs

    # -- internals -----------------------------------------------------------------------
    def _sample_and_stop(self, samplers: list[Sequence], logits: torch.Tensor) -> None:
        rows, seqs = [], []
        for row, seq in enumerate(samplers):
            req = self.requests[seq.request_id]
            rows.append(row)
            seqs.append(seq)
            if seq.index == 0 and len(req.seqs) < req.params.n:    # prompt done: fork the n-1 others
                for i in range(1, req.params.n):
                    child = self._new_sequence(req, index=i)
                    self.block_manager.fork(seq, child)
                    child.status = Status.RUNNING
                    self.scheduler.running.append(child)
                    req.seqs.append(child)
                    rows.append(row)
                    seqs.append(child)
        if not seqs:
            return
        tokens = sample(logits[torch.tensor(rows, device=logits.device)], [s.params for s in seqs],
                        [s.generator for s in seqs]).tolist()
        now = time.monotonic()
        for seq, token in zip(seqs, tokens):
            req = self.requests[seq.request_id]
            req.metrics.first_token_time = req.metrics.first_token_time or now
            seq.output_token_ids.append(token)
            reason = seq.stopper.check(seq.output_token_ids)
            if reason is None and len(seq) >= self.max_model_len:
                reason = "length"
            if reason:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                if req.finished:
                    req.metrics.finished_time = now

    def _output(self, req: Request) -> RequestOutput:
        outs = [CompletionOutput(s.index, s.stopper.text, list(s.output_token_ids), s.finish_reason)
                for s in req.seqs]
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids, outs, req.finished,
                             req.seqs[0].num_cached_tokens, req.metrics)

    def stats(self) -> dict:
        bm, backend = self.block_manager, self.kv_cache.backend
        pc = bm.prefix_cache
        return {
            "num_preemptions": self.scheduler.num_preemptions,
            "num_recomputed_tokens": self.scheduler.num_recomputed_tokens,
            "num_cow_copies": bm.num_cow_copies,
            "num_swapped_out_blocks": bm.num_swapped_out_blocks,
            "num_swapped_in_blocks": bm.num_swapped_in_blocks,
            "prefix_cache_hit_rate": pc.hit_rate if pc else 0.0,
            "kv_blocks_used": bm.allocator.num_blocks - bm.num_free_blocks,
            "kv_blocks_total": bm.allocator.num_blocks,
            "attention_backend": getattr(backend, "name", type(backend).__name__),
        }

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, on_finish=None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. `on_finish(output)` is
        called as each request ends (progress bars hook in here)."""
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts) or (priority is not None and len(priority) != len(prompts)):
            raise ValueError("sampling params and priorities must be one, or one per prompt")
        base = next(self._seq_ids)
        ids = [f"gen-{base}-{i}" for i in range(len(prompts))]
        try:
            for i, (rid, prompt, p) in enumerate(zip(ids, prompts, params_list)):
                self.add_request(rid, prompt, p, priority[i] if priority else 0)
            final = {}
            while self.has_unfinished_requests():
                for out in self.step():
                    if out.finished:
                        final[out.request_id] = out
                        if on_finish is not None:
                            on_finish(out)
        except BaseException:
            for rid in ids:                # a bad prompt or an interrupt: leave nothing behind
                self.abort_request(rid)
            raise
        return [final[r] for r in ids]
