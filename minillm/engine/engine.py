"""The engine: requests in, one scheduled step at a time, outputs out.

    add_request ──► Scheduler ──► BlockManager ──► ModelRunner ──► sample ──► stop checks

`step()` runs one iteration: the scheduler picks who feeds which tokens, the
block manager's queued block moves (swap, copy-on-write) are applied, the runner does one
forward for the whole flat batch, each sampling sequence gets its token, and
finished sequences hand their blocks back at once.

A step is all or nothing for each request: whatever raises inside it (a block move, the
model, the sampler, a stop check) ends only the requests it hit, with finish reason
"error" and the message in `RequestOutput.error`, and frees their blocks; every other
request goes on with exactly the tokens it would have had alone (`engine_step.py`).
"""
from __future__ import annotations

import itertools
import time

import torch

from ..attention import make_backend
from ..config import EngineConfig
from .step import EngineStep
from ..kv.block_allocator import BlockAllocator
from ..kv.block_manager import BlockManager, cdiv
from ..kv.paged_cache import PagedKVCache
from ..kv.prefix_cache import PrefixCache
from ..models.loader import place_model
from ..outputs import RequestOutput
from ..quant import quantize_model
from .request import Request, check_request
from ..runner.model_runner import ModelRunner
from ..sample.sampler import make_generator
from ..sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from ..text.stopping import StopChecker

MAX_IDLE_STEPS = 100     # generate(): steps in a row that schedule nothing before it calls it a deadlock


class LLMEngine(EngineStep):
    def __init__(self, model, tokenizer, config: EngineConfig | None = None, *,
                 allocator_cls=BlockAllocator, prefix_cache_cls=PrefixCache, scheduler_cls=Scheduler,
                 block_manager_cls=BlockManager, **options):
        """Pass an EngineConfig or its fields as keyword options, not both. The *_cls
        arguments are the seams where a lesson plugs in the learner's class."""
        if config is not None and options:
            raise TypeError(f"pass either an EngineConfig or engine options, not both (got config and "
                            f"{', '.join(sorted(options))}); e.g. dataclasses.replace(config, ...)")
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.config = config = config or EngineConfig(**options)
        self.model = model = place_model(model, config.device, config.dtype)
        if config.quantization is not None:      # weight-only linears, in place (quant/swap.py)
            quantize_model(model, config.quantization)
        self.tokenizer = tokenizer
        num_blocks = config.num_kv_blocks or self._blocks_from_memory()
        self.max_model_len = self._resolve_max_model_len(num_blocks)
        swap_blocks = (config.swap_space or num_blocks) if config.preemption_mode == "swap" else 0
        self.block_manager = block_manager_cls(num_blocks, config.block_size, config.enable_prefix_caching,
                                               num_cpu_blocks=swap_blocks, allocator_cls=allocator_cls,
                                               prefix_cache_cls=prefix_cache_cls)
        backend = make_backend(config.attention_backend, model.device, model.dtype)
        self.kv_cache = PagedKVCache.for_model(model, num_blocks, config.block_size, backend)
        if swap_blocks:
            self.kv_cache.enable_swap(swap_blocks)
        self.runner = ModelRunner(model, self.kv_cache, config, self.max_model_len)
        self.scheduler = scheduler_cls(self.block_manager, config.scheduler_config(self.max_model_len))
        self.requests: dict[str, Request] = {}
        self._held: dict[str, RequestOutput] = {}     # outputs generate() stepped past (see step)
        self._touched: dict[str, None] = {}           # requests the current step worked on or failed
        self._seq_ids = itertools.count()
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer is not None else set(model.config.eos_token_ids)

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

    def _resolve_max_model_len(self, num_blocks: int) -> int:
        """The longest sequence (prompt + output) the engine accepts. Asked for: refused,
        with the fix, when the model or the pool cannot hold it. Not asked for: the
        model's limit, or what the pool holds when that is less (one sequence must
        always fit alone, or preemption could not make progress)."""
        limit = self.model.config.max_position_embeddings
        pool = num_blocks * self.config.block_size
        asked = self.config.max_model_len
        if asked is None:
            return min(limit, pool)
        if asked > limit:
            raise ValueError(f"max_model_len={asked} is more than the model's max_position_embeddings={limit}")
        if asked > pool:
            raise ValueError(f"max_model_len={asked} does not fit the KV pool: {num_blocks} blocks of "
                             f"{self.config.block_size} tokens hold {pool}; raise num_kv_blocks to at least "
                             f"{cdiv(asked, self.config.block_size)} (or kv_cache_memory_bytes), "
                             "or lower max_model_len")
        return asked

    # -- public face -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    priority: int = 0) -> None:
        """Queue a prompt (text or token ids). Refuses, with a ValueError or TypeError naming
        the field, what is malformed or can never run; nothing is queued then."""
        params = params if params is not None else SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids = check_request(self, request_id, prompt, params, priority)
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
        self._held.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._held)

    def step(self) -> list[RequestOutput]:
        """One iteration. Returns an output for each request that made progress (plus any
        that a `generate` call stepped past for requests it did not own)."""
        held, self._held = self._held, {}
        for out in self._step():
            held[out.request_id] = out
        return list(held.values())

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
            "quantization": getattr(self.model, "quantization", None),
        }

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, on_finish=None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. `on_finish(output)` is
        called as each request ends (progress bars hook in here). Requests added by
        others with add_request keep running alongside; their outputs wait for step()."""
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a list, got {type(prompts).__name__}")
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts) or (priority is not None and len(priority) != len(prompts)):
            raise ValueError("sampling params and priorities must be one, or one per prompt")
        base = next(self._seq_ids)
        ids = [f"gen-{base}-{i}" for i in range(len(prompts))]
        own = set(ids)
        final: dict[str, RequestOutput] = {}
        try:
            for i, (rid, prompt, p) in enumerate(zip(ids, prompts, params_list)):
                self.add_request(rid, prompt, p, priority[i] if priority else 0)
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
            for rid in ids:                # a bad prompt or an interrupt: leave nothing behind
                if rid not in final:
                    self.abort_request(rid)
            raise
        return [final[r] for r in ids]
