"""Lesson 08's launch side: the package's launch code launching the learner's Triton kernel
(`decode_with`, which the lesson plugs into the Triton backend), and the grader's collect half
(`course/collect.py`): `collect_decode(kernel, seed, **case)` launches the kernel on one case's
caches, drawn from `seed` (the judge's, while grading), and returns what came out as data: the
output, each split's partial (m, l, acc) handed to combine_splits, the kernel's parameter names,
or the error. It holds no reference and decides nothing: `lesson08.judge_paged_decode_kernel`
compares the data with the torch reference's decode on the same caches.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch

from .collected import error
from .harness import expect

HEAD_DIM = 16            # the smallest a GPU's tl.dot takes


@contextmanager
def _launching(kernel):
    """While inside, the package's launch code (`triton_decode.paged_decode`) launches
    `kernel` instead of its own; `partials` receives what each launch handed to
    combine_splits (the splits' (m, l, acc)), so a check can look at every split."""
    from ..attention import triton_decode
    own_kernel, own_combine = triton_decode.paged_decode_kernel, triton_decode.combine_splits
    partials = []

    def recording_combine(part_max, part_sum, part_acc):
        partials.append((part_max.clone(), part_sum.clone(), part_acc.clone()))
        return own_combine(part_max, part_sum, part_acc)

    triton_decode.paged_decode_kernel, triton_decode.combine_splits = kernel, recording_combine
    try:
        yield partials
    finally:
        triton_decode.paged_decode_kernel, triton_decode.combine_splits = own_kernel, own_combine


def decode_with(kernel):
    """`triton_decode.paged_decode` (same arguments, same result) launching `kernel`: how the
    lesson plugs your kernel into the Triton backend (`backend.decode_kernel`)."""
    from ..attention import triton_decode

    def paged_decode(*args, **kwargs):
        with _launching(kernel):
            return triton_decode.paged_decode(*args, **kwargs)

    paged_decode.__doc__ = triton_decode.paged_decode.__doc__
    return paged_decode


def device_for(kernel) -> str:
    """Where `kernel` runs: interpreted kernels on CPU tensors, compiled ones on the GPU."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError as e:
        raise AssertionError(f"Triton is not installed ({e}): `pip install triton` (it comes with the course's "
                             "test extra), restart the kernel and run the lesson from the top") from e
    if isinstance(kernel, InterpretedFunction):
        return "cpu"
    expect(isinstance(kernel, JITFunction),
           f"your kernel is a {type(kernel).__name__}, not a Triton kernel: put @triton.jit on the line "
           "above `def`")
    expect(torch.cuda.is_available(),
           "your kernel was compiled for a GPU, and there is none: on a CPU Triton runs kernels only under "
           "its interpreter, which it chooses when the @triton.jit function is defined. Set "
           "os.environ['TRITON_INTERPRET'] = '1' before defining it (the notebook's first cell does: "
           "restart the kernel and run the cells from the top)")
    return "cuda"


def is_the_stub(e: BaseException) -> bool:
    """Did the kernel fail on the exercise's `raise NotImplementedError`? The interpreter wraps it
    in an InterpreterError; Triton's compiler refuses a `raise` (an unsupported Raise node)."""
    while e is not None:
        if isinstance(e, NotImplementedError) or "NotImplementedError" in str(e) \
                or "unsupported AST node type: Raise" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def make_inputs(block_size: int, num_kv_heads: int, group: int, seq_lens: list[int], scattered: bool,
                score_scale: float, device: str, seed: int):
    """Caches of a pool with spare blocks, each sequence's blocks (scattered or in order),
    tables padded with 0 like the engine's, q for every query head (q x score_scale)."""
    gen = torch.Generator().manual_seed(seed)
    bs, hkv, heads = block_size, num_kv_heads, num_kv_heads * group
    needed = [-(-n // bs) for n in seq_lens]
    pool = sum(needed) + 3
    k_cache = torch.randn(pool, bs, hkv, HEAD_DIM, generator=gen)
    v_cache = torch.randn(pool, bs, hkv, HEAD_DIM, generator=gen)
    order = torch.randperm(pool, generator=gen) if scattered else torch.arange(pool)
    width, tables, used = max(needed), [], 0
    for n in needed:
        row = order[used:used + n].tolist()
        used += n
        tables.append(row + [0] * (width - n))          # 0: the padding of a shorter table
    q = torch.randn(len(seq_lens), heads, HEAD_DIM, generator=gen) * score_scale
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)
    return (q.to(device), k_cache.to(device), v_cache.to(device), as_long(tables), as_long(seq_lens))


def collect_decode(kernel, seed: int, block_size: int, num_kv_heads: int, group: int, seq_lens: list[int],
                   scattered: bool = True, score_scale: float = 1.0, num_splits: int = 1) -> dict:
    """`kernel` launched by the package's `paged_decode` on one case (the module docstring says
    what comes back): {"refused": error} when it cannot run here, else its "signature" and either
    "out" and "partials" or "launch" (the error) and "stub" (the exercise's own raise)."""
    from ..attention import triton_decode
    try:
        device = device_for(kernel)
        data = {"signature": list(inspect.signature(kernel.fn).parameters)}
    except Exception as e:
        return {"refused": error(e)}
    q, k_cache, v_cache, tables, lens = make_inputs(block_size, num_kv_heads, group, seq_lens, scattered,
                                                    score_scale, device, seed)
    with _launching(kernel) as partials:
        try:
            out = triton_decode.paged_decode(q, k_cache, v_cache, tables, lens, num_splits=num_splits)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            return {**data, "launch": error(e), "stub": is_the_stub(e)}
    return {**data, "out": out.float().cpu(), "partials": [[t.cpu() for t in part] for part in partials[:1]]}
