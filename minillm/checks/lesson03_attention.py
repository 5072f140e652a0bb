"""Lesson 03's grader of paged attention: `check_paged_attention` (keys and values gathered
through each sequence's block table, a causal mask by position, prefill, chunk and decode rows in
one flat batch), against a naive recompute over each sequence's keys stored contiguously. When
yours differs, the grader recomputes the mistakes learners make (no mask, blocks read in pool
order, one key short, a query blind to its own key, a mask by row instead of by position) and
names the one yours matches.
Then yours runs the real engine as a registered attention backend, with chunked prefill so
steps mix prefill and decode rows, and must give the reference's greedy tokens.
"""
from __future__ import annotations

import torch

from .engine_runs import AMPLE_POOL, GREEDY, PROMPTS, compare_runs, drive, make_engine, reference_run
from .harness import Grader, expect, grader

H, HKV, D = 6, 2, 8                      # 3 query heads share each key/value head (lesson 00's GQA)

# (what, block_size, num_blocks, [(block table, cached tokens, new tokens)] per sequence)
CASES = [
    ("a 7-token prompt (prefill from position 0) in blocks [5, 2]", 4, 8, [([5, 2], 0, 7)]),
    ("one decode token at position 9, blocks [3, 7, 0]", 4, 8, [([3, 7, 0], 9, 1)]),
    ("a prompt chunk at positions 4..8 (4 tokens already cached), blocks [6, 1, 4]", 4, 8, [([6, 1, 4], 4, 5)]),
    ("one flat batch: A decodes at position 6, B prefills 5 tokens, C a chunk at positions 4..8", 4, 12,
     [([9, 2], 6, 1), ([0, 11], 0, 5), ([4, 7, 1], 4, 5)]),
    ("two decode rows of different lengths (positions 2 and 13)", 4, 8, [([7], 2, 1), ([1, 5, 0, 3], 13, 1)]),
    ("block_size 1: a 3-token prompt in blocks [2, 0, 1]", 1, 4, [([2, 0, 1], 0, 3)]),
    ("block_size 16: a decode at position 20, blocks [1, 3]", 16, 4, [([1, 3], 20, 1)]),
]

MISTAKES = {
    "no_mask": "every query sees all of its sequence's keys, later ones included: mask with "
               "causal_mask(positions, n), so a query at position p sees keys 0..p only",
    "pool_order": "you read blocks 0, 1, 2, ... of the pool instead of the sequence's own: gather "
                  "k_cache[block_tables[b][:num_blocks]], so logical block i comes from block_tables[b][i]",
    "one_short": "the sequence's last token misses its own key (one key short): seq_lens[b] already counts "
                 "this step's tokens, whose K/V the layer wrote before attending; read seq_lens[b] keys, "
                 "not seq_lens[b] - 1",
    "strict_mask": "each query misses its own key: a query at position p sees keys 0..p, itself included "
                   "(key position <= query position, as causal_mask does), not 0..p-1",
    "row_mask": "the mask counts a sequence's rows from 0 instead of using their positions: a decode row or a "
                "chunk that starts mid-sequence is at position p > 0 and sees keys 0..p (step.positions)",
}


