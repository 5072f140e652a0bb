"""Lesson 08's grader, `check_paged_decode_kernel`: your Triton paged decode kernel against
the torch reference's decode attention.

Your kernel is launched by the package's own launch code (`triton_decode.paged_decode`:
the grid, the strides, the splits and their merge), exactly as the Triton backend launches
its kernel, on small caches whose blocks are scattered over the pool. On a CPU it runs under
Triton's interpreter (TRITON_INTERPRET=1, which must be set before the kernel is defined);
on a GPU it is compiled. Each case adds one thing a paged decode kernel must get right, in
this order, so the first case that fails names the likely mistake:

  one sequence in one block       load q, K, V; scores; softmax; the tile runs past the end
  several sequences, partial      each sequence its own row of the block table, its own length
  blocks scattered, block size 3  token j's block is block_tables[seq, j // block_size]
  block size 1                    offset j % block_size within the block
  GQA groups of 3                 query head h shares KV head h // GROUP
  long contexts, several tiles    the running max: rescale l and acc when it grows
  large scores                    exp of scores minus the running max, never raw
  splits of the context           each program covers only tokens start..end of its split

Every case uses float32 (the interpreter's half-precision dot is wrong) and seeded caches (fixed
seeds in a notebook; seeds drawn at grading time in the grading sandbox). Under the interpreter a
launch takes a fraction of a second, so the shapes are small.

The grader has two halves (`course/collect.py`): `lesson08_launch.collect_decode` launches the
kernel and returns its output and partials as data (in the grading sandbox, where the student's
kernel is); `judge_paged_decode_kernel` compares them with the torch reference's decode on the
same caches, here.
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import torch

from .collected import rebuilt
from .harness import Grader, expect, grader
from .lesson08_launch import collect_decode, decode_with, make_inputs  # noqa: F401 (decode_with: the lesson's)


@dataclass
class Case:
    what: str
    hint: str
    block_size: int
    num_kv_heads: int
    group: int
    seq_lens: list[int]
    scattered: bool = True          # blocks in random order over the pool (else 0, 1, 2, ...)
    score_scale: float = 1.0        # q is multiplied by this: large scores overflow a naive exp
    num_splits: int = 1


CASES = [
    Case("one sequence of 16 tokens in one block (block_size 16, one query head)",
         "start with the basics: load q for this program's query heads and the tile's K and V; "
         "scores = q . k * scale; the tile is BLOCK_N tokens long, longer than the sequence here, so "
         "tokens at or past `end` must not count (mask the loads, set their scores to -inf); update m, l "
         "and acc so that the given last lines' acc / l is softmax(scores) @ V",
         16, 1, 1, [16], scattered=False),
    Case("two sequences whose last blocks are partly filled (21 and 7 tokens, blocks of 16)",
         "each program reads its own sequence through its own row of the block table: token j is in block "
         "block_tables[seq, j // block_size], loaded from block_tables_ptr + seq * stride_tb + j // block_size; "
         "its q is at seq * stride_qb; and only its first seq_len tokens count: mask every token with "
         "`tokens < end` in the loads and set the scores of the others to -inf",
         16, 1, 1, [21, 7], scattered=False),
    Case("blocks scattered over the pool (block_size 3, two KV heads)",
         "token j of the sequence is in block block_tables[seq, j // block_size], at offset j % block_size "
         "(the blocks are not in order now: load each token's block id from the table): its K starts at "
         "k_cache_ptr + block * stride_kb + offset * stride_ko + kv_head * stride_kh. A "
         "tile of BLOCK_N tokens spans several blocks, so load one block id per token (a vector of ids)",
         3, 2, 1, [10, 5, 8]),
    Case("one token per block (block_size 1)",
         "with block_size 1 every token has its own block and offset 0: check the offset is "
         "`tokens % block_size` and the block index `tokens // block_size` (both, not one of them)",
         1, 1, 1, [6, 9]),
    Case("GQA: 3 query heads share each KV head (2 KV heads, 6 query heads)",
         "query head h reads KV head h // GROUP: the program of KV head `kv_head` serves query heads "
         "kv_head * GROUP + 0 .. GROUP - 1 (heads = kv_head * GROUP + g, with head_ok = g < GROUP masking "
         "the padding rows of BLOCK_G), and reads K and V at kv_head * stride_kh",
         3, 2, 3, [11, 4]),
    Case("long contexts: several tiles of BLOCK_N tokens per sequence (block_size 16, 150 and 200 tokens)",
         "the online softmax over several tiles: when a tile raises the running max m to m_new, rescale "
         "what you summed so far by exp(m - m_new): l = l * exp(m - m_new) + sum(p), "
         "acc = acc * exp(m - m_new)[:, None] + p @ v, with p = exp(s - m_new[:, None]); then m = m_new",
         16, 1, 3, [150, 200], score_scale=3.0),
    Case("large scores (q x 50: scores in the hundreds, exp overflows float32 past 88)",
         "never take exp of a raw score: subtract the running max first, p = exp(s - m_new[:, None]), "
         "with m_new = maximum(m, max of the tile's scores)",
         16, 1, 1, [40, 25], score_scale=50.0),
    Case("the context split over 3 programs (flash-decoding; 200, 40 and 130 tokens)",
         "a program with NUM_SPLITS > 1 covers only tokens start .. end of its split (loop "
         "`for tile in range(start, end, BLOCK_N)`, mask `tokens < end`); the given last lines write its "
         "partial (m, l, acc) and combine_splits merges them",
         16, 2, 3, [200, 40, 130], num_splits=3),
]


def _signature_problem(theirs) -> str | None:
    from ..attention.triton_decode import paged_decode_kernel
    ours = list(inspect.signature(paged_decode_kernel.fn).parameters)
    if theirs == ours:
        return None
    return (f"your kernel's parameters are ({', '.join(map(str, theirs or []))}); the launch code passes "
            f"({', '.join(ours)}): keep the signature of the exercise cell")


def _geometry(case: Case) -> dict:
    """What the collect half needs of a case to draw its caches and launch."""
    return {k: v for k, v in asdict(case).items() if k not in ("what", "hint")}


def _split_partials_expected(q, k_cache, v_cache, tables, seq_lens, group, split_tokens, num_splits):
    """Per (sequence, query head, split): the max score and the sum of exp(score - max) over
    the split's tokens only (-inf and 0 for an empty split)."""
    B, H, D = q.shape
    m = torch.full((B, H, num_splits), float("-inf"))
    l = torch.zeros(B, H, num_splits)
    bs = k_cache.shape[1]
    for b in range(B):
        n = int(seq_lens[b])
        tokens = torch.arange(n)
        blocks = tables[b].cpu()[tokens // bs]
        keys = k_cache.cpu()[blocks, tokens % bs]                       # [n, Hkv, D]
        scores = torch.einsum("hd,nhd->hn", q[b].cpu(), keys.repeat_interleave(group, dim=1)) * D ** -0.5
        for s in range(num_splits):
            part = scores[:, s * split_tokens:min((s + 1) * split_tokens, n)]
            if part.shape[1]:
                m[b, :, s] = part.max(1).values
                l[b, :, s] = torch.exp(part - m[b, :, s, None]).sum(1)
    return m, l


def judge_paged_decode_kernel(collect, seed: int = 0) -> bool:
    """The judge half (`course/collect.py`): collect(seed=..., **case) is what the learner's
    kernel gave on a case (`lesson08_launch.collect_decode`, in the grading sandbox or here),
    compared here with the torch reference's decode on the same caches."""
    from triton import cdiv

    from ..attention import triton_decode
    from ..attention.paged import TorchPagedAttention

    g = Grader("check_paged_decode_kernel", "your kernel")
    for i, case in enumerate(CASES):
        data = collect(seed=seed + i, **_geometry(case))
        if "refused" in data:
            raise rebuilt(data["refused"])
        if i == 0:
            problem = _signature_problem(data.get("signature"))
            expect(problem is None, problem)
        q, k_cache, v_cache, tables, seq_lens = make_inputs(case.block_size, case.num_kv_heads, case.group,
                                                            case.seq_lens, case.scattered, case.score_scale,
                                                            "cpu", seed + i)
        with g.case(f"launching it on: {case.what}"):
            if "launch" in data:
                if data.get("stub"):
                    raise NotImplementedError from rebuilt(data["launch"])
                raise rebuilt(data["launch"])
        expected = TorchPagedAttention().decode(q, k_cache, v_cache, tables, seq_lens - 1).float()
        out = data.get("out")
        expect(isinstance(out, torch.Tensor) and out.shape == expected.shape,
               f"the launch on {case.what} gave {getattr(out, 'shape', type(out).__name__)}, expected a tensor of "
               f"shape {list(expected.shape)}")
        expect(torch.isfinite(out).all(),
               f"your kernel's output has inf or nan on: {case.what}.\n    Hint: {case.hint}")
        error = (out - expected).abs().max().item()
        if error > 1e-4:
            b, h = divmod(int((out - expected).abs().amax(2).argmax()), out.shape[1])
            raise AssertionError(f"wrong output on: {case.what}.\n    sequence {b} (length {case.seq_lens[b]}), "
                                 f"query head {h}: max error {error:.3g} against the torch reference's "
                                 f"decode.\n    Hint: {case.hint}")
        if case.num_splits > 1:
            part_max, part_sum, _ = data["partials"][0]
            max_tokens = tables.shape[1] * case.block_size
            split_tokens = cdiv(cdiv(max_tokens, case.num_splits), triton_decode.BLOCK_N) * triton_decode.BLOCK_N
            m, l = _split_partials_expected(q, k_cache, v_cache, tables, seq_lens, case.group, split_tokens,
                                            case.num_splits)
            l_seen = part_sum * torch.exp(part_max - m).nan_to_num(1.0)   # the sums on a common max
            expect(torch.equal(part_max.isinf(), m.isinf()) and torch.allclose(l_seen, l, rtol=1e-4, atol=1e-4),
                   f"right output, but not by splitting the context: on {case.what}, each of the "
                   f"{case.num_splits} programs of a sequence should cover only its {split_tokens} tokens "
                   "(an empty split: m = -inf, l = 0). With every program walking the whole context the "
                   f"merge still gives the right answer, with {case.num_splits}x the work.\n    Hint: {case.hint}")
    return g.passed()


@grader
def check_paged_decode_kernel(kernel) -> bool:
    """`kernel`: a @triton.jit function with the signature of
    `minillm.attention.triton_decode.paged_decode_kernel`. Launched through the package's
    `paged_decode` on the cases of this module's CASES (block sizes 1, 3 and 16, GQA groups 1
    and 3, contexts of several tiles, large scores, 3 splits), each compared with the torch
    reference's decode (float32, atol 1e-4); for the split case each split's partial
    (running max, sum) is also compared with the same quantities over that split's tokens."""
    return judge_paged_decode_kernel(lambda **inputs: collect_decode(kernel, **inputs))
