"""w4a8: int4 weights times activations rounded to int8 (minillm/quant/w4a8.py, w4a8_linear.c).

The reference is F.linear(fake-quantized x, dequantized W); both C builds (VNNI where the CPU
has it, and the plain C loop) must give it within float rounding, and must differ from the
weight-only int4 result (a kernel that forgot to round the activations fails)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm.quant import LINEAR_BACKENDS, Int4Linear, W4A8Linear
from minillm.quant.reference import fake_quantize_activations, quantize_activations_int8
from minillm.quant import w4a8
from minillm.quant.w4a8 import load_w4a8_kernel, pack_w4a8_panels, w4a8_matmul


def test_activations_round_per_block_of_32_symmetrically():
    torch.manual_seed(0)
    x = torch.randn(3, 96) * torch.tensor([1.0, 100.0, 0.01]).repeat_interleave(32)   # blocks of different scales
    x[2, 32:64] = 0                                                                   # a block of zeros
    qx, d = quantize_activations_int8(x)
    assert qx.dtype == torch.int8 and d.shape == (3, 3)
    assert qx.abs().max() == 127 and qx.reshape(3, 3, 32).abs().amax(-1).eq(127).sum() == 8  # each block's largest -> 127
    assert d[2, 1] == 1 and qx[2, 32:64].eq(0).all()
    largest = x.reshape(3, 3, 32).abs().amax(-1)
    assert torch.equal(d, torch.where(largest > 0, largest / 127, torch.ones_like(largest)))   # max |x| / 127
    err = (fake_quantize_activations(x) - x).abs().reshape(3, 3, 32)
    assert (err <= d[..., None] / 2 + 1e-7 * d[..., None]).all()      # round to nearest, per block
    half = torch.tensor([[127.0, 0.5, 1.5, 2.5] + [0.0] * 28])          # d = 1: exact halves
    assert quantize_activations_int8(half)[0][0, :4].tolist() == [127, 0, 2, 2]   # half to even, as torch.round


def builds():
    """(name, library) for the kernel builds this machine can make: default and portable (no VNNI)."""
    out = []
    for portable in (False, True):
        lib = load_w4a8_kernel(portable=portable)
        if lib is not None:
            out.append(("vnni" if lib.w4a8_has_vnni() else "plain", lib))
    return out


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("shape", [(1536, 576), (64, 100)])     # 100: K padded to the group size
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_both_kernel_builds_match_the_reference(group_size, shape, rows):
    available = builds()
    if not available:
        pytest.skip(f"no C compiler: {w4a8.load_error}")
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=False)
    layer = W4A8Linear.from_linear(linear, group_size=group_size)
    assert layer.use_c_kernel
    x = torch.randn(rows, shape[1])
    padded = F.pad(x, (0, -shape[1] % group_size)).contiguous()
    expected = F.linear(fake_quantize_activations(padded)[:, :shape[1]], layer.dequantized_weight())
    weight_only = F.linear(x, layer.dequantized_weight())            # int4 with float activations
    tolerance = 2e-6 * shape[1] ** 0.5               # float rounding of the epilogue only
    assert (weight_only - expected).abs().max() > 100 * tolerance    # the rounding is visible
    for name, lib in available:
        got = w4a8_matmul(padded, layer.panels, layer.scale_panels, layer.minimum_panels, group_size, lib=lib)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=tolerance, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=tolerance)


def test_scales_are_read_as_float16_by_both_builds_subnormals_too():
    """The scales and minimums are stored and read as float16 (0.625 bytes a weight, not 0.75):
    tiny weights give subnormal float16 scales, which the plain C conversion must read exactly too."""
    available = builds()
    if not available:
        pytest.skip(f"no C compiler: {w4a8.load_error}")
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False)
    linear.weight.data[:32] *= 1e-3                      # scales ~1e-6: float16 subnormals
    layer = W4A8Linear.from_linear(linear)
    assert layer.scale.dtype == layer.minimum.dtype == layer.scale_panels.dtype == torch.float16
    assert (layer.scale[:32].abs() < 6.1e-5).all()
    x = torch.randn(3, 256)
    expected = F.linear(fake_quantize_activations(x), layer.dequantized_weight())
    for name, lib in available:
        got = w4a8_matmul(x, layer.panels, layer.scale_panels, layer.minimum_panels, 32, lib=lib)
        torch.testing.assert_close(got[:, :32], expected[:, :32], rtol=1e-5, atol=1e-8, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=4e-5, msg=lambda m: f"{name}: {m}")
    with pytest.raises(ValueError, match="float16 scale and minimum panels|Half"):
        w4a8_matmul(x, layer.panels, layer.scale_panels.float(), layer.minimum_panels.float(), 32)


def test_the_panel_layout_puts_four_inputs_of_a_column_in_one_lane():
    codes = torch.arange(32 * 16, dtype=torch.int64).reshape(32, 16).remainder(16).to(torch.uint8)
    codes[5] = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0], dtype=torch.uint8)
    panels = pack_w4a8_panels(codes)
    assert panels.shape == (1, 2, 32, 4)
    lane = panels[0, 0, 5]                           # column 5, inputs 0..7
    assert [int(b) & 15 for b in lane] == [1, 2, 3, 4] and [int(b) >> 4 for b in lane] == [5, 6, 7, 8]
    assert [int(b) & 15 for b in panels[0, 1, 5]] == [9, 10, 11, 12]


def test_half_precision_takes_the_reference_path():
    torch.manual_seed(0)
    linear = nn.Linear(576, 192, bias=True)
    layer = W4A8Linear.from_linear(linear)
    x = torch.randn(3, 576).bfloat16()
    expected = F.linear(fake_quantize_activations(x.float()), layer.dequantized_weight(), linear.bias.detach())
    assert layer(x).dtype == torch.bfloat16
    torch.testing.assert_close(layer(x).float(), expected.bfloat16().float(), rtol=1e-2, atol=1e-2)


def test_a_row_gives_the_same_bits_whatever_shares_its_call():
    """Batch invariance: the kernel runs at every number of rows (w4a8.py says why), and each
    row's arithmetic does not depend on the others: 1, 64 or 130 rows, identical bits."""
    if load_w4a8_kernel() is None:
        pytest.skip(f"no C compiler: {w4a8.load_error}")
    torch.manual_seed(0)
    layer = W4A8Linear.from_linear(nn.Linear(576, 192, bias=True))
    x = torch.randn(130, 576)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(130)])
    assert torch.equal(layer(x), alone) and torch.equal(layer(x[:64]), alone[:64])


