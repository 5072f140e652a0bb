"""The engine on CUDA (skipped where there is none), and the half-precision contract it is held to.

On a GPU the engine runs in the device's "auto" dtype (bfloat16, or float16 before Ampere): its
greedy tokens must equal transformers' on the same GPU in the same dtype, a first difference
accepted only as a tie within `tie_tolerance` (models/reference.py). The tolerance itself and
the dtype rules are tested on CPU too."""
import pytest
import torch

from minillm.bench.roofline import available_backends
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.kv.swap import SwapSpace, contiguous_runs
from minillm.models import load_model
from minillm.models.loader import resolve_dtype
from minillm.models.reference import compare_greedy, reference_greedy, tie_tolerance, transformers_twin
from minillm.sampling_params import SamplingParams

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
QUESTIONS = ("What is the capital of France?", "Name three fruits.", "Count to five.")


def chat_prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


# -- everywhere: the rules -----------------------------------------------------------------

def test_tie_tolerance_is_relative_in_half_precision_and_absolute_in_float32():
    assert tie_tolerance(torch.float32, 20.0) == tie_tolerance(torch.float32, 2000.0) == 1e-3
    assert tie_tolerance(torch.bfloat16, 20.0) == 16 * 2 ** -8 * 20 == 1.25        # 1/16 of the max
    assert tie_tolerance(torch.bfloat16, -20.0) == 1.25
    assert tie_tolerance(torch.float16, 20.0) == 16 * 2 ** -11 * 20 == 0.15625     # 1/128 of the max
    assert tie_tolerance(torch.bfloat16, 0.0) == 1e-3                              # never below float32's


def test_compare_greedy_accepts_a_bfloat16_tie_and_refuses_a_real_difference():
    model, _ = load_model("tiny-llama", device="cpu")
    half, full = transformers_twin(model, torch.bfloat16), transformers_twin(model)
    for start in range(1000, 1100):           # a prompt whose runner-up lies inside the tolerance
        prompt = [start, start + 1, start + 2]
        with torch.inference_mode():
            logits = half(torch.tensor([prompt])).logits[0, -1].float()
        gaps = logits.max() - logits
        tolerance = tie_tolerance(torch.bfloat16, float(logits.max()))
        inside = torch.where((gaps > 0.2 * tolerance) & (gaps <= 0.9 * tolerance), gaps, float("inf"))
        if inside.min() < float("inf"):
            break
    top, near, far = int(logits.argmax()), int(inside.argmin()), int(gaps.argmax())
    assert 0.2 * tolerance < gaps[near] <= 0.9 * tolerance < tolerance < gaps[far]
    assert compare_greedy(half, prompt, [near, 5], [top, 6]) == "tie at step 0"
    with pytest.raises(AssertionError, match="not a rounding tie"):
        compare_greedy(half, prompt, [far], [top])
    with torch.inference_mode():
        full_top = int(full(torch.tensor([prompt])).logits[0, -1].argmax())
    with pytest.raises(AssertionError, match="not a rounding tie"):     # the same pair is no tie in float32
        compare_greedy(full, prompt, [near], [full_top])


def test_dtype_auto_is_float32_on_cpu_and_a_passed_model_keeps_its_own():
    assert EngineConfig().dtype == "auto"
    assert resolve_dtype("auto", "cpu") == resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == resolve_dtype(torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of"):
        resolve_dtype("half", "cpu")
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="half")
    model, tokenizer = load_model("tiny-llama", device="cpu", dtype="auto")
    assert model.dtype == torch.float32
    model.to(torch.bfloat16)
    assert LLMEngine(model, tokenizer, num_kv_blocks=8).model.dtype == torch.bfloat16    # not converted


def test_swap_copies_runs_of_consecutive_blocks_at_once():
    assert contiguous_runs([(4, 0), (5, 1), (6, 2), (9, 3), (2, 4), (3, 5)]) == [(4, 0, 3), (9, 3, 1), (2, 4, 2)]
    layers = [torch.randn(8, 2, 1, 4) for _ in range(2)]
    swap = SwapSpace(4, layers)
    assert swap.copy_stream is None and not swap.layers[0].is_pinned()    # CPU: plain copies, as before


