"""Tests of the graders of lesson 09 (minillm.checks.lesson09_int8, lesson09_int4): the reference quantizers pass,
and planted mistakes — the ones learners actually make — are rejected with a hint that names
the problem. Addressable per exercise: `pytest -k check_int8_quantizer`, `-k check_int4_quantizer`.
"""
import pytest
import torch

from minillm import checks
from minillm.quant.reference import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8


def rejects(check, quantize, dequantize, match):
    with pytest.raises(AssertionError, match=match):
        check(quantize, dequantize)


# ---------------------------------------------------------------- int8, per output channel

def int8_with(scale_of, rounding=torch.round, low=-127, high=127, dtype=torch.int8, zero_row_scale=True):
    """A quantize_int8 built from parts, so each test plants exactly one mistake."""
    def quantize(weight):
        w = weight.detach().float()
        scale = scale_of(w)
        if zero_row_scale:
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = rounding(w / (scale[:, None] if scale.dim() == 1 and scale.numel() == w.shape[0] else scale))
        if low is not None:
            codes = codes.clamp(low, high)
        return codes.to(dtype), scale
    return quantize


def max_abs(w):
    return w.abs().amax(dim=1) / 127


def test_check_int8_quantizer_accepts_the_reference():
    assert checks.check_int8_quantizer(quantize_int8, dequantize_int8)


def test_the_parts_rebuild_the_reference():
    """The planted mistakes below differ from the reference in one part only."""
    assert checks.check_int8_quantizer(int8_with(max_abs), dequantize_int8)


def int8_per_column(weight):
    w = weight.detach().float()
    scale = w.abs().amax(dim=0) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def int8_per_tensor(weight):
    w = weight.detach().float()
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def int8_per_tensor_expanded(weight):
    w = weight.detach().float()
    scale = (w.abs().max() / 127).expand(w.shape[0]).clone()
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def int8_keepdim(weight):
    w = weight.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def int8_zero_scale(weight):
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def dequantize_wrong_axis(q, scale):
    return q.float() * scale.float()


def dequantize_divides(q, scale):
    return q.float() / scale.float()[:, None]


def dequantize_keeps_int8(q, scale):
    return (q.float() * scale.float()[:, None]).to(torch.int8)


@pytest.mark.parametrize("quantize, dequantize, match", [
    (int8_per_column, dequantize_int8, "one value per input column: the scale goes over the wrong axis"),
    (int8_per_tensor, dequantize_int8, "per-tensor"),
    (int8_per_tensor_expanded, dequantize_int8, "per-tensor"),
    (int8_keepdim, dequantize_int8, "return it as \\[N\\]"),
    (int8_with(lambda w: w.abs().mean(dim=1) / 127), dequantize_int8, "the mean of \\|w\\|"),
    (int8_with(lambda w: w.amax(dim=1) / 127), dequantize_int8, "max of w, not of \\|w\\|"),
    (int8_with(max_abs, rounding=torch.trunc), dequantize_int8, "rounding by truncation"),
    (int8_with(max_abs, rounding=lambda x: x), dequantize_int8, "rounding by truncation"),     # .to(int8) truncates
    (int8_with(max_abs, rounding=torch.floor), dequantize_int8, "rounding down"),
    (int8_with(lambda w: w.abs().amax(dim=1) / 128, low=None), dequantize_int8, "wraps around to -128"),
    (int8_with(lambda w: w.abs().amax(dim=1) / 128, low=-128), dequantize_int8, "leaves out"),
    (int8_with(lambda w: (w.amax(dim=1) - w.amin(dim=1)) / 255), dequantize_int8, "asymmetric"),
    (int8_with(max_abs, dtype=torch.float32), dequantize_int8, "store the codes as torch.int8"),
    (int8_with(max_abs, dtype=torch.uint8), dequantize_int8, "uint8 cannot hold negative codes"),
    (int8_zero_scale, dequantize_int8, "all-zero row 3 got scale 0.0"),
    (quantize_int8, dequantize_wrong_axis, "broadcast it over the columns with scale\\[:, None\\]"),
    (quantize_int8, dequantize_divides, "dequantizing multiplies"),
    (quantize_int8, dequantize_keeps_int8, "return float32"),
], ids=["per-column", "per-tensor", "per-tensor-expanded", "keepdim", "mean", "max-not-abs", "trunc",
        "cast-truncates", "floor", "no-clamp-wraps", "clamp-128", "asymmetric", "float-codes", "uint8-codes",
        "zero-row-nan", "dequantize-wrong-axis", "dequantize-divides", "dequantize-int8"])
