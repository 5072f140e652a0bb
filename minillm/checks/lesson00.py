"""Lesson 00's grader, `check_rope`: the learner's `apply_rope` against the reference on
queries and keys at real positions of the tiny Llama. A wrong rotation still yields
plausible text, only worse, so when the output matches a classic mistake (the sign of the
rotated half, cos and sin swapped, adjacent pairs instead of halves, a float32 result for
half-precision x, arithmetic in half precision) the hint names it.
"""
from __future__ import annotations

import torch

from .harness import Grader, expect, expect_tensor, expect_unchanged, grader


def _rope_variants(x, cos, sin):
    """Outputs of the classic RoPE mistakes, to name the one a learner made."""
    x1, x2 = x.chunk(2, dim=-1)
    half = torch.cat([-x2, x1], dim=-1)
    c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
    ev, od = x[..., 0::2], x[..., 1::2]
    interleaved = torch.stack([ev * c - od * s, od * c + ev * s], dim=-1).flatten(-2)
    return {
        "rotates the wrong way: the rotated half must be cat([-x2, x1]), not cat([x2, -x1])":
            x * cos - half * sin,
        "forgets the minus sign: the rotated half must be cat([-x2, x1]), not cat([x2, x1])":
            x * cos + torch.cat([x2, x1], dim=-1) * sin,
        "swaps cos and sin: out = x * cos + rotate_half(x) * sin":
            x * sin + half * cos,
        "rotates adjacent pairs (2i, 2i+1); this Llama layout pairs dimension i with i + D/2 "
        "(split the last dimension into two halves)":
            interleaved,
    }


@grader
def check_rope(fn) -> bool:
    """fn(x [N, heads, D], cos, sin) -> x rotated, like `models.llama.apply_rope`.

    Compares with the reference on random queries and keys at real positions from 0
    to 4095 (cos/sin from the tiny-llama `RotaryEmbedding`), and checks that the
    output keeps x's shape and dtype and that x itself is left untouched; then on
    float16 and bfloat16 queries (a half-precision model: cos and sin stay float32),
    where the result must come back in x's dtype, computed in float32.
    """
    from ..models.llama import RotaryEmbedding, apply_rope
    from ..models.tiny import TINY_CONFIGS

    g = Grader("check_rope", "apply_rope")
    cfg = TINY_CONFIGS["tiny-llama"]
    positions = torch.tensor([0, 1, 2, 3, 10, 57, 255, 1000, 1023, 1500, 2048, 4095])
    cos, sin = RotaryEmbedding(cfg)(positions)
    gen = torch.Generator().manual_seed(0)
    for heads, name in ((cfg.num_attention_heads, "queries"), (cfg.num_key_value_heads, "keys")):
        x = torch.randn(len(positions), heads, cfg.head_dim, generator=gen)
        before = x.clone()
        with g.case(f"rotating {name} of shape {list(x.shape)}"):
            out = fn(x, cos, sin)
        expect_unchanged(before, x, "apply_rope")
        expect_tensor(out, x.shape, "apply_rope")
        expect(out.dtype == x.dtype, f"apply_rope should keep x's dtype {x.dtype}, returned {out.dtype}")
        expected = apply_rope(x, cos, sin)
        if torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
            continue
        for mistake, wrong in _rope_variants(x, cos, sin).items():
            if torch.allclose(out, wrong, atol=1e-5, rtol=1e-4):
                raise AssertionError(f"apply_rope {mistake}")
        expect(torch.allclose(out[0], x[0], atol=1e-5),
               "apply_rope changed a token at position 0, where cos = 1 and sin = 0 so the rotation "
               "is the identity: out = x * cos + rotate_half(x) * sin")
        err = (out - expected).abs().amax(dim=(1, 2))
        worst = int(err.argmax())
        raise AssertionError(
            f"apply_rope differs from the reference by up to {float(err[worst]):.3g} "
            f"(worst at position {int(positions[worst])}, rotating {name}). Expected "
            "out = x * cos + rotate_half(x) * sin, where rotate_half(x) = cat([-x2, x1]) "
            "and x1, x2 are the first and second halves of the last dimension")
    for dtype in (torch.float16, torch.bfloat16):
        _check_half(g, fn, torch.randn(len(positions), cfg.num_attention_heads, cfg.head_dim, generator=gen)
                    .to(dtype), cos, sin)
    return g.passed()


def _check_half(g, fn, x, cos, sin) -> None:
    """A half-precision model: x is float16 or bfloat16, cos and sin float32. The rotation is
    done in float32 and the result cast back to x's dtype, as the reference does."""
    from ..models.llama import apply_rope

    name = str(x.dtype).removeprefix("torch.")
    before = x.clone()
    with g.case(f"rotating {name} queries of shape {list(x.shape)} (cos and sin float32)"):
        out = fn(x, cos, sin)
    expect_unchanged(before, x, "apply_rope")
    expect_tensor(out, x.shape, "apply_rope")
    expect(out.dtype == x.dtype,
           f"apply_rope returned {out.dtype} for {name} x: a half-precision model's next layer and KV cache "
           f"expect {name}. Do the arithmetic in float32 (cos and sin are float32), then cast the result "
           "back with .to(x.dtype)")
    expected = apply_rope(x, cos, sin).float()
    differ = (out.float() != expected)
    close = torch.allclose(out.float(), expected, atol=1e-2, rtol=1e-2)
    expect(not close or float(differ.float().mean()) <= 0.02,
           f"apply_rope's {name} result differs from the reference in the last bits of "
           f"{float(differ.float().mean()):.0%} of its values: it computes in {name} (cos and sin converted to "
           f"x's dtype, or x multiplied in {name}). Rotate in float32 (x.float(); cos and sin are float32) and "
           "cast only the result back with .to(x.dtype): rounding each product to "
           f"{name} loses precision the model needs")
    expect(close, f"apply_rope on {name} x differs from the reference by up to "
                  f"{float((out.float() - expected).abs().max()):.3g}, though it matches in float32: convert x "
                  "with x.float() before rotating, and cast the result back with .to(x.dtype)")
