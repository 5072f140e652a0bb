"""The Triton backend (lesson 08) against the torch reference: each kernel, then the engine.

On a CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set below before
any kernel is defined: triton reads it when a @triton.jit function is created, and
minillm imports its kernel modules only when a Triton backend is built). The interpreter
is slow (tens of ms per program), so the shapes are small. On a CUDA machine the same
tests run the compiled kernels on the GPU. float32 throughout, float16 once (the
interpreter's float16 dot is right; its bfloat16 dot is not, so bfloat16 is not tested).
"""
import os
import subprocess
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"       # before the kernels' modules are imported
triton = pytest.importorskip("triton")

from minillm.attention import ATTENTION_BACKENDS, backend_names, make_backend  # noqa: E402
from minillm.attention.paged import PagedStep, TorchPagedAttention, write_kv  # noqa: E402
from minillm.attention.triton_backend import (TritonPagedAttention, interpreter_ready,  # noqa: E402
                                              kernels_interpreted)
from minillm.engine.engine import LLMEngine  # noqa: E402
from minillm.models import load_model  # noqa: E402
from minillm.sampling_params import SamplingParams  # noqa: E402

from minillm.attention.triton_decode import num_splits_for, paged_decode  # noqa: E402

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# False when another module imported triton before TRITON_INTERPRET was set: then the kernels
# cannot run in this process, and test_the_module_in_a_fresh_python runs this file in a new one
RUNS_HERE = ON_GPU or interpreter_ready()


@pytest.fixture(autouse=True)
def interpreter_in_this_process(request):
    if not RUNS_HERE and request.node.originalname != "test_the_module_in_a_fresh_python":
        pytest.skip("triton was imported before TRITON_INTERPRET=1: run by test_the_module_in_a_fresh_python")


