"""The static decode step (static_decode.py) and compile=True (compiled_decode.py) on CPU.

Buckets are chosen right; padding rows write only the scratch block; the static step run
eagerly gives the same logits, K/V and tokens as the engine's runner; the C kernel is a
well-formed torch op; the compiled engine gives the same greedy tokens as the eager one
while the batch moves between buckets, with prefix caching.
"""
import argparse
import functools

import pytest
import torch

from minillm.attention import make_backend
from minillm.attention.cpu_paged import kernel_available, run_kernel, load_kernel
from minillm.attention.paged import TorchPagedAttention
from minillm.cli.chat import add_sampling_arguments
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.kv.paged_cache import PagedKVCache
from minillm.models import load_model
from minillm.runner.model_runner import ModelRunner
from minillm.sampling_params import SamplingParams
from minillm.server.cli import add_arguments, engine_options
from minillm.runner.fixed_shape_decode import StaticDecodeStep, bucket_for, bucket_sizes

@functools.cache
def get_model(name):
    """(model, tokenizer), built once: a tiny random model (no transformers twin needed here)."""
    return load_model(name, device="cpu")


BACKENDS = ["cpu-kernel", "torch"] if kernel_available() else ["torch"]


def test_bucket_sizes_and_choice():
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert bucket_sizes(1) == [1] and bucket_sizes(5) == [1, 2, 4, 5] and bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    buckets = bucket_sizes(32)
    assert [bucket_for(buckets, n) for n in (1, 2, 3, 5, 8, 9, 17, 25, 32)] == [1, 2, 4, 8, 8, 16, 24, 32, 32]


class Seq:
    """What the runner reads of a sequence."""

    def __init__(self, token_ids, block_table):
        self.token_ids, self.block_table, self.num_computed_tokens = list(token_ids), block_table, 0
        self.prompt_token_ids, self.params = self.token_ids, SamplingParams()
        self.input_token_ids, self.spec_token_ids = self.token_ids, []

    def __len__(self):
        return len(self.token_ids)

    def input_tokens(self, start, end):
        return self.input_token_ids[start:end]