def test_w4a8_is_a_registered_int4_backend():
    assert LINEAR_BACKENDS["w4a8"] is W4A8Linear and issubclass(W4A8Linear, Int4Linear)
    torch.manual_seed(0)
    linear = nn.Linear(576, 64)
    assert torch.equal(W4A8Linear.from_linear(linear).dequantized_weight(),
                       Int4Linear.from_linear(linear).dequantized_weight())     # same weights as int4


def test_nan_and_inf_in_a_row_come_out_as_nan_in_that_row_only():
    """A float layer turns a NaN input into NaN outputs; rounding must not hide it as finite
    garbage (fmaxf skips NaN, and NaN -> int8 is undefined in C)."""
    torch.manual_seed(0)
    layer = W4A8Linear.from_linear(nn.Linear(576, 64, bias=False))
    x = torch.randn(3, 576)
    x[0, 40], x[1, 300] = float("nan"), float("inf")
    expected = F.linear(fake_quantize_activations(x), layer.dequantized_weight())
    assert expected[:2].isnan().all() and expected[2].isfinite().all()
    for name, lib in builds():
        got = w4a8_matmul(x, layer.panels, layer.scale_panels, layer.minimum_panels, 32, lib=lib)
        assert got[:2].isnan().all(), name
        torch.testing.assert_close(got[2], expected[2], rtol=1e-5, atol=1e-4)


def test_the_op_refuses_what_the_kernel_cannot_read():
    layer = W4A8Linear.from_linear(nn.Linear(64, 32, bias=False))
    for x, group in ((torch.randn(2, 64).double(), 32), (torch.randn(2, 64), 16), (torch.randn(2, 48), 32)):
        with pytest.raises(ValueError, match="w4a8_linear takes float32"):
            w4a8_matmul(x, layer.panels, layer.scale_panels, layer.minimum_panels, group)
    strided = torch.randn(1, 64).expand(3, 64)                   # not contiguous: copied, not misread
    torch.testing.assert_close(w4a8_matmul(strided, layer.panels, layer.scale_panels, layer.minimum_panels, 32),
                               layer(strided[:1].contiguous()).expand(3, 32))