def test_check_int8_quantizer_rejects(quantize, dequantize, match):
    rejects(checks.check_int8_quantizer, quantize, dequantize, match)


def test_check_int8_quantizer_names_a_stub_as_not_implemented():
    def stub(weight):
        raise NotImplementedError("YOUR CODE HERE")
    rejects(checks.check_int8_quantizer, stub, dequantize_int8, "not implemented yet")


# ---------------------------------------------------------------- int4, group-wise

def int4_with(levels=15, group_axis="inputs", offset=(0, 0), zero_point=True, flat_scale=True,
              symmetric=False, layout="rows", dtype=torch.uint8, fixed_group=None):
    """A quantize_int4 built from parts, so each test plants exactly one mistake."""
    def quantize(weight, group_size):
        size = fixed_group or group_size
        w = weight.detach().float()
        n, k = w.shape
        if group_axis == "strided":
            groups = w.reshape(n, size, k // size).transpose(1, 2)            # group g = inputs g, g + K/G, ...
        else:
            groups = w.reshape(n, k // size, size)
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
        if offset != (0, 0):                                                 # windows one input too wide/narrow
            lo, hi = lo.clone(), hi.clone()
            for g in range(k // size):
                a, b = max(0, g * size + offset[0]), min(k, (g + 1) * size + offset[1])
                lo[:, g], hi[:, g] = w[:, a:b].amin(dim=1), w[:, a:b].amax(dim=1)
        if symmetric:
            lo, hi = -groups.abs().amax(dim=-1), groups.abs().amax(dim=-1)
        span = hi - lo
        scale = span / levels
        if flat_scale:
            scale = torch.where(span > 0, scale, torch.ones_like(span))
        shifted = groups - lo[..., None] if zero_point else groups
        codes = torch.round(shifted / scale[..., None]).clamp(0, 15)
        if group_axis == "strided":
            codes = codes.transpose(1, 2)
        codes = codes.reshape(n, k).to(dtype)
        if layout == "transposed":
            return codes, scale.t().contiguous(), lo.t().contiguous()
        return codes, scale, lo
    return quantize


def dequantize_no_minimum(q, scale, minimum, group_size):
    n, k = q.shape
    return (q.float().reshape(n, k // group_size, group_size) * scale[..., None]).reshape(n, k)


def dequantize_strided(q, scale, minimum, group_size):
    n, k = q.shape
    groups = q.float().reshape(n, group_size, k // group_size)
    return (groups * scale[:, None, :] + minimum[:, None, :]).reshape(n, k)


def test_check_int4_quantizer_accepts_the_reference():
    assert checks.check_int4_quantizer(quantize_int4, dequantize_int4)
    assert checks.check_int4_quantizer(int4_with(), dequantize_int4)       # the parts rebuild the reference


@pytest.mark.parametrize("quantize, dequantize, match", [
    (int4_with(levels=16), dequantize_int4, "off by one"),
    (int4_with(offset=(0, 1)), dequantize_int4, "off-by-one group"),
    (int4_with(offset=(1, 0)), dequantize_int4, "off-by-one group"),
    (int4_with(offset=(0, -1)), dequantize_int4, "off-by-one group"),
    (int4_with(zero_point=False), dequantize_int4, "no zero point"),
    (int4_with(symmetric=True), dequantize_int4, "no zero point"),
    (int4_with(group_axis="strided"), dequantize_int4, "wrong group axis"),
    (int4_with(layout="transposed"), dequantize_int4, "shape \\[K/G, N\\]"),
    (int4_with(fixed_group=32), dequantize_int4, "Use the group_size argument"),
    (int4_with(flat_scale=False), dequantize_int4, "constant group|all equal"),
    (int4_with(dtype=torch.float32), dequantize_int4, "torch.uint8"),
    (quantize_int4, dequantize_no_minimum, "forgets the minimum"),
    (quantize_int4, dequantize_strided, "wrong group axis"),
], ids=["levels-16", "group-one-too-wide", "group-starts-late", "group-one-too-short", "no-zero-point",
        "symmetric", "strided-groups", "transposed-layout", "fixed-group-32", "flat-group-nan", "float-codes",
        "dequantize-no-minimum", "dequantize-strided"])
def test_check_int4_quantizer_rejects(quantize, dequantize, match):
    rejects(checks.check_int4_quantizer, quantize, dequantize, match)
