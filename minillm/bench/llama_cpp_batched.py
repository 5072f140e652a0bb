"""llama.cpp at its best on a batched workload: many sequences in one `llama_decode`.

llama-cpp-python's high-level API (`Llama.generate`) decodes one sequence, so a workload run
through it is one request at a time. llama.cpp itself batches: a `llama_batch` holds tokens
of many sequences, each tagged with its sequence id, and one `llama_decode` runs them all
through the weights once (what `llama-batched-bench` and `examples/batched` do). This module
drives that through llama-cpp-python's low-level ctypes API, so that minillm's batched
numbers stand beside llama.cpp's batched numbers, not beside its batch-1 loop.

How it schedules (continuous batching, kept simple):
  slots        one llama.cpp sequence id per running request, up to `max_seqs` at once; a
               finished request's slot is cleared (`llama_memory_seq_rm`) and refilled.
  each step    one token for every request that is generating, plus prompt chunks of the
               requests still prefilling, at most `n_batch` tokens (chunked prefill, as
               minillm's engine); logits only for a request's newest token; greedy argmax.
  KV streams   each sequence gets its own KV stream (`kv_unified = false`, llama.cpp's
               default), so a token attends to its own sequence's cells only; a unified
               buffer would make every token score every cell of every sequence. llama.cpp
               packs streams into one micro-batch only while their ids run consecutively,
               so once no request is waiting, the highest slot moves into a hole
               (`llama_memory_seq_cp` of its stream, then `seq_rm`): the running slots stay
               0..k and a step stays one pass, not one pass per gap.
llama-cpp-python is optional (not a minillm dependency): the caller imports it and passes it in.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

N_BATCH = 2048           # tokens per llama_decode call (llama.cpp's default, minillm's chunk budget)
N_UBATCH = 512           # tokens per pass through the weights (llama.cpp's default)
CTX_PAD = 256            # llama.cpp rounds each sequence's context up to a multiple of this
_silence = None          # the log callback that keeps llama.cpp quiet (kept alive here)


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    fed: int = 0                                    # prompt tokens already in the KV cache
    output: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


class Slots:
    """The scheduler, without llama.cpp: which request holds which sequence id, what each
    step feeds (slot, tokens, first position, wants logits), and the moves that keep the
    running slots consecutive. Pure Python, so it is tested without llama_cpp."""

    def __init__(self, workload, max_seqs: int, n_batch: int = N_BATCH):
        self.requests = [Request(list(p), n) for p, n in workload]
        self.waiting = deque(range(len(self.requests)))
        self.slots: list[int | None] = [None] * max_seqs     # slot -> request index
        self.n_batch = n_batch

    def admit(self) -> None:
        for s in range(len(self.slots)):
            while self.slots[s] is None and self.waiting:
                i = self.waiting.popleft()
                self.slots[s] = None if self.requests[i].done else i      # nothing asked: nothing to run

    def running(self) -> bool:
        return any(r is not None for r in self.slots)

    def plan(self) -> list[tuple[int, list[int], int, bool]]:
        """This step's entries in slot order: every generating request's last token first
        (one each), then prompt chunks from what the batch has left."""
        budget, chunks = self.n_batch, {}
        for s, i in enumerate(self.slots):
            if i is not None and self.requests[i].fed == len(self.requests[i].prompt):
                r = self.requests[i]
                chunks[s] = ([r.output[-1]], len(r.prompt) + len(r.output) - 1, True)
                budget -= 1
        for s, i in enumerate(self.slots):
            r = self.requests[i] if i is not None else None
            if r is not None and r.fed < len(r.prompt) and budget > 0:
                take = min(budget, len(r.prompt) - r.fed)
                chunks[s] = (r.prompt[r.fed:r.fed + take], r.fed, r.fed + take == len(r.prompt))
                budget -= take
        return [(s, *chunks[s]) for s in sorted(chunks)]

    def record(self, plan, sampled: list[int]) -> list[int]:
        """Take the step's argmax tokens (one per entry that wanted logits, in plan order);
        returns the slots whose request finished (now free)."""
        sampled, freed = iter(sampled), []
        for s, tokens, _, logits in plan:
            r = self.requests[self.slots[s]]
            if r.fed < len(r.prompt):
                r.fed += len(tokens)
            if logits:
                r.output.append(next(sampled))
            if r.done:
                self.slots[s] = None
                freed.append(s)
        return freed

    def compact(self) -> list[tuple[int, int]]:
        """(from, to) moves of the highest running slot into the lowest hole, once nothing waits."""
        moves = []
        while not self.waiting:
            holes = [s for s, i in enumerate(self.slots) if i is None]
            top = max((s for s, i in enumerate(self.slots) if i is not None), default=-1)
            if not holes or holes[0] > top:
                break
            self.slots[holes[0]], self.slots[top] = self.slots[top], None
            moves.append((top, holes[0]))
        return moves


class Context:
    """A llama.cpp model, context and batch, through the ctypes bindings; `close()` frees them."""

    def __init__(self, llama_cpp, path, n_seqs: int, n_ctx_seq: int, threads: int,
                 n_batch: int = N_BATCH, n_ubatch: int = N_UBATCH, verbose: bool = False):
        global _silence
        self.lib = llama_cpp
        if not verbose:
            _silence = _silence or llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(_silence, None)
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max, params.kv_unified = n_seqs, False
        params.n_ctx = n_seqs * -(-n_ctx_seq // CTX_PAD) * CTX_PAD
        params.n_batch, params.n_ubatch = n_batch, min(n_ubatch, n_batch)
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise RuntimeError("llama.cpp could not create the context (n_ctx too large?)")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.batch, self.n_batch = llama_cpp.llama_batch_init(n_batch, 0, 1), n_batch

    def decode(self, plan) -> list[int]:
        """One llama_decode of the plan's (sequence id, tokens, first position, logits of the
        last token?) entries; returns the argmax token of each entry that asked for logits."""
        import numpy as np                              # a dependency of llama-cpp-python
        if sum(len(tokens) for _, tokens, _, _ in plan) > self.n_batch:
            raise ValueError(f"more than n_batch = {self.n_batch} tokens in one decode")
        b, n = self.batch, 0
        for seq, tokens, pos, logits in plan:
            for j, token in enumerate(tokens):
                b.token[n], b.pos[n], b.n_seq_id[n] = token, pos + j, 1
                b.seq_id[n][0] = seq
                b.logits[n] = logits and j == len(tokens) - 1
                n += 1
        b.n_tokens = n
        rc = self.lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        rows = sum(1 for entry in plan if entry[3])
        if not rows:
            return []
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(rows, self.n_vocab))
        return logits.argmax(axis=1).tolist()          # rows in batch order (llama.h)

    def clear(self, seq: int = -1) -> None:
        """Forget a sequence's cells (every sequence's with -1)."""
        if seq < 0:
            self.lib.llama_memory_clear(self.memory, False)
        else:
            self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def move(self, src: int, dst: int) -> None:
        """Sequence src's cells become dst's (a stream copy, done at the next decode)."""
        self.lib.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
        self.lib.llama_memory_seq_rm(self.memory, src, -1, -1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def drive(slots: Slots, ctx) -> None:
    """Run every request to its end: `ctx` decodes a plan, clears a slot, moves one into another
    (a `Context`, or a fake in the tests)."""
    slots.admit()
    while slots.running():
        plan = slots.plan()
        for s in slots.record(plan, ctx.decode(plan)):
            ctx.clear(s)
        slots.admit()
        for src, dst in slots.compact():
            ctx.move(src, dst)


def run_workload(llama_cpp, path, workload, max_seqs: int | None = None, threads: int | None = None,
                 n_batch: int = N_BATCH) -> dict:
    """Greedy, EOS ignored: every request produces exactly its output length. Returns output
    tok/s (prefill included, as minillm's throughput counts it), seconds, the tokens made
    (per request, in workload order) and the sequences run at once."""
    import torch
    seqs = max(1, min(max_seqs or len(workload), len(workload), 256))   # LLAMA_MAX_SEQ
    n_batch = max(n_batch, seqs)                       # room for one token of every running sequence
    ctx = Context(llama_cpp, path, seqs, max(len(p) + n for p, n in workload),
                  threads or torch.get_num_threads(), n_batch=n_batch)
    try:
        first = list(workload[0][0][:min(16, n_batch - seqs + 1)])      # warm up (threads, buffers): a prompt and
        ctx.decode([(0, first, 0, True)] + [(s, first[:1], 0, True) for s in range(1, seqs)])   # every stream
        ctx.clear()
        slots = Slots(workload, seqs, n_batch)
        start = time.perf_counter()
        drive(slots, ctx)
        seconds = time.perf_counter() - start
    finally:
        ctx.close()
    tokens = [r.output for r in slots.requests]
    made = sum(map(len, tokens))
    assert made == sum(n for _, n in workload), "llama.cpp produced the wrong number of tokens"
    return {"seconds": seconds, "output_tokens": made, "tok_per_s": made / seconds, "max_seqs": seqs,
            "tokens": tokens}


def prefill(llama_cpp, path, prompts: list[list[int]], threads: int | None = None) -> dict:
    """Time to first token of each prompt alone (one llama_decode of the whole prompt, then
    the argmax): the first prompt warms up, the fastest of the rest counts."""
    import torch
    longest = max(map(len, prompts))
    n_batch = max(N_UBATCH, longest)                   # the whole prompt in one pass
    ctx = Context(llama_cpp, path, 1, longest + 1, threads or torch.get_num_threads(),
                  n_batch=n_batch, n_ubatch=n_batch)
    try:
        times, first = [], []
        for prompt in prompts:
            ctx.clear()
            start = time.perf_counter()
            first += ctx.decode([(0, list(prompt), 0, True)])
            times.append(time.perf_counter() - start)
    finally:
        ctx.close()
    best = min(range(1, len(prompts)) if len(prompts) > 1 else [0], key=lambda i: times[i])
    return {"ttft_s": times[best], "tok_per_s": len(prompts[best]) / times[best], "first_tokens": first}
