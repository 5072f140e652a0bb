"""Lay out one step as a flat batch and run the model over the paged cache.

The scheduler says "sequence s feeds its next n tokens"; the runner turns that into
input ids, positions and the paged attention layout, runs the forward once for
everyone, and returns the logits of the sequences whose last fed token is their
newest one (a prompt chunk that ends mid-prompt samples nothing yet), plus, for requests
that ask for prompt logprobs, the scores of the prompt tokens this chunk predicts.

A pure decode step (every sequence feeds its one newest token) can take a faster
road with static shapes (`static_decode.py`): compiled with `compile=True`
(`compiled_decode.py`), replayed as a CUDA graph on CUDA unless `enforce_eager=True`
(`cuda_graphs.py`). Prefill and mixed steps always run here, eagerly.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..attention import make_backend
from ..attention.paged import PagedStep, slot_mapping
from ..kv.paged_cache import PagedKVCache
from ..sample.logprobs import PromptLogprobs, score_prompt_tokens
from ..spec.draft_model import load_draft_model
from ..spec.self_draft import draft_in_place
from .block_tables import BlockTableRows
from .compiled_decode import CompiledDecodeStep
from .cuda_graphs import CUDAGraphDecode, capture_safe
from .engine_model import model_for_engine
from .fixed_shape_decode import StaticDecodeStep


class ForwardOutput(NamedTuple):
    samplers: list                 # sequences that sample one token, in row order
    logits: torch.Tensor           # [len(samplers), V]
    prompt_logprobs: list          # PromptLogprobs chunks (SamplingParams.prompt_logprobs)
    drafted: dict                  # seq_id -> (sequence, logits [drafts + 1, V]) to verify


class ModelRunner:
    def __init__(self, model, kv_cache: PagedKVCache, config=None, max_model_len: int | None = None,
                 slot_mapping_fn=slot_mapping, draft_model=None):
        """Run `model` over `kv_cache` as given. `config` (an EngineConfig) and the engine's resolved
        `max_model_len` turn on the static decode step when `compile` is set, or on CUDA unless
        `enforce_eager` is. `slot_mapping_fn(block_table, positions, block_size)`: where each token's
        K/V go (lesson 03 plugs the learner's in here). An engine builds its runner with `build`."""
        self.model = model
        self.kv_cache = kv_cache
        self.slot_mapping_fn = slot_mapping_fn
        self.block_tables = BlockTableRows()                 # kept between steps (block_tables.py)
        self.static_step, self.run_decode = None, None       # the fast decode road, when on
        self.num_draft_layers = self_draft_layers(model, config)     # speculation by the model's first layers
        self.draft_model = draft_model                               # or by a smaller model (spec/draft_model.py)
        self.lora = None                                             # enable_lora: lora/manager.py sets it
        if config is not None:
            self.static_step, self.run_decode = make_fast_decode(model, kv_cache, config, max_model_len)

    @classmethod
    def build(cls, model, resolved, config, slot_mapping_fn=slot_mapping) -> "ModelRunner":
        """The engine's runner: its own model (engine_model.py: the handed model is never changed
        but for its CPU byte order), the KV pool and the attention backend the resolved config names."""
        model = model_for_engine(model, resolved.device, resolved.dtype, resolved.quantization)
        backend = make_backend(resolved.attention_backend, resolved.device, resolved.dtype)
        kv_cache = PagedKVCache.for_model(model, resolved.num_kv_blocks, config.block_size, backend)
        if resolved.num_swap_blocks:
            kv_cache.enable_swap(resolved.num_swap_blocks)
        spec = getattr(config, "speculative_config", None)
        draft = (load_draft_model(spec, resolved, model, backend, config.block_size)
                 if spec is not None and spec.method == "draft_model" else None)
        return cls(model, kv_cache, config, resolved.max_model_len, slot_mapping_fn, draft)

    def apply_block_ops(self, ops) -> None:
        """The block moves a step's plan carries (swap out, copy-on-write, swap in), before its forward."""
        self.kv_cache.apply(ops)
        if self.draft_model is not None:
            self.draft_model.apply_block_ops(ops)

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[object, int]]) -> "ForwardOutput":
        """scheduled: [(sequence, num_new_tokens)]. Returns the sequences that sample, their logits
        [S, V], the prompt logprobs this step computed and, for sequences that fed drafts,
        {seq_id: (sequence, logits [drafts + 1, V])} to verify them with."""
        if self.draft_model is not None:           # its pool follows every step; drafts for the drafting ones
            self.draft_model.follow_and_draft(scheduled, self.slot_mapping_fn)
        if self.run_decode is not None and is_pure_decode(scheduled):
            seqs = [s for s, _ in scheduled]
            if self.static_step.fits(seqs):
                return ForwardOutput(seqs, self.run_decode(seqs), [], {})
        if self.num_draft_layers and any(s.spec_token_ids for s, _ in scheduled):
            draft_in_place(self.model, self.kv_cache, [s for s, _ in scheduled if s.spec_token_ids],
                           self.num_draft_layers, self.slot_mapping_fn)
        device = self.kv_cache.device
        input_ids, rows, samplers, scored, drafted = [], [], [], [], []
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            scored += [(seq, start, len(input_ids), n)] if seq.params.prompt_logprobs is not None else []
            input_ids += seq.input_tokens(start, start + n)
            if seq.spec_token_ids:                    # the last token and each draft: k + 1 predictions
                drafted.append((seq, len(input_ids) - len(seq.spec_token_ids) - 1))
            elif start + n == len(seq):               # fed everything it has: predicts the next token
                rows.append(len(input_ids) - 1)
                samplers.append(seq)
        seqs = [s for s, _ in scheduled]
        step = PagedStep.build([s.block_table for s in seqs], [s.num_computed_tokens for s in seqs],
                               [n for _, n in scheduled], self.kv_cache.block_size, device,
                               self.slot_mapping_fn, self.block_tables.padded(seqs))
        self.kv_cache.set_step(step)
        if self.lora is not None:                     # each row's adapter slot (lora/manager.py)
            self.lora.set_step(scheduled)
        hidden = self.model(torch.tensor(input_ids, device=device), step.positions, self.kv_cache)
        prompt_logprobs = [p for p in (self.score_prompt(hidden, *s) for s in scored) if p is not None]
        drafts = {seq.seq_id: (seq, self.model.compute_logits(hidden[first:first + len(seq.spec_token_ids) + 1]))
                  for seq, first in drafted}
        if not rows:
            return ForwardOutput([], hidden.new_zeros(0, 0), prompt_logprobs, drafts)
        if len(rows) < len(input_ids):                # else every row samples (a decode step): no gather
            hidden = hidden[torch.tensor(rows, device=device)]
        return ForwardOutput(samplers, self.model.compute_logits(hidden), prompt_logprobs, drafts)

    def score_prompt(self, hidden, seq, start: int, offset: int, n: int) -> PromptLogprobs | None:
        """The logprobs of the prompt tokens that this chunk's positions start .. start+n-1
        predict (position p predicts token p+1; the prompt's last position predicts the
        first generated token, which is sampled, not scored)."""
        prompt = seq.prompt_token_ids
        count = min(start + n, len(prompt) - 1) - start
        if count <= 0:
            return None
        targets = prompt[start + 1:start + 1 + count]
        scores = score_prompt_tokens(self.model.compute_logits, hidden[offset:offset + count], targets,
                                     seq.params.prompt_logprobs)
        return PromptLogprobs(seq.seq_id, start + 1, targets, *scores)