# -- on a GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_on_cuda_matches_transformers(mode):
    model, tokenizer = load_model("SmolLM2-135M-Instruct", device="cuda")      # float32: kept by "auto"
    hf = transformers_twin(model.cpu()).eval()
    model.cuda()
    prompts = chat_prompts(tokenizer)
    engine = LLMEngine(model, tokenizer, block_size=16, num_kv_blocks=12, max_model_len=190,
                       preemption_mode=mode)
    assert engine.model.dtype == torch.float32
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for ids, out in zip(prompts, outs):
        compare_greedy(hf, ids, out.outputs[0].token_ids, reference_greedy(hf, ids, 48))
    assert engine.stats()["num_preemptions"] > 0
    assert engine.stats()["kv_blocks_used"] == 0



@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cuda_matches_transformers_in_the_same_dtype(dtype):
    model, tokenizer = load_model("SmolLM2-135M-Instruct", device="cuda", dtype=dtype)
    hf = transformers_twin(model, model.dtype, "cuda")
    prompts = chat_prompts(tokenizer)
    references = [reference_greedy(hf, ids, 48) for ids in prompts]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for backend in available_backends(model.device, model.dtype):
        for mode in ("recompute", "swap"):                    # under memory pressure, both ways back
            engine = LLMEngine(model, tokenizer, attention_backend=backend, block_size=16, num_kv_blocks=12,
                               max_model_len=190, preemption_mode=mode)
            for ids, out, ref in zip(prompts, engine.generate(prompts, params), references):
                compare_greedy(hf, ids, out.outputs[0].token_ids, ref)
            assert engine.stats()["num_preemptions"] > 0 and engine.stats()["kv_blocks_used"] == 0


@pytest.mark.gpu
@needs_cuda
def test_dtype_auto_on_cuda_is_bfloat16_where_the_gpu_has_it_else_float16():
    expected = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    assert resolve_dtype("auto", "cuda") == expected
    from minillm import LLM
    llm = LLM("tiny-llama", device="cuda", num_kv_blocks=16)
    assert llm.llm_engine.model.dtype == expected and llm.llm_engine.kv_cache.k[0].dtype == expected
    out = llm.generate([{"prompt_token_ids": [1000, 1001, 1002]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.gpu
@needs_cuda
def test_swap_on_cuda_goes_through_pinned_memory_on_a_copy_stream_in_order():
    layers = [torch.randn(8, 1024, 8, 128, device="cuda") for _ in range(3)]     # 4 MiB blocks: copies take time
    original = [t.clone() for t in layers]
    swap = SwapSpace(6, layers)
    assert swap.copy_stream is not None and all(t.is_pinned() for t in swap.layers)
    swap.copy_out(layers, [(1, 0), (2, 1), (5, 3)])
    for t in layers:                       # the freed blocks are reused at once, on the compute stream
        t[1:3].fill_(-1.0)
        t[5].fill_(-1.0)
    swap.copy_in(layers, [(0, 6), (1, 7), (3, 2)])
    result = [t * 1 for t in layers]       # the next forward reads them, on the compute stream
    torch.cuda.synchronize()
    for t, o in zip(result, original):
        assert torch.equal(t[6], o[1]) and torch.equal(t[7], o[2]) and torch.equal(t[2], o[5])
        assert torch.equal(t[5], torch.full_like(o[5], -1.0))
    assert swap.bytes_moved == 2 * 3 * len(layers) * 1024 * 8 * 128 * 4



@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("options", [dict(num_kv_blocks=10**9), dict(kv_cache_memory_bytes=10**15)])
def test_a_pool_past_the_gpu_is_refused_before_allocating(options):
    model, tokenizer = load_model("tiny-llama", device="cuda")
    before = torch.cuda.memory_allocated()
    with pytest.raises(ValueError, match=r"does not fit cuda(:\d)? memory: .* lower num_kv_blocks"):
        LLMEngine(model, tokenizer, **options)
    assert torch.cuda.memory_allocated() == before          # nothing was allocated on the way
