"""Quantized linears: every kernel against the plain-torch reference, the registry, quantize_model,
the option at every door, and the engine running quantized.

The contract for a quantized model is exactness against ITSELF, not against float32: the
engine (paged, prefix-cached, preempted by recompute or swap) gives the same greedy tokens as
the quantized model's own no-cache loop, up to a rounding tie (the kernels at decode and the
dequantize path of a full recompute sum in different orders). Closeness to float32 is measured
in test_quant_quality.py.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.baselines.naive_generation import next_token_logits_naive
from minillm.quant import (LINEAR_BACKENDS, Int4Linear, Int8Linear, kernels, quantization_names,
                           quantize_model, register_linear_backend)
from minillm.quant.quality import float_copy
from minillm.quant.reference import (dequantize_int4, dequantize_int8, quantize_int4, quantize_int4_float16_scales,
                                     quantize_int8)

# -- the reference quantizers --------------------------------------------------------------


def test_int8_reference_rounds_each_weight_to_its_rows_grid():
    w = torch.randn(48, 80) * torch.linspace(0.1, 3, 48)[:, None]     # rows of very different ranges
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    assert torch.allclose(scale, w.abs().amax(dim=1) / 127)
    err = (dequantize_int8(q, scale) - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-6).all()                      # half a step, per row
    assert q.abs().amax(dim=1).eq(127).all()                             # the row's largest maps to 127


def test_int4_reference_uses_every_groups_own_range():
    w = torch.randn(32, 128) + torch.arange(128) / 16                    # groups with different offsets
    q, scale, minimum = quantize_int4(w, 32)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and scale.shape == minimum.shape == (32, 4)
    groups = w.reshape(32, 4, 32)
    assert torch.equal(minimum, groups.amin(-1))
    err = (dequantize_int4(q, scale, minimum, 32) - w).abs().reshape(32, 4, 32)
    assert (err <= scale[..., None] / 2 + 1e-5).all()
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_int4(torch.randn(4, 40), 32)


def test_float16_scales_are_float16_values_chosen_before_the_codes():
    """Int4Linear's scales and minimums are stored on float16's grid (w4a8 reads them as float16):
    the codes are chosen against the rounded grid, so the error stays about half a step."""
    torch.manual_seed(0)
    w = torch.randn(32, 128) * torch.logspace(-6, 1, 32)[:, None]      # down to float16's subnormals
    _, exact_scale, exact_minimum = quantize_int4(w, 32)
    q, scale, minimum = quantize_int4_float16_scales(w, 32)
    assert torch.equal(scale, exact_scale.half().float()) and torch.equal(minimum, exact_minimum.half().float())
    err = (dequantize_int4(q, scale, minimum, 32) - w).abs().reshape(32, 4, 32)
    # half a step, plus what rounding the minimum and the 15 steps' span to float16 moved
    bound = 0.5 * scale + (minimum - exact_minimum).abs() + 15 * (scale - exact_scale).abs()
    assert (err <= bound[..., None] * (1 + 1e-5) + 1e-12).all()
    with pytest.raises(ValueError, match="float16"):
        quantize_int4_float16_scales(torch.full((2, 32), 7e4), 32)


def test_a_row_or_group_of_zeros_stays_exactly_zero():
    w = torch.zeros(32, 64)
    assert dequantize_int8(*quantize_int8(w)).eq(0).all()
    assert dequantize_int4(*quantize_int4(w, 32), 32).eq(0).all()

# -- every kernel against the reference ------------------------------------------------------


def reference_weight(linear, method, group_size):
    """What the layer must multiply by, from the reference quantizer alone."""
    w = linear.weight.detach().float()
    if method == "int8":
        return dequantize_int8(*quantize_int8(w))
    k = w.shape[1]
    padded = F.pad(w, (0, -k % group_size))
    return dequantize_int4(*quantize_int4_float16_scales(padded, group_size), group_size)[:, :k]


CASES = [("int8", None), ("int4", 32), ("int4", 64), ("int4", 128)]


@pytest.mark.parametrize("method,group_size", CASES)
@pytest.mark.parametrize("shape", [(1536, 576), (192, 576), (48, 96)])   # 48 rows: not a panel multiple
@pytest.mark.parametrize("rows", [1, 7, 64, 130])                       # C / torch kernels, then dequantize
def test_float32_kernels_match_dequantize_then_linear(method, group_size, shape, rows):
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=True)
    options = {} if group_size is None else {"group_size": group_size}
    layer = LINEAR_BACKENDS[method].from_linear(linear, **options)
    x = torch.randn(rows, shape[1])
    expected = F.linear(x, reference_weight(linear, method, group_size), linear.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=2e-5 * shape[1] ** 0.5)
    torch.testing.assert_close(layer.dequantized_weight(), reference_weight(linear, method, group_size))
    assert layer(x[None]).shape == (1, rows, shape[0])                  # leading dims kept


@pytest.mark.parametrize("method,group_size", [("int8", None), ("int4", 32)])
@pytest.mark.parametrize("shape", [(96, 77), (2048, 576)])    # 3 panels (a pair and one alone), K odd
def test_a_row_gives_the_same_bits_whatever_shares_its_call(method, group_size, shape):
    """Batch invariance (w4a8.py's docstring says why the engine needs it): the kernels' tiles of
    1, 2 and 4 rows, over one or two panels at once, sum in one order, so row i of an M-row call
    is the 1-row call's result bit for bit, for every M up to MAX_ROWS and any thread count."""
    if kernels.load_kernels() is None:
        pytest.skip(f"no C compiler: {kernels.load_error}")
    torch.manual_seed(0)
    options = {} if group_size is None else {"group_size": group_size}
    layer = LINEAR_BACKENDS[method].from_linear(nn.Linear(shape[1], shape[0], bias=False), **options)
    assert layer.use_c_kernel
    x = torch.randn(kernels.MAX_ROWS, shape[1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(kernels.MAX_ROWS)])
        for count in (1, 2):
            torch.set_num_threads(count)
            for m in (1, 2, 3, 4, 5, 6, 7, 8, 13, kernels.MAX_ROWS):
                assert torch.equal(layer(x[:m]), alone[:m]), f"{m} rows, {count} threads"
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(alone, F.linear(x, layer.dequantized_weight()), rtol=1e-5, atol=2e-5 * shape[1] ** 0.5)


def test_the_c_kernels_are_the_ones_running_at_decode():
    if kernels.load_kernels() is None:
        pytest.skip(f"no C compiler: {kernels.load_error}")
    assert Int8Linear.from_linear(nn.Linear(576, 192)).use_c_kernel
    assert Int4Linear.from_linear(nn.Linear(576, 192)).use_c_kernel
    assert not Int4Linear.from_linear(nn.Linear(96, 48)).use_c_kernel   # 48 % 32: the torch paths


@pytest.mark.parametrize("method,group_size", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_packed_kernels_in_half_precision_match_the_reference(method, group_size, dtype):
    """bfloat16/float16 on CPU run torch's aten._weight_int8pack_mm / _weight_int4pack_mm_for_cpu."""
    torch.manual_seed(0)
    linear = nn.Linear(576, 192, bias=False).to(dtype)
    options = {} if group_size is None else {"group_size": group_size}
    layer = LINEAR_BACKENDS[method].from_linear(linear, **options)
    x = torch.randn(5, 576).to(dtype)
    expected = F.linear(x.float(), layer.dequantized_weight())
    assert layer(x).dtype == dtype
    torch.testing.assert_close(layer(x).float(), expected, rtol=2e-2, atol=5e-2)
    # the stored weight is the reference's, up to the scales' rounding to `dtype`
    torch.testing.assert_close(layer.dequantized_weight(), reference_weight(linear, method, group_size),
                               rtol=1e-2, atol=1e-2)


def test_bad_group_sizes_are_refused():
    for bad in (16, 100, 0):
        with pytest.raises(ValueError, match="group_size"):
            Int4Linear.from_linear(nn.Linear(64, 32), group_size=bad)

# -- registry and quantize_model ---------------------------------------------------------------


def tiny_copy(name="tiny-llama"):
    model, tokenizer = load_model(name, device="cpu")
    return model, tokenizer


def linear_names(model, kind):
    return sorted(n for n, m in model.named_modules() if isinstance(m, kind))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])            # qwen3: tied embeddings
