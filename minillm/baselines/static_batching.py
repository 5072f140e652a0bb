"""Static batching: a batch runs to its end before the next one starts.

Lesson 02, `generate_static_batch`: one contiguous cache row per prompt, reserved for the
whole run: prefill each prompt, then decode every unfinished row together until all have
ended. A row that finishes early keeps its slot (and its reserved memory) until the last
one is done: the waste that continuous batching (lesson 05) removes.

Lesson 05, `StaticBatchScheduler`: the same policy inside the paged engine, as the
baseline continuous batching is measured against.
"""
from __future__ import annotations

import torch

from ..engine.scheduler import Scheduler, SchedulerOutput
from ..kv.contiguous import ContiguousKVCache
from ..outputs import CompletionOutput
from ..sample.sampler import make_generator, sample
from ..sampling_params import SamplingParams
from ..text.stopping import StopChecker
from ..text.tokenizer import prompt_to_ids


@torch.inference_mode()
def generate_static_batch(model, tokenizer, prompts: list, params: SamplingParams | None = None,
                          max_len: int | None = None, cache_cls=ContiguousKVCache):
    """Static batching: one cache row per prompt, reserved for the whole run.
    Prefill each prompt, then decode all unfinished rows together until every one ends.
    Returns (outputs, cache) so a lesson can inspect the cache afterwards."""
    params = params or SamplingParams()
    if params.n != 1:
        raise NotImplementedError("n > 1 needs the paged engine (lesson 04)")
    prompt_ids = [prompt_to_ids(tokenizer, p) for p in prompts]
    max_len = max_len or max(len(p) for p in prompt_ids) + params.max_tokens
    cache = cache_cls.for_model(model, len(prompt_ids), max_len)
    eos = tokenizer.eos_token_ids if tokenizer is not None else model.config.eos_token_ids
    stoppers = [StopChecker(params, tokenizer, eos) for _ in prompt_ids]
    generators = [make_generator(params, model.device) for _ in prompt_ids]
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    finish: list[str | None] = [None] * len(prompt_ids)
    device = model.device

    def step(rows, new_tokens, starts):
        """One forward for `rows`, each adding len(new_tokens[i]) tokens; sample one token per row."""
        T = len(new_tokens[0])
        cache.set_step(rows, starts, T)
        ids = torch.tensor([t for toks in new_tokens for t in toks], device=device)
        positions = cache.positions.reshape(-1)
        hidden = model(ids, positions, cache)
        last = hidden.view(len(rows), T, -1)[:, -1]
        tokens = sample(model.compute_logits(last), [params] * len(rows), [generators[r] for r in rows])
        for r, tok in zip(rows, tokens.tolist()):
            outputs[r].append(tok)
            finish[r] = stoppers[r].check(outputs[r])

    for r, ids in enumerate(prompt_ids):                  # prefill, one prompt at a time
        step([r], [ids], [0])
    while True:                                           # decode every unfinished row together
        rows = [r for r in range(len(prompt_ids)) if finish[r] is None]
        if not rows:
            break
        step(rows, [[outputs[r][-1]] for r in rows],
             [len(prompt_ids[r]) + len(outputs[r]) - 1 for r in rows])
    results = [CompletionOutput(0, s.text, o, f) for s, o, f in zip(stoppers, outputs, finish)]
    return results, cache


def generate_with_cache(model, tokenizer, prompt, params: SamplingParams | None = None) -> CompletionOutput:
    """One prompt through the contiguous cache: a static batch of one."""
    outputs, _ = generate_static_batch(model, tokenizer, [prompt], params)
    return outputs[0]


class StaticBatchScheduler(Scheduler):
    """Lesson 05's baseline: `LLMEngine(..., scheduler_cls=StaticBatchScheduler)` admits a new
    batch only when the running one is done. While anything runs, a step feeds only the
    running sequences (preempting as the engine's scheduler does when memory runs out);
    once the batch is empty, the next one is admitted as `Scheduler` would. A sequence that
    finishes early leaves its seat empty until the whole batch is done: the waste that
    continuous batching (the engine's default) removes. It exists to be measured against."""

    def schedule(self) -> SchedulerOutput:
        if not self.running:
            return super().schedule()              # the last batch is done: admit the next one
        out = SchedulerOutput()
        self.running.sort(key=self.rank)
        self.keep_running(out, self.max_num_batched_tokens)
        return out
