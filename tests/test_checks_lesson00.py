"""Tests of the grader of lesson 00 (minillm.checks.lesson00).

The reference passes it, an independent correct piece passes, and planted mistakes —
the ones learners actually make — are rejected with a hint that names the problem.
Addressable per lesson task: `pytest -k check_rope`.
"""
import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.models.llama import apply_rope


# ---------------------------------------------------------------- lesson 00: RoPE

def rope_halves_not_negated(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([x2, x1], dim=-1) * sin


def rope_sin_cos_swapped(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * sin + torch.cat([-x2, x1], dim=-1) * cos


def rope_off_by_one_position(x, cos, sin):
    return apply_rope(x, cos.roll(-1, dims=0), sin.roll(-1, dims=0))


def rope_adjacent_pairs(x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    ev, od = x[..., 0::2], x[..., 1::2]
    return torch.stack([ev * c - od * s, od * c + ev * s], dim=-1).flatten(-2)


def rope_in_place(x, cos, sin):
    x.copy_(apply_rope(x, cos, sin))
    return x


def test_check_rope_passes_reference(capsys):
    assert checks.check_rope(apply_rope)
    assert "✅ check_rope passed" in capsys.readouterr().out


def test_check_rope_accepts_the_pairwise_formula():
    def pairwise(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos.chunk(2, dim=-1)[0], sin.chunk(2, dim=-1)[0]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)   # float32 math (promotion), x.dtype out
    assert checks.check_rope(pairwise)


@pytest.mark.parametrize("bad, match", [
    (rope_halves_not_negated, "minus sign"),
    (rope_sin_cos_swapped, "swaps cos and sin"),
    (rope_off_by_one_position, "position 0"),
    (rope_adjacent_pairs, "adjacent pairs"),
    (rope_in_place, "in place"),
], ids=["halves_not_negated", "sin_cos_swapped", "off_by_one_position", "adjacent_pairs", "in_place"])
def test_check_rope_rejects(bad, match):
    rejects(checks.check_rope, bad, match)


# half precision: the lesson asks for the rotation in float32 and the result in x's dtype

def rope_float32_result(x, cos, sin):
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return xf * cos + torch.cat([-x2, x1], dim=-1) * sin            # no .to(x.dtype)


def rope_in_half_precision(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


def test_check_rope_accepts_float32_arithmetic_by_type_promotion_and_by_complex_numbers():
    def promoted(x, cos, sin):                 # half * float32 computes in float32
        x1, x2 = x.chunk(2, dim=-1)
        return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)

    def complex_rotation(x, cos, sin):
        half = x.shape[-1] // 2
        xf = x.float()
        z = torch.complex(xf[..., :half], xf[..., half:]) * torch.complex(cos[..., :half], sin[..., :half])
        return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)
    assert checks.check_rope(promoted)
    assert checks.check_rope(complex_rotation)


@pytest.mark.parametrize("bad, match", [
    (rope_float32_result, r"returned torch\.float32 for float16 x.*\.to\(x\.dtype\)"),
    (rope_in_half_precision, r"computes in float16.*Rotate in float32"),
], ids=["float32_result_for_half_x", "arithmetic_in_half"])
def test_check_rope_rejects_half_precision_mistakes(bad, match):
    rejects(checks.check_rope, bad, match)