@pytest.mark.parametrize("backend", BACKENDS)
def test_static_step_matches_runner_and_padding_touches_only_scratch(backend):
    model, _ = get_model("tiny-llama")
    cache = PagedKVCache.for_model(model, num_blocks=12, block_size=4, backend=make_backend(backend, model.device,
                                                                                              model.dtype))
    runner = ModelRunner(model, cache)
    step = StaticDecodeStep(model, cache, max_num_seqs=8, max_model_len=32)
    assert step.scratch_block == 12 and step.k[0].shape[0] == 13 and cache.k[0].data_ptr() == step.k[0].data_ptr()
    seqs = [Seq(range(1000, 1006), [7, 1]), Seq(range(2000, 2009), [3, 9, 0]), Seq([3000, 3001], [5])]
    for s in seqs:                                   # prefill eagerly, then one decode token each
        runner.execute([(s, len(s))])
        s.num_computed_tokens = len(s)
        s.token_ids.append(500 + len(s))
    before = [t.clone() for t in step.k + step.v]
    static_logits = step.run(seqs)                   # 3 rows: bucket 4, one padding row
    static_kv = [t.clone() for t in step.k + step.v]
    for t, b in zip(step.k + step.v, before):
        t.copy_(b)
    samplers, eager_logits, *_ = runner.execute([(s, 1) for s in seqs])
    assert samplers == seqs
    torch.testing.assert_close(static_logits, eager_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(static_logits.argmax(-1), eager_logits.argmax(-1))
    real_slots = [1 * 4 + 2, 0 * 4 + 1, 5 * 4 + 2]   # position 6 of [7, 1], 9 of [3, 9, 0], 2 of [5]
    scratch_slot = 12 * 4
    for static, eager, old in zip(static_kv, step.k + step.v, before):
        changed = (static != old).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
        assert changed == sorted(real_slots + [scratch_slot]), changed
        torch.testing.assert_close(static[:12], eager[:12], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_with_eager_static_step_gives_the_runner_tokens(backend):
    model, tokenizer = get_model("tiny-qwen3")
    shared = list(range(5000, 5013))
    prompts = [shared + list(range(100 * i, 100 * i + 3 * i + 1)) for i in range(5)] + [[42]]
    params = [SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(6)]
    options = dict(block_size=4, num_kv_blocks=80, max_model_len=64, max_num_seqs=6, attention_backend=backend)
    reference = LLMEngine(model, tokenizer, **options)
    reference.generate([shared + [1]], params[0])        # fills the prefix cache
    expected = [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
    engine = LLMEngine(model, tokenizer, **options)
    step = StaticDecodeStep(model, engine.kv_cache, 6, engine.max_model_len)
    engine.generate([shared + [1]], params[0])
    buckets = []
    engine.runner.static_step = step
    engine.runner.run_decode = lambda seqs: (buckets.append(bucket_for(step.buckets, len(seqs))), step.run(seqs))[1]
    outs = engine.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert outs[3].num_cached_tokens > 0                 # the shared prefix came from the cache
    assert set(buckets) == {1, 2, 4, 6}, buckets         # the batch shrank as requests finished
    assert buckets == sorted(buckets, reverse=True)


@pytest.mark.skipif(not kernel_available(), reason="no C compiler: no kernel")
def test_paged_decode_op_is_a_well_formed_torch_op():
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 10, 4, 2, 16, generator=gen)
    q = torch.randn(3, 6, 16, generator=gen)
    tables = torch.tensor([[3, 1, 0], [9, 2, 5], [4, 4, 4]])
    positions = torch.tensor([5, 11, 0])
    torch.library.opcheck(torch.ops.minillm.paged_decode_attention.default, (q, k, v, tables, positions))
    ours = torch.ops.minillm.paged_decode_attention(q, k, v, tables, positions)
    ref = TorchPagedAttention().decode(q, k, v, tables, positions)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, run_kernel(load_kernel(), q, k, v, tables, positions))


def test_compiled_engine_gives_the_eager_tokens_across_buckets_with_prefix_caching():
    """max_num_seqs=2: two buckets to compile (1 and 2), kept small for the test's time."""
    model, tokenizer = get_model("tiny-llama")
    shared = list(range(7000, 7011))
    prompts = [shared + [11, 12], shared + [21], list(range(300, 309))]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (12, 5, 8)]
    options = dict(block_size=4, num_kv_blocks=64, max_model_len=48, max_num_seqs=2)
    reference = LLMEngine(model, tokenizer, **options)
    reference.generate([shared], SamplingParams(temperature=0, max_tokens=1))   # fills the prefix cache
    expected = [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
    engine = LLMEngine(model, tokenizer, compile=True, **options)
    engine.generate([shared], SamplingParams(temperature=0, max_tokens=1))      # (a prefill: no decode yet)
    compiled = engine.runner.run_decode.__self__
    outs = engine.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert outs[0].num_cached_tokens > 0 and outs[1].num_cached_tokens > 0
    assert not compiled.failed and compiled.warm == {1, 2}
    assert engine.runner.static_step.k[0].shape[0] == engine.kv_cache.num_blocks + 1


def test_compile_is_off_by_default_and_checked():
    model, tokenizer = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=16, max_model_len=32)
    assert engine.runner.run_decode is None and engine.kv_cache.k[0]._base is None   # eager, no scratch block
    for field in ("compile", "enforce_eager"):
        with pytest.raises(TypeError, match=field):
            EngineConfig(**{field: 1})


def test_flags_reach_the_engine_options():
    serve = argparse.ArgumentParser()
    add_arguments(serve)
    assert engine_options(serve.parse_args(["--compile", "--enforce-eager"])) | {} == {
        "compile": True, "enforce_eager": True}
    assert "compile" not in engine_options(serve.parse_args([]))
    generate = argparse.ArgumentParser()
    add_sampling_arguments(generate)
    assert generate.parse_args(["--compile"]).compile and not generate.parse_args([]).compile


@pytest.mark.parametrize("method", ["int8", "int4", "w4a8"])
def test_compiled_step_runs_quantized_linears(method):
    """A quantized model (minillm.quant swaps the linears) runs compiled with the eager tokens:
    its C kernels are torch.library ops (quant/kernels.py), so the graph holds them; a ctypes
    call inside the step would make it fall back to eager, which fails here. One bucket
    (max_num_seqs=1) keeps the compile short."""
    from minillm import quant
    model, tokenizer = load_model("tiny-llama", device="cpu")
    quant.quantize_model(model, method)
    options = dict(block_size=4, num_kv_blocks=32, max_model_len=48, max_num_seqs=1)
    prompts, params = [list(range(400, 409)), [7, 8, 9]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    eager = LLMEngine(model, tokenizer, **options).generate(prompts, params)
    assert not any(o.error for o in eager), [o.error for o in eager]
    expected = [o.outputs[0].token_ids for o in eager]
    engine = LLMEngine(model, tokenizer, compile=True, **options)
    assert [o.outputs[0].token_ids for o in engine.generate(prompts, params)] == expected
    assert all(len(tokens) == 6 for tokens in expected)
    compiled = engine.runner.run_decode.__self__
    assert not compiled.failed, f"the {method} linears broke torch.compile: the step ran eagerly"
    assert compiled.warm == {1}