def self_draft_layers(model, config) -> int | None:
    """How many of the model's layers draft (speculative_config method "self_draft"), else None."""
    spec = getattr(config, "speculative_config", None)
    if spec is None or spec.method != "self_draft":
        return None
    total = len(model.model.layers)
    layers = spec.num_draft_layers or max(1, total // 2)
    if layers >= total:
        raise ValueError(f"speculative_config.num_draft_layers={layers} must be fewer than the model's {total} layers")
    return layers


def is_pure_decode(scheduled) -> bool:
    """Every sequence feeds exactly its one newest token (so every one of them samples)."""
    return all(n == 1 and seq.num_computed_tokens + 1 == len(seq) for seq, n in scheduled)


def make_fast_decode(model, kv_cache: PagedKVCache, config, max_model_len: int):
    """(the StaticDecodeStep, run(seqs) -> logits) for the road the config asks for, or
    (None, None): decode stays eager."""
    graphs = kv_cache.device.type == "cuda" and not config.enforce_eager and capture_safe(kv_cache.backend)
    if not (config.compile or graphs) or getattr(config, "enable_lora", False):   # LoRA rows: eager (lora/)
        return None, None
    step = StaticDecodeStep(model, kv_cache, config.max_num_seqs, max_model_len)
    fast = step
    if config.compile:
        fast = CompiledDecodeStep(step)
    return step, (CUDAGraphDecode(step, fast.forward) if graphs else fast).run
