"""Lesson 09's int8 grader, `check_int8_quantizer` (one symmetric scale per output channel),
and the comparisons both lesson 09 graders share (`lesson09_int4.py` has the int4 one).

Both compare your quantize / dequantize pair with `minillm.quant.reference` on small weights
built to expose the usual mistakes: rows of very different sizes (a shared scale fails them),
a row whose largest magnitude is negative, an all-zero row or constant group (a zero scale
turns into NaN), lopsided groups (a symmetric range wastes their codes). A quantizer that is
wrong rarely crashes: it returns codes that dequantize to a slightly different model, so the
checks compare values, not just shapes.
"""
from __future__ import annotations

import torch

from .harness import Grader, expect, expect_unchanged, grader

INT8_MAX = 127
INT4_LEVELS = 15


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-8)


def _codes_match(q: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Where the codes agree, a rounding tie (x.5, rounded up or to even) counting as agreement."""
    tie = (exact - exact.floor() - 0.5).abs() < 1e-4
    return (q.long() == expected.long()) | (tie & ((q.long() - expected.long()).abs() <= 1))


def _first_mismatch(ok: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in (~ok).nonzero()[0])


def _pair(out, what: str, n: int) -> tuple:
    expect(isinstance(out, tuple) and len(out) == n and all(isinstance(t, torch.Tensor) for t in out),
           f"{what} should return a tuple of {n} tensors, got {type(out).__name__}"
           + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    return out


# ---------------------------------------------------------------- int8, per output channel

def _int8_weight() -> torch.Tensor:
    """[6, 40]: rows of very different sizes, a zero row, a row whose extreme is negative."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(6, 40, generator=g) * torch.tensor([1.0, 0.02, 5.0, 1.0, 0.3, 1.0])[:, None]
    w[3] = 0.0                                        # an all-zero row (pruned, or never trained)
    w[4, 7] = -4.0                                    # the largest |w| of row 4 is negative
    w[5] = w[5].abs() + 0.5                           # a row of positive weights only
    return w


def _int8_scale(scale, w, what) -> None:
    n, k = w.shape
    largest = w.abs().amax(dim=1)
    expect(scale.dtype.is_floating_point, f"{what} returned a scale of dtype {scale.dtype}: a scale is a "
                                          "fraction (max|w| / 127), keep it float")
    expect(scale.numel() != 1, f"scale has a single value for the whole [{n}, {k}] weight: that is per-tensor "
                               "quantization. One scale per output channel (row): w.abs().amax(dim=1) / 127 "
                               "gives shape [N], so a row of small weights keeps its precision")
    expect(tuple(scale.shape) != (k,), f"scale has shape [{k}], one value per input column: the scale goes over "
                                       f"the wrong axis. One per output channel (row) of the [N, K] = [{n}, {k}] "
                                       "weight: reduce over dim=1 (w.abs().amax(dim=1)), shape [N]")
    expect(tuple(scale.shape) != (n, 1), f"scale has shape [{n}, 1]: return it as [N] = [{n}] (one per row; "
                                         "amax(dim=1) without keepdim), dequantize broadcasts it with scale[:, None]")
    expect(tuple(scale.shape) == (n,), f"scale has shape {list(scale.shape)}, expected [N] = [{n}]: one scale "
                                       "per output channel (row) of the [N, K] weight")
    s = scale.detach().float()
    expect(bool(torch.isfinite(s[3])) and float(s[3]) > 0,
           f"the all-zero row 3 got scale {float(s[3])}: then w / scale is 0 / 0 = NaN. Give a row whose "
           "max|w| is 0 a scale of 1 (any positive number: its codes are all 0 anyway), e.g. "
           "torch.where(largest > 0, largest / 127, torch.ones_like(largest))")
    nonzero = largest > 0
    expected = largest / INT8_MAX
    if _close(s[nonzero], expected[nonzero]):
        return
    candidates = [
        (w.amax(dim=1) / INT8_MAX, "computed from the max of w, not of |w|: row 4's largest magnitude is a negative weight "
                                   "(-4.0), which w.amax misses. Use w.abs().amax(dim=1) / 127"),
        (w.abs().mean(dim=1) / INT8_MAX, "computed from the mean of |w|: then most weights fall outside [-127, 127] and are "
                                         "clipped. The scale comes from the largest |w| of the row, "
                                         "w.abs().amax(dim=1) / 127, so that no weight is clipped"),
        (largest / 128, "max|w| / 128, not / 127: the row's largest weight becomes 128, which int8 cannot hold (it wraps "
                        "around to -128 without a clamp, or needs the code -128, which the symmetric range "
                        "[-127, 127] leaves out). Divide by 127"),
        (largest / 255, "max|w| / 255: that spreads 256 codes over [-max, max] but int8 holds -128..127, so the "
                        "codes overflow. Symmetric int8 maps max|w| to 127: divide by 127"),
        (w.abs().amax(dim=0).max().expand(n) / INT8_MAX, "one value for every row (the largest |w| of the "
                                                         "whole tensor): that is per-tensor. Reduce over "
                                                         "dim=1 only"),
        ((w.amax(dim=1) - w.amin(dim=1)) / 255, "(max - min) / 255: that is asymmetric quantization (it needs a "
                                                "zero point). The spec is symmetric: scale = max|w| / 127"),
    ]
    for candidate, hint in candidates:
        if _close(s[nonzero], candidate[nonzero]):
            raise AssertionError(f"scale is {hint}")
    i = int((~torch.isclose(s, expected, rtol=1e-5)).logical_and(nonzero).nonzero()[0])
    raise AssertionError(f"scale[{i}] is {float(s[i]):.6g}, expected max|w[{i}]| / 127 = {float(expected[i]):.6g}: "
                         "the row's largest magnitude must map to the largest code, 127")


def _int8_codes(q, w, scale, what) -> None:
    n, k = w.shape
    expect(q.dtype == torch.int8,
           f"{what} returned q of dtype {q.dtype}: store the codes as torch.int8 (1 byte per weight, "
           "the whole point) with .to(torch.int8) after rounding and clamping"
           + (": uint8 cannot hold negative codes" if q.dtype == torch.uint8 else ""))
    expect(tuple(q.shape) == (n, k), f"q has shape {list(q.shape)}, expected the weight's [{n}, {k}]")
    exact = w / scale.detach().float()[:, None]
    expected = torch.round(exact).clamp(-INT8_MAX, INT8_MAX)
    if int(q.min()) == -128:
        at = _first_mismatch(q != -128)
        raise AssertionError(
            f"q[{at[0]}, {at[1]}] is -128 (the weight there is {float(w[at]):+.4f}): the symmetric range is "
            "[-127, 127], so that +x and -x get opposite codes and 0 is exactly 0. "
            + ("A positive weight became -128: 128 overflowed int8 and wrapped around. Clamp to [-127, 127] "
               "before .to(torch.int8)" if float(w[at]) > 0 else "Clamp to [-127, 127], not [-128, 127]"))
    ok = _codes_match(q, expected, exact)
    if bool(ok.all()):
        return
    at = _first_mismatch(ok)
    for other, hint in [(exact.trunc(), "rounding by truncation: .to(torch.int8) (or .int()) cuts toward zero, "
                                        "so 2.9 becomes 2, an error of up to a whole step. Round first: "
                                        "torch.round(w / scale)"),
                        (exact.floor(), "rounding down (floor): 2.9 becomes 2 and -0.1 becomes -1. Round to the "
                                        "nearest: torch.round(w / scale)")]:
        if bool((q.long() == other.clamp(-INT8_MAX, INT8_MAX).long()).all()):
            raise AssertionError(f"q[{at[0]}, {at[1]}] is {int(q[at])} for w / scale = {float(exact[at]):.3f}: "
                                 + hint)
    raise AssertionError(f"q[{at[0]}, {at[1]}] is {int(q[at])}, expected round(w / scale) = {int(expected[at])} "
                         f"(w = {float(w[at]):+.5f}, scale = {float(scale[at[0]]):.6g}): "
                         "q = round(w / scale[:, None]), clamped to [-127, 127]")


@grader
def check_int8_quantizer(quantize, dequantize) -> bool:
    """quantize(weight [N, K] float) -> (q int8 [N, K], scale [N]) and dequantize(q, scale) ->
    float32 [N, K], like `quant.reference.quantize_int8` / `dequantize_int8`: one symmetric scale
    per output channel, max|w[n]| / 127, q = round(w / scale) clamped to [-127, 127].

    On a [6, 40] weight with rows of very different sizes, an all-zero row and a row whose
    largest magnitude is negative: the scale's axis and value (per row, from the max of |w|,
    positive for a zero row), the codes (int8, rounded to nearest, never -128), dequantize on
    the reference's codes, and the round trip within half a step of every weight (zeros stay
    zeros). Then an nn.Linear's weight (a Parameter) as Int8Linear.from_linear passes it.
    """
    from ..quant.reference import dequantize_int8 as reference_dequantize
    from ..quant.reference import quantize_int8 as reference_quantize
    g = Grader("check_int8_quantizer", "your quantize_int8 / dequantize_int8")
    w = _int8_weight()
    n, k = w.shape
    before = w.clone()
    with g.case(f"calling quantize_int8(weight) on a [{n}, {k}] weight"):
        out = quantize(w)
    expect_unchanged(before, w, "quantize_int8")
    q, scale = _pair(out, "quantize_int8", 2)
    _int8_scale(scale, w, "quantize_int8")
    _int8_codes(q, w, scale, "quantize_int8")

    ref_q, ref_scale = reference_quantize(w)
    with g.case(f"calling dequantize_int8(q [{n}, {k}], scale [{n}]) (scale has one value per row: broadcast it "
                "over the columns with scale[:, None])"):
        back = dequantize(ref_q, ref_scale)
    expect(isinstance(back, torch.Tensor), f"dequantize_int8 should return a tensor, got {type(back).__name__}")
    expect(tuple(back.shape) == (n, k), f"dequantize_int8 returned shape {list(back.shape)}, expected [{n}, {k}]")
    expect(back.dtype == torch.float32, f"dequantize_int8 returned dtype {back.dtype}: return float32 "
                                        "(q.float() * scale[:, None]), the weight the matmul multiplies by")
    expected = reference_dequantize(ref_q, ref_scale)
    if not _close(back, expected):
        if _close(back, ref_q.float() / ref_scale[:, None]):
            raise AssertionError("dequantize_int8 divides by the scale: quantizing divided (q = w / scale), so "
                                 "dequantizing multiplies, q * scale[:, None]")
        at = _first_mismatch(torch.isclose(back, expected))
        raise AssertionError(f"dequantize_int8 gives {float(back[at]):+.5f} at {list(at)}, expected "
                             f"q * scale = {int(ref_q[at])} * {float(ref_scale[at[0]]):.6g} = {float(expected[at]):+.5f}")

    with g.case("quantizing then dequantizing the same weight"):
        round_trip = dequantize(*quantize(w))
    expect(not bool(torch.isnan(round_trip).any()),
           "the round trip has NaN: a zero row must dequantize to zeros (give it a nonzero scale)")
    expect(bool((round_trip[3] == 0).all()), f"the all-zero row 3 came back as {round_trip[3, :4].tolist()}...: "
                                             "zeros must stay exactly zero")
    error = (round_trip - w).abs()
    half_step = (ref_scale / 2)[:, None] * (1 + 1e-4)
    expect(bool((error <= half_step).all()), "after the round trip, some weight is off by more than half a step "
                                             f"(scale / 2): max error {float(error.max()):.4g}")

    linear = torch.nn.Linear(96, 32)
    with g.case("quantizing an nn.Linear's weight (an nn.Parameter that requires grad), as from_linear does"), \
            torch.no_grad():
        q2, scale2 = _pair(quantize(linear.weight), "quantize_int8", 2)
        back2 = dequantize(q2, scale2)
    expected_q, expected_scale = reference_quantize(linear.weight)
    expect(_close(scale2.detach(), expected_scale) and bool(_codes_match(
        q2, expected_q, linear.weight.detach() / expected_scale[:, None]).all()),
        "on an nn.Linear(96, 32) weight your codes or scales differ from the reference's")
    expect(_close(back2.detach(), reference_dequantize(expected_q, expected_scale)),
           "on an nn.Linear(96, 32) weight the round trip differs from the reference's")
    g.cases += 1
    return g.passed()


