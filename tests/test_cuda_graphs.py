"""CUDA graphs for decode steps (cuda_graphs.py): a replayed graph gives the eager tokens.

The GPU tests are skipped where there is no CUDA device. On CPU: when the runner decides
to capture, and the step it would capture with the Triton backend (static inputs,
seq_lens, the backend's own K/V write), run eagerly under Triton's interpreter.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"       # before any Triton kernel module is imported

from minillm.attention import ATTENTION_BACKENDS, TorchPagedAttention
from minillm.runner.cuda_graphs import CUDAGraphDecode, capture_safe
from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import SamplingParams
from minillm.runner.fixed_shape_decode import StaticDecodeStep, bucket_for

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PARAMS = [SamplingParams(temperature=0, max_tokens=4 + 5 * i, ignore_eos=True) for i in range(5)]


def workload():
    shared = list(range(5000, 5013))
    return [shared + list(range(100 * i, 100 * i + 2 * i + 1)) for i in range(5)]


def test_only_a_capture_safe_backend_is_captured():
    assert not capture_safe(TorchPagedAttention())           # its decode syncs on int(positions.max())
    model, tokenizer = load_model("tiny-llama", device="cpu")
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=16, max_model_len=32)
    assert engine.runner.run_decode is None                   # CPU, no compile: decode stays eager


def test_static_step_with_the_triton_backend_gives_the_runner_tokens():
    """What CUDA graphs capture, run eagerly (on CPU: under the interpreter, small shapes)."""
    if "triton" not in ATTENTION_BACKENDS:
        pytest.skip("no Triton backend registered")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model("tiny-llama", device=device)
    prompts, params = workload()[:3], PARAMS[:3]
    options = dict(block_size=4, num_kv_blocks=40, max_model_len=32, max_num_seqs=4, attention_backend="triton",
                   enforce_eager=True)
    expected = [o.outputs[0].token_ids for o in LLMEngine(model, tokenizer, **options).generate(prompts, params)]
    engine = LLMEngine(model, tokenizer, **options)
    step = StaticDecodeStep(model, engine.kv_cache, 4, engine.max_model_len)
    sizes = []
    engine.runner.static_step = step
    engine.runner.run_decode = lambda seqs: (sizes.append(len(seqs)), step.run(seqs))[1]
    assert [o.outputs[0].token_ids for o in engine.generate(prompts, params)] == expected
    assert sizes[0] == 3 and sizes[-1] == 1                  # 3 rows in bucket 4 (one padding row), then 2, 1
    assert step.kv[4].write.__self__ is engine.kv_cache.backend   # the backend's own K/V write


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_replayed_graphs_give_the_eager_tokens(backend):
    """With the torch backend the graphs are built by hand (the runner does not capture it);
    with Triton the engine captures them itself."""
    if backend not in ATTENTION_BACKENDS:
        pytest.skip(f"no {backend!r} attention backend registered")
    model, tokenizer = load_model("tiny-llama", device="cuda")
    options = dict(block_size=4, num_kv_blocks=80, max_model_len=64, max_num_seqs=5, attention_backend=backend)
    expected = [o.outputs[0].token_ids for o in
                LLMEngine(model, tokenizer, enforce_eager=True, **options).generate(workload(), PARAMS)]
    engine = LLMEngine(model, tokenizer, **options)
    if engine.runner.run_decode is None:
        assert backend == "torch"
        step = StaticDecodeStep(model, engine.kv_cache, 5, engine.max_model_len)
        engine.runner.static_step, engine.runner.run_decode = step, CUDAGraphDecode(step).run
    graphs = engine.runner.run_decode.__self__
    assert isinstance(graphs, CUDAGraphDecode) and sorted(graphs.graphs) == [1, 2, 4, 5]
    buckets, run = [], engine.runner.run_decode
    engine.runner.run_decode = lambda seqs: (buckets.append(bucket_for(graphs.step.buckets, len(seqs))), run(seqs))[1]
    outs = engine.generate(workload(), PARAMS)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert set(buckets) == {1, 2, 4, 5}, buckets