@pytest.mark.skipif(RUNS_HERE, reason="the tests run in this process")
def test_the_module_in_a_fresh_python():
    root = os.path.dirname(os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", __file__],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]

# (query heads, kv heads, head dim): GQA groups 1 and 3, tiny-llama's 2 and tiny-qwen3's 4
SHAPES = {"g1": (2, 2, 16), "g3": (3, 1, 32), "tiny-llama": (4, 2, 16), "tiny-qwen3": (4, 1, 32)}


def random_pool(block_size, num_kv_heads, head_dim, num_blocks=None, dtype=torch.float32, seed=0):
    """Random K/V caches (room for 200 tokens unless told) and the generator for the rest."""
    num_blocks = num_blocks or 200 // block_size + 20
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    return k.to(DEVICE, dtype), v.to(DEVICE, dtype), g


def scattered_tables(lengths, block_size, num_blocks, g):
    """Block tables of sequences of these lengths, on blocks in random order (not adjacent)."""
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables = []
    for n in lengths:
        need = -(-n // block_size)
        tables.append(free[:need])
        free = free[need:]
    return tables


def mixed_step(block_size, g, num_blocks, starts=(0, 7, 30, 5), new=(20, 1, 40, 1)):
    """A step with two prompt chunks (one from scratch, one after 30 cached tokens) and two decode rows."""
    tables = scattered_tables([s + n for s, n in zip(starts, new)], block_size, num_blocks, g)
    return PagedStep.build(tables, list(starts), list(new), block_size, DEVICE)


def test_kernels_run_where_expected():
    assert TritonPagedAttention.name in ATTENTION_BACKENDS and "triton" in backend_names()
    TritonPagedAttention()                      # imports the kernels' modules
    assert kernels_interpreted() is (not ON_GPU)


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_write_matches_write_kv(block_size, shape):
    _, hkv, d = SHAPES[shape]
    k_cache, v_cache, g = random_pool(block_size, hkv, d)
    step = mixed_step(block_size, g, k_cache.shape[0])
    n = len(step.slot_mapping)
    k, v = (torch.randn(n, hkv, d, generator=g).to(DEVICE) for _ in range(2))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv(want_k, want_v, k, v, step.slot_mapping)
    TritonPagedAttention().write(k_cache, v_cache, k, v, step.slot_mapping)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("group", ["g1", "g3"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_decode_matches_reference(block_size, group):
    h, hkv, d = SHAPES[group]
    k_cache, v_cache, g = random_pool(block_size, hkv, d)
    lengths = [1, 5, 17, 140]
    tables = scattered_tables(lengths, block_size, k_cache.shape[0], g)
    step = PagedStep.build(tables, [n - 1 for n in lengths], [1] * 4, block_size, DEVICE)
    q = torch.randn(4, h, d, generator=g).to(DEVICE)
    want = TorchPagedAttention().forward(q, k_cache, v_cache, step)
    torch.testing.assert_close(TritonPagedAttention().forward(q, k_cache, v_cache, step), want,
                               rtol=1e-5, atol=1e-5)
    # three splits of 64 tokens: the 140-token row uses all three, the short ones leave two empty
    torch.testing.assert_close(paged_decode(q, k_cache, v_cache, step.block_tables, step.seq_lens, num_splits=3),
                               want, rtol=1e-5, atol=1e-5)


def test_long_context_takes_several_splits_by_itself():
    h, hkv, d = SHAPES["g3"]
    block_size, length = 16, 700
    k_cache, v_cache, g = random_pool(block_size, hkv, d, num_blocks=60)
    tables = scattered_tables([length, 40], block_size, 60, g)
    step = PagedStep.build(tables, [length - 1, 39], [1, 1], block_size, DEVICE)
    assert num_splits_for(2, hkv, step.block_tables.shape[1] * block_size) == 3   # from shapes alone
    q = torch.randn(2, h, d, generator=g).to(DEVICE)
    want = TorchPagedAttention().forward(q, k_cache, v_cache, step)
    torch.testing.assert_close(TritonPagedAttention().forward(q, k_cache, v_cache, step), want,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_decode(q, k_cache, v_cache, step.block_tables, step.seq_lens, num_splits=16),
                               want, rtol=1e-5, atol=1e-5)    # 11 splits run 64 tokens, 5 are empty


@pytest.mark.parametrize("group", ["g1", "g3"])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_mixed_prefill_and_decode_step_matches_reference(block_size, group):
    h, hkv, d = SHAPES[group]
    k_cache, v_cache, g = random_pool(block_size, hkv, d)
    step = mixed_step(block_size, g, k_cache.shape[0])
    q = torch.randn(len(step.positions), h, d, generator=g).to(DEVICE)
    want = TorchPagedAttention().forward(q, k_cache, v_cache, step)
    torch.testing.assert_close(TritonPagedAttention().forward(q, k_cache, v_cache, step), want,
                               rtol=1e-5, atol=1e-5)


def test_float16_mixed_and_decode_steps():
    h, hkv, d = SHAPES["tiny-llama"]
    k_cache, v_cache, g = random_pool(16, hkv, d, num_blocks=80, dtype=torch.float16)
    for step in (mixed_step(16, g, 80), mixed_step(16, g, 80, starts=(3, 60, 9, 30), new=(1, 1, 1, 1))):
        q = torch.randn(len(step.positions), h, d, generator=g).to(DEVICE, torch.float16)
        want = TorchPagedAttention().forward(q.float(), k_cache.float(), v_cache.float(), step)
        got = TritonPagedAttention().forward(q, k_cache, v_cache, step)
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), want, rtol=0, atol=3e-3)   # half precision's error


@pytest.mark.skipif(ON_GPU, reason="checks the CPU-side errors")
def test_backend_errors_name_the_fix():
    with pytest.raises(RuntimeError, match="float32 or float16"):
        make_backend("triton", torch.device("cpu"), torch.bfloat16)
    assert make_backend("auto", torch.device("cpu"), torch.float32).name != "triton"
    # a fresh Python: without triton at all (minillm still imports), then without TRITON_INTERPRET
    script = """
import sys, torch
sys.modules["triton"] = None
import minillm
from minillm.attention import auto_backend, make_backend
for step in ("no triton", "no interpreter"):
    try:
        make_backend("triton", torch.device("cpu"), torch.float32)
    except RuntimeError as e:
        print(e)
    print(make_backend("auto", torch.device("cpu"), torch.float32).name,
          auto_backend(torch.device("cuda"), torch.bfloat16))
    del sys.modules["triton"]
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    no_triton, auto1, no_interpreter, auto2 = out.stdout.strip().splitlines()
    assert "pip install triton" in no_triton
    assert "TRITON_INTERPRET=1" in no_interpreter
    cpu_pick = auto1.split()[0]
    assert cpu_pick in ("cpu-kernel", "torch")
    assert auto1 == f"{cpu_pick} torch" and auto2 == f"{cpu_pick} triton"     # on CUDA: Triton when it imports


COMPILE_FOR_A_T4 = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minillm.attention import triton_decode, triton_prefill, triton_write

def compile_for_t4(kernel, constants):
    pointers = {"block_tables_ptr": "*i64", "seq_lens_ptr": "*i64", "query_start_ptr": "*i64", "slots_ptr": "*i64"}
    def kind(name):
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return pointers.get(name, "*fp32" if name.startswith("part_") else "*fp16")
        return "fp32" if name == "scale" else "i32"
    source = ASTSource(kernel, {name: kind(name) for name in kernel.arg_names}, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 75, 32)).metadata.shared

# the embedded model's attention: 9 query heads, 3 KV heads, head_dim 64; float16 (a T4 has no bfloat16)
G, D, half = 3, 64, torch.float16
print(compile_for_t4(triton_decode.paged_decode_kernel, dict(
    GROUP=G, HEAD_DIM=D, NUM_SPLITS=4, BLOCK_G=16, BLOCK_N=triton_decode.tile_tokens(half), BLOCK_D=D,
    PRECISION=triton_decode.dot_precision(half))))
rows = triton_prefill.tile_rows(half)
print(compile_for_t4(triton_prefill.paged_prefill_kernel, dict(
    GROUP=G, HEAD_DIM=D, BLOCK_Q=rows // G, BLOCK_M=rows, BLOCK_N=triton_prefill.BLOCK_N, BLOCK_D=D,
    PRECISION=triton_decode.dot_precision(half))))
print(compile_for_t4(triton_write.write_kv_kernel, dict(ROW=3 * D, BLOCK_T=triton_write.BLOCK_T, BLOCK_ROW=256)))
"""


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels themselves")
def test_kernels_compile_for_a_real_gpu_without_one():
    """The interpreter does not check what only the GPU compiler does (tl.dot's shapes and
    types, registers, shared memory). Triton's wheel carries the CUDA compiler (ptxas): compile
    each kernel for a T4 (sm_75, Colab's GPU) in a fresh Python without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE_FOR_A_T4], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    shared_bytes = [int(line) for line in out.stdout.split()]
    assert len(shared_bytes) == 3 and max(shared_bytes) <= 64 * 1024      # a T4 has 64 KB per block


# -- the engine: the same greedy tokens as with the torch reference -----------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_qwen3():
    """One KV head (GQA group 4): the fewest interpreter programs per step."""
    return load_model("tiny-qwen3", device=DEVICE.type)


def greedy_tokens(model, tokenizer, backend, rounds, min_split_tokens=None, **options):
    """rounds: [[(request id, prompt ids)]], each round run to the end before the next is added.
    Returns ({id: (tokens, num_cached_tokens)}, the engine's stats)."""
    eng = LLMEngine(model, tokenizer, attention_backend=backend, device=DEVICE.type, **options)
    if min_split_tokens:
        eng.kv_cache.backend.min_split_tokens = min_split_tokens
    tokens = {}
    for prompts in rounds:
        for rid, ids in prompts:
            eng.add_request(rid, ids, GREEDY)
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    tokens[out.request_id] = (out.outputs[0].token_ids, out.num_cached_tokens)
    assert eng.stats()["attention_backend"] == backend and eng.stats()["kv_blocks_used"] == 0
    return tokens, eng.stats()


STORY = ("In the early morning light, the fishermen of the northern coast pushed their small wooden "
         "boats into the cold grey water, calling to one another across the harbour as gulls circled "
         "overhead and the smell of salt and tar drifted through the narrow streets of the old town.")


def prompts_of(tokenizer, long_tokens=8):
    """Three prompts; "a" and "c" share their first 10 tokens (two and a half blocks of 4)."""
    shared = tokenizer.encode("A shared system prompt that several requests start with.")
    return [("a", shared + [1000, 2000, 3000]), ("b", tokenizer.encode("List three colors:")),
            ("c", shared + tokenizer.encode(STORY)[:long_tokens])]


def test_engine_chunked_prefill_and_prefix_cache_match_torch(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    a, b, c = prompts_of(tokenizer, long_tokens=60)
    rounds = [[a], [b, c]]                             # "c" starts with "a"'s cached blocks
    options = dict(block_size=4, num_kv_blocks=64, enable_prefix_caching=True, enable_chunked_prefill=True,
                   max_num_batched_tokens=8)           # chunks of "c" ride with decode rows of "b"
    want, _ = greedy_tokens(model, tokenizer, "torch", rounds, **options)
    # decode splits of 64 tokens (BLOCK_N): "c" decodes at 70+ tokens, over two splits
    got, stats = greedy_tokens(model, tokenizer, "triton", rounds, min_split_tokens=16, **options)
    assert got == want
    assert got["c"][1] > 0 and stats["prefix_cache_hit_rate"] > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_preempted_requests_match_torch(tiny_qwen3, mode):
    model, tokenizer = tiny_qwen3
    rounds = [prompts_of(tokenizer)]
    options = dict(block_size=4, num_kv_blocks=10, max_model_len=40, preemption_mode=mode,
                   enable_prefix_caching=False, enable_chunked_prefill=False)
    want, _ = greedy_tokens(model, tokenizer, "torch", rounds, **options)
    got, stats = greedy_tokens(model, tokenizer, "triton", rounds, **options)
    assert got == want
    assert stats["num_preemptions"] > 0
