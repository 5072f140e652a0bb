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
    assert checks.check_rope(apply_rope) is True
    assert "✅ check_rope passed" in capsys.readouterr().out


def test_check_rope_accepts_the_pairwise_formula():
    def pairwise(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos.chunk(2, dim=-1)[0], sin.chunk(2, dim=-1)[0]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    assert checks.check_rope(pairwise) is True


@pytest.mark.parametrize("bad, match", [
    (rope_halves_not_negated, "minus sign"),
    (rope_sin_cos_swapped, "swaps cos and sin"),
    (rope_off_by_one_position, "position 0"),
    (rope_adjacent_pairs, "adjacent pairs"),
    (rope_in_place, "in place"),
], ids=["halves_not_negated", "sin_cos_swapped", "off_by_one_position", "adjacent_pairs", "in_place"])
def test_check_rope_rejects(bad, match):
    rejects(checks.check_rope, bad, match)