def _case(block_size: int, num_blocks: int, seqs, seed: int):
    """(q, k_cache, v_cache, step, each sequence's contiguous keys and values); the cache's slots
    that no sequence wrote hold garbage, as a reused pool does."""
    from ..attention.paged import PagedStep
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, block_size, HKV, D, generator=gen) * 3
    v_cache = torch.randn(num_blocks, block_size, HKV, D, generator=gen) * 3
    contiguous = []
    for table, cached, new in seqs:
        n = cached + new
        keys, values = torch.randn(n, HKV, D, generator=gen), torch.randn(n, HKV, D, generator=gen)
        for p in range(n):
            k_cache[table[p // block_size], p % block_size] = keys[p]
            v_cache[table[p // block_size], p % block_size] = values[p]
        contiguous.append((keys, values))
    step = PagedStep.build([t for t, _, _ in seqs], [c for _, c, _ in seqs], [n for _, _, n in seqs], block_size)
    q = torch.randn(len(step.positions), H, D, generator=gen)
    return q, k_cache, v_cache, step, contiguous


def naive(q, step, contiguous, mistake: str | None = None, k_cache=None, v_cache=None) -> torch.Tensor:
    """Each query row against its sequence's contiguous keys 0..position, in float64; or the
    answer `mistake` (a key of MISTAKES) gives."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    block_size = None if k_cache is None else k_cache.shape[1]
    for b, (keys, values) in enumerate(contiguous):
        s, e = step.query_starts[b], step.query_starts[b + 1]
        n = len(keys)
        if mistake == "pool_order":
            keys = k_cache.flatten(0, 1)[:n]
            values = v_cache.flatten(0, 1)[:n]
        for row in range(s, e):
            p = int(step.positions[row])
            visible = {None: p + 1, "no_mask": n, "one_short": min(p + 1, n - 1), "strict_mask": p,
                       "row_mask": row - s + 1, "pool_order": p + 1}[mistake]
            if visible < 1:
                out[row] = float("nan")                       # no key to attend to: softmax of nothing
                continue
            k, v = keys[:visible].double(), values[:visible].double()
            for h in range(H):
                scores = (q[row, h].double() @ k[:, h // (H // HKV)].T) / D ** 0.5
                out[row, h] = scores.softmax(-1) @ v[:, h // (H // HKV)]
    return out


def _matches(out, expected) -> bool:
    defined = ~expected.isnan().flatten(1).any(1)          # a row with no key to see has no answer
    return torch.allclose(out.double()[defined], expected[defined], atol=1e-4, rtol=1e-4)


@grader
def check_paged_attention(fn) -> bool:
    """fn(q, k_cache, v_cache, step) -> out, like `attention.per_sequence.paged_attention`: q [N, H, D]
    holds one row per token of a step (a PagedStep: query_starts, seq_lens, block_tables, positions),
    the caches are [num_blocks, block_size, Hkv, D]; out [N, H, D] is each row's attention over its
    sequence's keys up to its position.

    Cases: a prefill, a decode, a chunk starting mid-sequence, all three in one flat batch, two
    decode rows of different lengths, block_size 1 and 16; tables scattered over the pool, block 0
    included, padded with 0; unused slots hold garbage. The inputs must come back unchanged. Then
    the real engine with your function as its attention backend, chunked prefill on, gives the
    reference's greedy tokens.
    """
    g = Grader("check_paged_attention", "your paged_attention")
    for i, (what, block_size, num_blocks, seqs) in enumerate(CASES):
        q, k_cache, v_cache, step, contiguous = _case(block_size, num_blocks, seqs, seed=i)
        saved = q.clone(), k_cache.clone(), v_cache.clone()
        with g.case(f"computing attention for {what}"):
            out = fn(q, k_cache, v_cache, step)
        expect(isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(q.shape),
               f"for {what}, your paged_attention returned "
               f"{list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}, expected a tensor "
               f"of q's shape {list(q.shape)}: one output row per query row")
        expect(out.dtype == q.dtype, f"for {what}, your paged_attention returned dtype {out.dtype}, expected "
                                     f"q's dtype {q.dtype}")
        expect(all(torch.equal(a, b) for a, b in zip(saved, (q, k_cache, v_cache))),
               f"for {what}, your paged_attention changed q or the caches: it only reads them")
        expected = naive(q, step, contiguous)
        if _matches(out, expected):
            continue
        for mistake, hint in MISTAKES.items():
            if _matches(out, naive(q, step, contiguous, mistake, k_cache, v_cache)):
                raise AssertionError(f"for {what}: {hint}")
        bad = (out.double() - expected).abs().amax(dim=(1, 2))
        row = int(bad.argmax())
        b = next(j for j in range(len(seqs)) if step.query_starts[j] <= row < step.query_starts[j + 1])
        raise AssertionError(
            f"for {what}: row {row} (sequence {b}, position {int(step.positions[row])}) differs from the naive "
            f"recompute by up to {float(bad[row]):.2g}. Sequence {b}'s rows are q[query_starts[{b}]:"
            f"query_starts[{b + 1}]]; they see its first seq_lens[{b}] = {int(step.seq_lens[b])} keys, gathered "
            f"from blocks block_tables[{b}] = {step.block_tables[b].tolist()} in that order, up to each row's "
            "position (lesson 02's masked_attention and causal_mask do the rest)")
    _run_engine(g, fn)
    return g.passed()


def _run_engine(g, fn) -> None:
    """Greedy generation with `fn` as the engine's attention backend, chunked prefill mixing rows."""
    from ..attention.paged import TorchPagedAttention
    from ..utils.registry import ATTENTION_BACKENDS

    class Yours(TorchPagedAttention):
        name = "check-paged-attention"

        def forward(self, q, k_cache, v_cache, step):
            return fn(q, k_cache, v_cache, step)

    ATTENTION_BACKENDS.register()(Yours)
    label = "attention_backend=yours, chunked prefill of 6 tokens a step"
    try:
        engine = make_engine(g, label, attention_backend=Yours.name, max_num_batched_tokens=6,
                             enable_prefix_caching=False, **AMPLE_POOL)
        ours = drive(g, engine, PROMPTS, GREEDY, label, "attention does not decide who runs: report this")
    finally:
        ATTENTION_BACKENDS.pop(Yours.name)
    compare_runs(PROMPTS, ours, reference_run(PROMPTS, GREEDY, **AMPLE_POOL), label,
                 "the unit cases pass, so look at what the engine adds: several sequences per step, and a "
                 "prompt split over steps (a chunk starts at position > 0)")