def test_quantize_model_swaps_projections_and_keeps_the_embedding_float(name):
    model, _ = tiny_copy(name)
    projections = linear_names(model, nn.Linear)
    quantize_model(model, "int8", include_head=False)
    swapped = linear_names(model, Int8Linear)
    assert swapped == [n for n in projections if n != "lm_head"] and len(swapped) == 7 * 2
    assert not isinstance(model.lm_head, Int8Linear) and model.model.embed_tokens.weight.dtype == torch.float32
    assert model.quantization == "int8"

    head_too, _ = tiny_copy(name)                    # the default: the head too, in int8 whatever the layers get
    embedding = head_too.model.embed_tokens.weight.detach().clone()
    quantize_model(head_too, "int4", group_size=64)
    assert isinstance(head_too.lm_head, Int8Linear) and isinstance(head_too.model.layers[0].mlp.up_proj, Int4Linear)
    assert head_too.model.layers[0].mlp.up_proj.group_size == 64
    assert torch.equal(head_too.model.embed_tokens.weight, embedding)     # tied: the embedding stays float
    assert head_too.dtype == torch.float32


def test_quantizing_twice_is_a_no_op_for_the_same_method_and_refused_otherwise():
    model, _ = tiny_copy()
    quantize_model(model, "int4", group_size=32)
    layer = model.model.layers[0].mlp.up_proj
    assert quantize_model(model, "int4") is model and model.model.layers[0].mlp.up_proj is layer
    assert quantize_model(model, "int4", group_size=32) is model
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(model, "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(model, "int4", group_size=128)
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        quantize_model(tiny_copy()[0], "int3")


def test_a_learners_backend_plugs_in_with_one_call():
    class FakeQuant8(nn.Module):
        """A learner's linear: int8 per channel with the reference functions."""
        name = "learner-int8"

        def __init__(self, linear):
            super().__init__()
            q, scale = quantize_int8(linear.weight)
            self.register_buffer("weight_q", dequantize_int8(q, scale))
            self.bias = linear.bias

        @classmethod
        def from_linear(cls, linear):
            return cls(linear)

        def forward(self, x):
            return F.linear(x, self.weight_q, self.bias)

    register_linear_backend(FakeQuant8)
    try:
        assert "learner-int8" in quantization_names()
        model, tokenizer = tiny_copy()
        reference = quantize_model(float_copy(model), "int8")
        llm = LLM(model, tokenizer=tokenizer, quantization="learner-int8", num_kv_blocks=64)
        assert llm.llm_engine.stats()["quantization"] == "learner-int8"
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        ours = llm.generate(["The capital of France is"], params, use_tqdm=False)[0].outputs[0].token_ids
        theirs = LLM(reference, tokenizer=tokenizer, num_kv_blocks=64).generate(
            ["The capital of France is"], params, use_tqdm=False)[0].outputs[0].token_ids
        assert ours == theirs
    finally:
        LINEAR_BACKENDS.pop("learner-int8")
    for bad in (type("NoName", (), {"from_linear": classmethod(lambda c, l: l)}), type("NoFrom", (), {"name": "x"})):
        with pytest.raises(TypeError):
            register_linear_backend(bad)


@pytest.mark.parametrize("bad", ["int3", "", "INT8", 8, True])
def test_bad_quantization_values_are_refused_at_the_door(bad):
    with pytest.raises((ValueError, TypeError), match="quantization must be one of 'int4', 'int8', 'w4a8' or None"):
        EngineConfig(quantization=bad)
    with pytest.raises((ValueError, TypeError), match="quantization"):
        LLM("tiny-llama", quantization=bad)
    config = EngineConfig()
    with pytest.raises((ValueError, TypeError), match="quantization"):
        config.quantization = bad
    assert config.quantization is None


def test_engine_reports_and_bfloat16_runs():
    model, tokenizer = tiny_copy()
    engine = LLMEngine(model, tokenizer, quantization="int4", dtype="bfloat16", num_kv_blocks=64)
    assert engine.stats()["quantization"] == "int4" and engine.model.dtype == torch.bfloat16
    assert model.dtype == torch.float32 and getattr(model, "quantization", None) is None     # its own tree
    out = engine.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5
    assert LLMEngine(*tiny_copy(), num_kv_blocks=64).stats()["quantization"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_cuda_bfloat16_runs_the_dequantize_path(method):
    model, tokenizer = load_model("tiny-llama", device="cuda", dtype=torch.bfloat16)
    engine = LLMEngine(model, tokenizer, quantization=method, num_kv_blocks=64)
    out = engine.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5

# -- the engine running quantized on the embedded model: exact against itself ------------------


def own_greedy(model, prompt_ids, max_tokens):
    """The quantized model's no-cache greedy tokens, with the logits of each step (for ties)."""
    ids, steps = list(prompt_ids), []
    for _ in range(max_tokens):
        logits = next_token_logits_naive(model, ids)
        steps.append(logits)
        ids.append(int(logits.argmax()))
    return ids[len(prompt_ids):], steps


def assert_same_or_tie(ours, reference, steps, tie=1e-3):
    if ours == reference:
        return
    i = next(i for i, (a, b) in enumerate(zip(ours, reference)) if a != b)
    logits = steps[i]
    top = float(logits.max())
    assert top - float(logits[ours[i]]) <= tie and top - float(logits[reference[i]]) <= tie, (
        f"step {i}: engine {ours[i]} vs no-cache {reference[i]}: not a rounding tie")


# w4a8 rounds activations: a float-rounding difference can flip one (w4a8.py's docstring), so
# its first differences sit at larger logit gaps (0.15-0.17 measured) than float noise makes
TIES = {"w4a8": 0.5}


QUESTIONS = ("What is the capital of France?", "What is the capital of Italy?", "Name three fruits.")
MAX_TOKENS = 12


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int4", "w4a8"])
def test_engine_quantized_matches_its_own_no_cache_loop(smol, method):
    model, tokenizer, _ = smol
    quantized = quantize_model(float_copy(model), method)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    expected = [own_greedy(quantized, p, MAX_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    # the chat template's shared system prompt (24 tokens) gives prefix hits; three 34-37-token
    # prompts growing by 12 need 3 x 13 - 2 x 6 = 27 blocks of 4 at their longest: 22 force preemption
    for options in ({"num_kv_blocks": 64}, {"num_kv_blocks": 22, "preemption_mode": "recompute"},
                    {"num_kv_blocks": 22, "preemption_mode": "swap"}):
        engine = LLMEngine(quantized, tokenizer, enable_prefix_caching=True, block_size=4,
                           quantization=method, **options)        # already quantized: a no-op
        outs = engine.generate(prompts, params) + engine.generate(prompts[:1], params)   # 2nd: cached prompt
        for out, (tokens, steps) in zip(outs, expected + expected[:1]):
            assert_same_or_tie(out.outputs[0].token_ids, tokens, steps, TIES.get(method, 1e-3))
        stats = engine.stats()
        assert stats["quantization"] == method and stats["prefix_cache_hit_rate"] > 0
        if options["num_kv_blocks"] == 22:
            assert stats["num_preemptions"] > 0, options
