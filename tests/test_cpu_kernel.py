"""The C paged-attention kernel (attention/paged_attention.c) against the torch reference.

Random block tables (blocks scattered in the pool, never in order), block sizes 1 to 16,
GQA ratios 1, 3 and 8, lengths from one key to several blocks, and mixed steps where
decode rows and prefill chunks share a batch. Then the fallback: with no C compiler
the engine says so and runs the reference.
"""
import os
import shutil

import pytest
import torch

import minillm.attention.cpu_paged as cpu_paged
from minillm.attention.cpu_paged import CPUPagedAttention, kernel_available
from minillm.attention.paged import PagedStep, TorchPagedAttention
from minillm.config import EngineConfig

from conftest import run_without_a_compiler


def test_kernel_builds_where_a_c_compiler_exists():
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler on this machine: the engine uses the torch reference")
    assert kernel_available(), cpu_paged.load_error


needs_kernel = pytest.mark.skipif(not kernel_available(), reason=f"kernel not built: {cpu_paged.load_error}")


def random_step(gen, seq_lens_before, num_new, block_size, num_blocks):
    """Block tables drawn at random from the pool, for sequences that had `seq_lens_before`
    tokens cached and feed `num_new` more."""
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for before, n in zip(seq_lens_before, num_new):
        need = -(-(before + n) // block_size)
        tables.append([pool.pop() for _ in range(need)])
    return PagedStep.build(tables, seq_lens_before, num_new, block_size)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 16), (9, 3, 64), (8, 1, 32)])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_decode_kernel_matches_reference(heads, kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(block_size * 100 + heads)
    num_blocks = 400 // block_size + 64
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    before = [0, 1, block_size - 1, block_size, 37, 150]   # a lone first token, block edges, many blocks
    step = random_step(gen, before, [1] * len(before), block_size, num_blocks)
    q = torch.randn(len(before), heads, head_dim, generator=gen)
    ours = CPUPagedAttention().forward(q, k, v, step)
    ref = TorchPagedAttention().forward(q, k, v, step)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert not torch.equal(ours[0], ours[-1])              # not one row copied everywhere


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 2, 32, 3)])
def test_bfloat16_cache_matches_the_float32_sums_of_its_values(heads, kv_heads, head_dim, block_size):
    """A bfloat16 cache is widened as it is read and summed in float32: the same as the float32
    kernel on the widened cache, rounded once at the end (and near the bfloat16 reference)."""
    gen = torch.Generator().manual_seed(head_dim + block_size)
    num_blocks = 300 // block_size + 32
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    before = [0, block_size - 1, block_size, 37, 150]
    step = random_step(gen, before, [1] * len(before), block_size, num_blocks)
    q = torch.randn(len(before), heads, head_dim, generator=gen).bfloat16()
    ours = CPUPagedAttention().forward(q, k, v, step)
    assert ours.dtype == torch.bfloat16
    widened = CPUPagedAttention().forward(q.float(), k.float(), v.float(), step)
    assert torch.equal(ours, widened.bfloat16())
    ref = TorchPagedAttention().forward(q, k, v, step)
    torch.testing.assert_close(ours.float(), ref.float(), rtol=2e-2, atol=2e-2)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_its_batch(dtype):
    """The same query over the same blocks gives the same bits alone and among others (the work
    is split by (query, KV head), never by the batch)."""
    gen = torch.Generator().manual_seed(5)
    block_size, num_blocks, heads, kv_heads, d = 16, 96, 9, 3, 64
    k = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    before = [130, 5, 64, 199, 17, 300]
    step = random_step(gen, before, [1] * len(before), block_size, num_blocks)
    q = torch.randn(len(before), heads, d, generator=gen).to(dtype)
    together = CPUPagedAttention().forward(q, k, v, step)
    for b, table in enumerate(step.block_tables.tolist()):
        alone = PagedStep.build([table[:-(-(before[b] + 1) // block_size)]], [before[b]], [1], block_size)
        assert torch.equal(CPUPagedAttention().forward(q[b:b + 1], k, v, alone), together[b:b + 1]), b


@needs_kernel
def test_mixed_step_decode_rows_and_prefill_chunks():
    """Decode rows go through the kernel and prefill chunks through the reference, in one
    step; every row must land where the reference puts it."""
    gen = torch.Generator().manual_seed(7)
    block_size, num_blocks, heads, kv_heads, d = 4, 128, 6, 2, 16
    k = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen)
    v = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen)
    before, new = [9, 0, 30, 5, 12], [1, 7, 1, 3, 1]
    step = random_step(gen, before, new, block_size, num_blocks)
    q = torch.randn(sum(new), heads, d, generator=gen)
    torch.testing.assert_close(CPUPagedAttention().forward(q, k, v, step),
                               TorchPagedAttention().forward(q, k, v, step), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_cache_the_kernel_cannot_read_goes_the_reference_way():
    """A non-contiguous cache (a learner's view, say) must not be read as raw memory."""
    gen = torch.Generator().manual_seed(11)
    k = torch.randn(32, 4, 2, 8, 2, generator=gen)[..., 0]        # every other float: not contiguous
    v = torch.randn(32, 4, 2, 8, 2, generator=gen)[..., 0]
    step = random_step(gen, [5, 9], [1, 1], 4, 32)
    q = torch.randn(2, 4, 8, generator=gen)
    torch.testing.assert_close(CPUPagedAttention().forward(q, k, v, step),
                               TorchPagedAttention().forward(q, k, v, step), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_kernel_reads_only_its_own_blocks():
    """Poison every block no table names: a kernel that strays outside its table (or past
    its length in the last block) returns NaN."""
    gen = torch.Generator().manual_seed(3)
    block_size, num_blocks, heads, d = 16, 64, 3, 8
    before = [20, 40]
    step = random_step(gen, before, [1, 1], block_size, num_blocks)
    k = torch.full((num_blocks, block_size, 1, d), float("nan"))
    v = torch.full((num_blocks, block_size, 1, d), float("nan"))
    for b, table in enumerate(step.block_tables.tolist()):
        for p in range(before[b] + 1):
            blk = table[p // block_size]
            k[blk, p % block_size] = torch.randn(1, d, generator=gen)
            v[blk, p % block_size] = torch.randn(1, d, generator=gen)
    q = torch.randn(2, heads, d, generator=gen)
    out = CPUPagedAttention().forward(q, k, v, step)
    assert torch.isfinite(out).all()
    k_ref, v_ref = torch.nan_to_num(k, nan=0.0), torch.nan_to_num(v, nan=0.0)
    torch.testing.assert_close(out, TorchPagedAttention().forward(q, k_ref, v_ref, step), rtol=1e-5, atol=1e-5)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="flash")


def test_without_a_compiler_the_engine_falls_back_to_torch(tmp_path):
    """A machine with no C compiler (CC points at `false`): "auto" runs the reference and
    asking for the kernel by name is a clear error."""
    script = (
        "from minillm.engine.engine import LLMEngine\n"
        "from minillm.models import load_model\n"
        "model, tok = load_model('tiny-llama')\n"
        "print(LLMEngine(model, tok, num_kv_blocks=32).stats()['attention_backend'])\n"
        "try:\n"
        "    LLMEngine(model, tok, num_kv_blocks=32, attention_backend='cpu-kernel')\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n")
    lines = run_without_a_compiler(script, tmp_path)
    assert lines[0] == "torch"
    assert lines[1].startswith("refused:") and "the CPU paged-attention kernel could not be built" in lines[1]
