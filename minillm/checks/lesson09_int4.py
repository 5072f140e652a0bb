"""Lesson 09's int4 grader: `check_int4_quantizer` (int4 in groups of `group_size`
consecutive inputs, each group with its own scale and minimum), compared with
`minillm.quant.reference` on weights with lopsided groups and a constant group."""
from __future__ import annotations

import torch

from .harness import Grader, expect, expect_unchanged, grader
from .lesson09_int8 import INT4_LEVELS, _close, _codes_match, _first_mismatch, _pair

# ---------------------------------------------------------------- int4, group-wise

def _int4_weight() -> torch.Tensor:
    """[6, 96] in groups of 32: lopsided groups, a constant group, a zero group."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(6, 96, generator=gen) * torch.tensor([1.0, 0.05, 3.0, 1.0, 1.0, 0.5])[:, None]
    w[1, 32:64] = w[1, 32:64].abs() + 0.2            # a group of positive weights only (lopsided)
    w[2, :32] = 0.5                                   # a constant group: its span is 0
    w[3, 64:] = 0.0                                   # an all-zero group
    w[4] = w[4] * torch.linspace(0.1, 2.0, 96)       # groups of growing size along the row
    w[5, 5] = 6.0                                     # one outlier: only its group should pay for it
    return w


def _windows(w, n, g, size):
    """(description, min, max) of column windows near group g of row n: the off-by-one candidates."""
    k = w.shape[1]
    out = []
    for a in (g * size - 1, g * size, g * size + 1):
        for b in ((g + 1) * size - 1, (g + 1) * size, (g + 1) * size + 1):
            if (a, b) != (g * size, (g + 1) * size) and 0 <= a < b <= k:
                out.append((a, b - 1, float(w[n, a:b].min()), float(w[n, a:b].max())))
    return out


def _int4_groups(scale, minimum, w, size, what) -> None:
    n, k = w.shape
    groups = k // size
    for name, t in (("scale", scale), ("minimum", minimum)):
        expect(t.dtype.is_floating_point, f"{what} returned {name} of dtype {t.dtype}: keep it float")
        if groups != n and tuple(t.shape) == (groups, n):
            raise AssertionError(f"{name} has shape [K/G, N] = [{groups}, {n}]: return [N, K/G] = [{n}, {groups}], "
                                 "one value per (row, group) (the packed kernel's transposed layout is Int4Linear's "
                                 "business, not the quantizer's)")
        if t.numel() == n * k // 32 and size != 32:
            raise AssertionError(f"{name} has shape {list(t.shape)} for group_size={size}: that is groups of 32. "
                                 "Use the group_size argument, not a fixed number")
        expect(tuple(t.shape) == (n, groups),
               f"{name} has shape {list(t.shape)}, expected [N, K / group_size] = [{n}, {groups}]: each row is cut "
               "into groups of group_size consecutive inputs (the group axis is the input axis, dim 1 of the "
               "[N, K] weight), with one scale and one minimum per group")
    s, m = scale.detach().float(), minimum.detach().float()
    blocks = w.reshape(n, groups, size)
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)
    span = hi - lo
    bad = s[~torch.isfinite(s) | (s <= 0)]
    expect(bad.numel() == 0,
           "a group whose weights are all equal (row 2's first group is all 0.5, row 3's last all 0) got scale "
           f"{float(bad[0]) if bad.numel() else 0}: then (w - minimum) / scale is 0 / 0 = NaN. "
           "Give a group with max == min a scale of 1 (its codes are all 0, its minimum is its value)")
    if not _close(m, lo):
        strided = w.reshape(n, size, groups).amin(dim=1)
        if _close(m, strided):
            raise AssertionError("minimum holds the minimum of inputs g, g + K/G, g + 2K/G, ...: the wrong group "
                                 "axis. Group g is the group_size consecutive inputs g*G .. g*G+G-1: "
                                 "w.reshape(N, K // G, G) and reduce over the last dim (not reshape(N, G, K // G))")
        if _close(m, -blocks.abs().amax(dim=-1)) or bool((m == 0).all()):
            raise AssertionError("minimum is not each group's own minimum (you have -max|w| or 0): no zero point, "
                                 "a symmetric range. With only 16 codes, a lopsided group (row 1's second group "
                                 "is all positive) would waste half of them. Asymmetric: minimum = the group's "
                                 "min, scale = (max - min) / 15")
        at = _first_mismatch(torch.isclose(m, lo))
        for a, b, wmin, _ in _windows(w, at[0], at[1], size):
            if abs(wmin - float(m[at])) < 1e-6 and abs(wmin - float(lo[at])) > 1e-6:
                raise AssertionError(f"off-by-one group: minimum[{at[0]}, {at[1]}] is the minimum of inputs {a}..{b}, "
                                     f"but group {at[1]} is inputs {at[1] * size}..{(at[1] + 1) * size - 1} "
                                     f"(group_size {size}): group g covers k in [g*G, (g+1)*G)")
        raise AssertionError(f"minimum[{at[0]}, {at[1]}] is {float(m[at]):.5g}, expected the smallest weight of "
                             f"that group (inputs {at[1] * size}..{(at[1] + 1) * size - 1}), {float(lo[at]):.5g}")
    flat = span > 0
    expected = span / INT4_LEVELS
    if _close(s[flat], expected[flat]):
        return
    for candidate, hint in [(span / 16, "(max - min) / 16: 16 codes 0..15 have 15 steps between them, so the "
                                        "group's max lands on code 16, which does not exist (off by one). "
                                        "scale = (max - min) / 15"),
                            (blocks.abs().amax(dim=-1) / 7, "max|w| / 7, a symmetric range: no zero point. The "
                                                            "reference is asymmetric, scale = (max - min) / 15")]:
        if _close(s[flat], candidate[flat]):
            raise AssertionError(f"scale is {hint}")
    at = _first_mismatch(torch.isclose(s, expected, rtol=1e-5) | ~flat)
    for a, b, wmin, wmax in _windows(w, at[0], at[1], size):
        if abs((wmax - wmin) / INT4_LEVELS - float(s[at])) < 1e-6 * max(1.0, float(s[at])):
            raise AssertionError(f"off-by-one group: scale[{at[0]}, {at[1]}] spans inputs {a}..{b}, but group {at[1]} "
                                 f"is inputs {at[1] * size}..{(at[1] + 1) * size - 1} (group_size {size})")
    raise AssertionError(f"scale[{at[0]}, {at[1]}] is {float(s[at]):.5g}, expected (max - min) / 15 = "
                         f"{float(expected[at]):.5g} for that group")


def _int4_codes(q, w, scale, minimum, size, what) -> None:
    n, k = w.shape
    expect(q.dtype == torch.uint8, f"{what} returned q of dtype {q.dtype}: return the codes 0..15 as torch.uint8, "
                                   "one per byte (packing two per byte is the kernel's job)")
    expect(tuple(q.shape) == (n, k), f"q has shape {list(q.shape)}, expected the weight's [{n}, {k}]")
    expect(int(q.max()) <= INT4_LEVELS, f"q holds the code {int(q.max())}: 4 bits hold 0..15; clamp(0, 15)")
    blocks = w.reshape(n, k // size, size)
    exact = ((blocks - minimum.float()[..., None]) / scale.float()[..., None]).reshape(n, k)
    expected = torch.round(exact).clamp(0, INT4_LEVELS)
    ok = _codes_match(q, expected, exact)
    if bool(ok.all()):
        return
    at = _first_mismatch(ok)
    no_zero = torch.round(blocks / scale.float()[..., None]).clamp(0, INT4_LEVELS).reshape(n, k)
    if bool((q.long() == no_zero.long()).all()):
        raise AssertionError("the codes ignore the minimum (no zero point): q = round(w / scale) sends every "
                             "negative weight to code 0. Shift first: q = round((w - minimum) / scale)")
    if bool((q.long() == exact.trunc().clamp(0, INT4_LEVELS).long()).all()):
        raise AssertionError(f"q[{at[0]}, {at[1]}] is {int(q[at])} for (w - minimum) / scale = {float(exact[at]):.3f}: "
                             "rounding by truncation. Round to the nearest: torch.round(...)")
    raise AssertionError(f"q[{at[0]}, {at[1]}] is {int(q[at])}, expected round((w - minimum) / scale) = "
                         f"{int(expected[at])}")


@grader
def check_int4_quantizer(quantize, dequantize) -> bool:
    """quantize(weight [N, K] float, group_size) -> (q uint8 [N, K] in 0..15, scale [N, K/G],
    minimum [N, K/G]) and dequantize(q, scale, minimum, group_size) -> float32 [N, K], like
    `quant.reference.quantize_int4` / `dequantize_int4`: asymmetric, each group of group_size
    consecutive inputs of a row spans its own [min, max] with 15 steps.

    On a [6, 96] weight in groups of 32 (then of 8: group_size is an argument) with lopsided,
    constant and all-zero groups and an outlier: the group axis and boundaries, the minimum
    (a zero point), scale = (max - min) / 15 (positive for a constant group), codes rounded
    to nearest in 0..15, dequantize on the reference's codes, and the round trip within half
    a step of every weight.
    """
    from ..quant.reference import dequantize_int4 as reference_dequantize
    from ..quant.reference import quantize_int4 as reference_quantize
    g = Grader("check_int4_quantizer", "your quantize_int4 / dequantize_int4")
    w = _int4_weight()
    n, k = w.shape
    for size in (32, 8):
        before = w.clone()
        with g.case(f"calling quantize_int4(weight [{n}, {k}], group_size={size})"):
            out = quantize(w, size)
        expect_unchanged(before, w, "quantize_int4")
        q, scale, minimum = _pair(out, "quantize_int4", 3)
        _int4_groups(scale, minimum, w, size, "quantize_int4")
        _int4_codes(q, w, scale, minimum, size, "quantize_int4")

        ref = reference_quantize(w, size)
        with g.case(f"calling dequantize_int4(q [{n}, {k}], scale [{n}, {k // size}], minimum [{n}, {k // size}], "
                    f"group_size={size})"):
            back = dequantize(*ref, size)
        expect(isinstance(back, torch.Tensor) and tuple(back.shape) == (n, k),
               f"dequantize_int4 should return a [{n}, {k}] tensor, got "
               + (f"shape {list(back.shape)}" if isinstance(back, torch.Tensor) else type(back).__name__))
        expect(back.dtype == torch.float32, f"dequantize_int4 returned dtype {back.dtype}: return float32")
        expected = reference_dequantize(*ref, size)
        if not _close(back, expected):
            codes, s, m = ref
            groups = codes.float().reshape(n, k // size, size)
            if _close(back, (groups * s[..., None]).reshape(n, k)):
                raise AssertionError("dequantize_int4 forgets the minimum: w = minimum + q * scale (q = 0 is the "
                                     "group's smallest weight, not 0)")
            strided = codes.float().reshape(n, size, k // size) * s[:, None, :] + m[:, None, :]
            if _close(back, strided.reshape(n, k)):
                raise AssertionError("dequantize_int4 applies group g's scale to inputs g, g + K/G, ...: the wrong "
                                     "group axis. Reshape q to [N, K // G, G] and broadcast scale[..., None]")
            at = _first_mismatch(torch.isclose(back, expected))
            raise AssertionError(f"dequantize_int4 gives {float(back[at]):+.5f} at {list(at)}, expected minimum + "
                                 f"q * scale = {float(expected[at]):+.5f}")

        with g.case(f"quantizing then dequantizing the same weight (group_size={size})"):
            round_trip = dequantize(*quantize(w, size), size)
        expect(not bool(torch.isnan(round_trip).any()), "the round trip has NaN: a constant group needs a nonzero "
                                                        "scale")
        expect(bool((round_trip[3, 64:] == 0).all()) and bool((round_trip[2, :32] == 0.5).all()),
               "a constant group (all 0.5, or all 0) must come back exactly: its minimum is its value, its codes 0")
        half_step = (ref[1] / 2).repeat_interleave(size, dim=1) * (1 + 1e-4) + 1e-7
        error = (round_trip - w).abs()
        expect(bool((error <= half_step).all()), "after the round trip, some weight is off by more than half a "
                                                 f"step (scale / 2): max error {float(error.max()):.4g}")
    return g.passed()
