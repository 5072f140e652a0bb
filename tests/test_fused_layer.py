"""The engine's fused decoder layer (models/fused_layer.py) and its C kernels (models/fused_ops.c):
each kernel against the torch ops it replaces, and a fused layer against llama.py's over a real cache."""
import pytest
import torch
import torch.nn.functional as F

from minillm.attention.paged import PagedStep, TorchPagedAttention
from minillm.kv.paged_cache import PagedKVCache
from minillm.models import fused_ops
from minillm.models.fused_layer import FusedDecoderLayer, can_fuse, fuse_decoder_layers
from minillm.models.llama import RMSNorm, apply_rope
from minillm.quant import quantize_model
from minillm.runner.engine_model import model_for_engine, own_module_tree
from conftest import get_model

needs_kernel = pytest.mark.skipif(fused_ops.KERNEL.load() is None, reason="no C compiler")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 7, 100])        # 100: the multi-threaded branch
def test_norm_kernels_match_torch(rows):
    torch.manual_seed(rows)
    norm = RMSNorm(576, 1e-5)
    norm.weight.data = torch.randn(576)
    x, delta = torch.randn(rows, 576) * 3, torch.randn(rows, 576)
    torch.testing.assert_close(fused_ops.rms_norm(x, norm.weight, norm.eps), norm(x), rtol=1e-6, atol=1e-6)
    total, normed = fused_ops.add_rms_norm(x, delta, norm.weight, norm.eps)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(normed, norm(x + delta), rtol=1e-6, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_rope_write_matches_torch_bit_for_bit(rows):
    torch.manual_seed(rows)
    heads, kv_heads, d, blocks, block_size = 6, 2, 32, 10, 16
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d)
    angles = torch.rand(rows, 1, d // 2) * 100
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    slots = torch.randperm(blocks * block_size)[:rows]
    k_cache, v_cache = torch.zeros(blocks, block_size, kv_heads, d), torch.zeros(blocks, block_size, kv_heads, d)
    q = fused_ops.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads, kv_heads)
    q_ref, k_ref, v_ref = qkv.split([heads * d, kv_heads * d, kv_heads * d], -1)
    assert torch.equal(q, apply_rope(q_ref.reshape(rows, heads, d), cos, sin))
    assert torch.equal(k_cache.view(-1, kv_heads, d)[slots], apply_rope(k_ref.reshape(rows, kv_heads, d), cos, sin))
    assert torch.equal(v_cache.view(-1, kv_heads, d)[slots], v_ref.reshape(rows, kv_heads, d))
    assert k_cache.count_nonzero() == rows * kv_heads * d          # nothing written elsewhere


@needs_kernel
def test_rope_write_refuses_a_slot_outside_the_cache():
    k_cache = v_cache = torch.zeros(2, 4, 1, 8)
    qkv, cos = torch.randn(1, 3 * 8), torch.ones(1, 8)
    with pytest.raises(IndexError, match="outside"):
        fused_ops.rope_write_kv(qkv, cos, cos, k_cache, v_cache, torch.tensor([8]), 1, 1)
    assert k_cache.count_nonzero() == 0


@needs_kernel
@pytest.mark.parametrize("rows", [1, 70])
def test_silu_mul_matches_torch(rows):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 96) * 4
    gate, up = gate_up.split(96, dim=-1)
    torch.testing.assert_close(fused_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-6, atol=1e-6)
    assert torch.equal(fused_ops.silu_mul_ctypes(gate_up), fused_ops.silu_mul(gate_up))   # C++ op = ctypes call


def test_kernels_step_aside_for_what_they_cannot_read():
    x, w = torch.randn(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64)
    assert fused_ops.rms_norm(x, w, 1e-5) is None                   # float64: the torch road
    assert fused_ops.add_rms_norm(torch.randn(2, 8).t(), torch.randn(8, 2), torch.ones(2), 1e-5) is None


def run_layer(layer, model, x, positions, kv):
    cos, sin = model.model.rotary(positions)
    return layer(x, cos, sin, kv)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])   # plain, q/k/v bias, q/k norm
