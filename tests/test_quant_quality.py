"""Quality bounds for the quantized embedded model, and broken quantizers that must fail them.

The figures are computed once per module on a shorter text than `python -m minillm.quant.quality`
(its first TEXT_TOKENS tokens, fewer greedy tokens), so the bounds leave room over the measured
values (quality.py's docstring) but sit far below what each broken variant scores.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm.quant import LINEAR_BACKENDS, register_linear_backend
from minillm.quant.quality import CHAT_PROMPTS, TEXT, measure
from minillm.quant.reference import quantize_int4

TEXT_TOKENS = 600
# The embedded checkpoint is a GGUF in Q4_1: blocks of 32 weights, each with a scale and a
# minimum, i.e. exactly int4-g32's asymmetric grid. Re-quantizing it with group 32 must give the
# same weights back (KL 0): a bound that any mistake in grouping, rounding or the zero point fails.
BOUNDS = {  # scheme: (max mean KL, max perplexity increase, min greedy agreement)
    "int8": (0.01, 0.2, 0.6),          # measured on these 600 tokens: KL 0.0032, ppl -0.08
    "int4-g32": (1e-4, 0.01, 0.9),     # measured: KL 0.0, ppl delta 0.0
    "w4a8-g32": (0.01, 0.3, 0.5),      # int4-g32 (exact) + int8 activations: KL 0.0021, ppl +0.107, 0.67
}


def int8_per_column(w):
    """int8 with the scale taken over the wrong axis: per input column instead of per output row."""
    scale = w.abs().amax(dim=0, keepdim=True) / 127                       # [1, K]: the wrong axis
    return torch.round(w / scale).clamp(-127, 127) * scale


def int4_without_zero_point(w, group_size=32):
    """Asymmetric codes dequantized as if symmetric around the middle code: the minimum is lost."""
    q, scale, minimum = quantize_int4(w, group_size)
    groups = q.float().reshape(w.shape[0], -1, group_size)
    return ((groups - 8) * scale[..., None]).reshape(w.shape)


def int4_off_by_one_group(w, group_size=32):
    """Each weight dequantized with the scale and minimum of the group one position earlier."""
    q, scale, minimum = quantize_int4(w, group_size)
    per_weight = lambda t: torch.roll(t.repeat_interleave(group_size, dim=1), 1, dims=1)   # noqa: E731
    return per_weight(minimum) + q.float() * per_weight(scale)


def broken_backend(name, make_weight):
    class Broken(nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.register_buffer("w", make_weight(linear.weight.detach().float()))
            self.bias = linear.bias

        @classmethod
        def from_linear(cls, linear):
            return cls(linear)

        def forward(self, x):
            return F.linear(x, self.w, self.bias)
    Broken.name = name
    return Broken


BROKEN = {"broken-scale-axis": int8_per_column, "broken-no-zero-point": int4_without_zero_point,
          "broken-off-by-one-group": int4_off_by_one_group}
BREAKS = {"broken-scale-axis": "int8", "broken-no-zero-point": "int4-g32", "broken-off-by-one-group": "int4-g32"}


@pytest.fixture(scope="module")
def quality(smol):
    model, tokenizer, _ = smol
    text = tokenizer.decode(tokenizer.encode(TEXT)[:TEXT_TOKENS])
    for name, fn in BROKEN.items():
        register_linear_backend(broken_backend(name, fn))
    try:
        # the head stays float here: int4-g32's layers alone must give the weights back exactly
        good = measure(model, tokenizer, {"int8": ("int8", {}), "int4-g32": ("int4", {"group_size": 32}),
                                          "w4a8-g32": ("w4a8", {"group_size": 32})},
                       text=text, prompts=CHAT_PROMPTS[:3], max_tokens=12, include_head=False)
        broken = measure(model, tokenizer, {name: (name, {}) for name in BROKEN}, text=text, prompts=(),
                         include_head=False)
    finally:
        for name in BROKEN:
            LINEAR_BACKENDS.pop(name)
    return good, broken


def within(result, bounds):
    kl, ppl_delta, agreement = bounds
    return (result["kl"] <= kl and result["ppl_delta"] <= ppl_delta
            and (result["greedy_agreement"] is None or result["greedy_agreement"] >= agreement))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", list(BOUNDS))
def test_quantized_model_stays_close_to_float32(quality, scheme):
    result = quality[0][scheme]
    assert within(result, BOUNDS[scheme]), result


@pytest.mark.slow
@pytest.mark.parametrize("broken", list(BROKEN))
def test_broken_quantizers_fail_the_same_bounds(quality, broken):
    result = quality[1][broken]
    assert not within(result, BOUNDS[BREAKS[broken]]), (broken, result)     # the bound of the scheme it breaks