@pytest.mark.parametrize("quantization", [None, "int8", "w4a8"])
def test_fused_layer_equals_the_plain_layer_over_a_paged_cache(name, quantization):
    model = own_module_tree(get_model(name)[0])         # new modules over the same weights: swaps stay here
    plain = model.model.layers[1]
    assert can_fuse(plain)
    fused = FusedDecoderLayer(own_module_tree(plain))
    if quantization:         # stacked then quantized against each piece quantized: the same numbers
        quantize_model(plain, quantization, include_head=False)
        quantize_model(fused, quantization, include_head=False)
    caches = [PagedKVCache.for_model(model, 8, 16, TorchPagedAttention()) for _ in range(2)]
    torch.manual_seed(0)
    for starts, counts in (([0, 0], [11, 5]), ([11, 5], [1, 1]), ([12, 6], [3, 1])):   # prefill, decode, mixed
        step = PagedStep.build([[0, 1], [2, 3]], starts, counts, 16)
        x = torch.randn(sum(counts), model.config.hidden_size)
        outs = []
        for layer, kv in zip((plain, fused), caches):
            kv.set_step(step)
            outs.append(run_layer(layer, model, x, step.positions, kv))
        tolerance = 2e-3 if quantization == "w4a8" else 1e-5        # w4a8 rounds activations: jumps
        torch.testing.assert_close(outs[1], outs[0], rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(caches[1].k[1], caches[0].k[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(caches[1].v[1], caches[0].v[1], rtol=1e-5, atol=1e-5)


def test_engine_model_fuses_every_layer_and_leaves_the_handed_model_alone(smol):
    model = smol[0]
    own = model_for_engine(model, torch.device("cpu"), torch.float32, None)
    assert all(isinstance(layer, FusedDecoderLayer) for layer in own.model.layers)
    assert not any(isinstance(layer, FusedDecoderLayer) for layer in model.model.layers)
    assert fuse_decoder_layers(own) == 0                    # nothing left to fuse


@needs_kernel
def test_cpp_ops_and_ctypes_give_identical_outputs():
    """The C++ wrappers (utils/torch_ops.cpp) where they built, against the ctypes calls."""
    fused_ops.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-5)            # loads the kernel: ops go native
    if not fused_ops.KERNEL.native:
        pytest.skip(f"no C++ ops here: {__import__('minillm.utils.native_ops').utils.native_ops.load_error}")
    torch.manual_seed(1)
    x, delta, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    assert torch.equal(torch.ops.minillm.rms_norm(x, w, 1e-6), fused_ops.rms_norm_ctypes(x, w, 1e-6))
    for a, b in zip(torch.ops.minillm.add_rms_norm(x, delta, w, 1e-6), fused_ops.add_rms_norm_ctypes(x, delta, w, 1e-6)):
        assert torch.equal(a, b)
    qkv, cos, sin, slots = torch.randn(3, 4 * 16), torch.randn(3, 16), torch.randn(3, 16), torch.tensor([5, 0, 9])
    caches = [[torch.zeros(4, 4, 1, 16) for _ in range(2)] for _ in range(2)]
    q_op = torch.ops.minillm.rope_write_kv(qkv, cos, sin, *caches[0], slots, 2, 1)
    q_ctypes = fused_ops.rope_write_kv_ctypes(qkv, cos, sin, *caches[1], slots, 2, 1)
    assert torch.equal(q_op, q_ctypes) and all(torch.equal(a, b) for a, b in zip(*caches))
    with pytest.raises(ValueError, match="rope_write_kv: cos and sin"):               # a wrong shape: refused, clearly
        torch.ops.minillm.rope_write_kv(qkv, cos[:, :8], sin, *caches[0], slots, 2, 1)


def test_op_count_bench_counts_fewer_operations_fused():
    from minillm.bench.op_count import main, measure
    import argparse
    from minillm.bench import op_count
    parser = argparse.ArgumentParser()
    op_count.add_engine_arguments(parser, dtype="float32")
    args = parser.parse_args([])
    args.model, args.batch, args.context = "tiny-llama", 2, 20
    counts = measure(args)
    plain, fused = (sum(counts[v].values()) for v in ("plain", "fused"))
    layers = get_model("tiny-llama")[0].config.num_hidden_layers
    assert counts["fused"]["aten.pow"] == 0 and counts["plain"]["aten.pow"] == 2 * layers + 1   # RMSNorm's ops: gone
    assert fused < plain / 2, (plain, fused)
    main(["--model", "tiny-llama", "--batch", "1", "--context", "8"])             # the command prints its table


def test_an_engine_on_a_float32_cpu_model_shares_its_stacked_weights(smol):
    """share_stacked_weights lays the handed model's q/k/v and gate/up out as blocks of one tensor, so the
    engine's stacked linears (and gate/up's packed copy) are that memory, not a second copy of the model."""
    from minillm.models.cpu_linear import PanelLinear
    model = smol[0]
    values = {k: v.clone() for k, v in model.state_dict().items()}
    own = model_for_engine(model, torch.device("cpu"), torch.float32, None)
    same_memory = lambda a, b: a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    for fused, plain in zip(own.model.layers, model.model.layers):
        assert same_memory(fused.qkv_proj.weight, plain.self_attn.q_proj.weight)
        assert same_memory(fused.gate_up_proj.weight, plain.mlp.up_proj.weight)
        assert isinstance(fused.gate_up_proj, PanelLinear) and isinstance(plain.mlp.gate_proj, PanelLinear)
        assert same_memory(fused.gate_up_proj.panels, plain.mlp.up_proj.panels)
    assert all(torch.equal(values[k], v) for k, v in model.state_dict().items())      # same values
    x = torch.randn(3, model.config.hidden_size)
    up = model.model.layers[0].mlp.up_proj
    torch.testing.assert_close(up(x), x @ values["model.layers.0.mlp.up_proj.weight"].t(), rtol=1e-5, atol=1e-5)
