"""Weight-only quantization in plain torch: the model answer every kernel is tested against.

Why quantize weights: a decode step at small batch reads every weight once, so its time
is bounded by bytes read. float32 is 4 bytes per weight, int8 is 1, int4 is 1/2 (plus
the scales). Activations stay float; only the stored weights shrink.

Two schemes, both "weight-only" (dequantize, then an ordinary float matmul):

  int8, per output channel, symmetric:  w[n, k] ≈ q[n, k] * scale[n],  q in [-127, 127]
      one scale per output row; the row's largest |w| maps to 127.

  int4, group-wise, asymmetric:         w[n, k] ≈ minimum[n, g] + q[n, k] * scale[n, g]
      each row is cut into groups of `group_size` consecutive inputs (g = k // group_size);
      each group spans its own [min, max] with the 16 codes q in [0, 15]. Asymmetric
      because 16 codes are few: a group whose weights are mostly positive would waste half
      of a symmetric range. The packed kernel stores the same thing as (scale, zero) with
      zero = minimum + 8 * scale, the value of the middle code (see int4.py).

A row (int8) or group (int4) of zeros gets scale 1: its codes are all zero-valued either way.

One scheme that rounds the activations too, "w4a8" (w4a8.py): int4 weights as above, and each
row of activations rounded to int8 in blocks of 32 inputs, symmetric (llama.cpp's Q8 blocks):
      x[k] ≈ qx[k] * d[b],  d[b] = max |x| over block b / 127
so a kernel can multiply integers. Its reference is F.linear(fake-quantized x, dequantized W).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

INT8_MAX = 127
INT4_LEVELS = 15         # codes 0..15
FLOAT16_MAX = 65504.0


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (q int8 [N, K], scale [N]), one scale per output channel (row)."""
    w = weight.detach().float()
    largest = w.abs().amax(dim=1)                                   # [N]: one per output channel
    scale = torch.where(largest > 0, largest / INT8_MAX, torch.ones_like(largest))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q [N, K], scale [N]) -> float32 [N, K]."""
    return q.float() * scale.float()[:, None]


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float -> (q uint8 [N, K] in 0..15, scale [N, K/G], minimum [N, K/G]).
    K must be a multiple of group_size (Int4Linear pads the inputs to make it so)."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"in_features={k} is not a multiple of group_size={group_size}")
    groups = weight.detach().float().reshape(n, k // group_size, group_size)   # [N, K/G, G]
    minimum, maximum = groups.amin(dim=-1), groups.amax(dim=-1)               # [N, K/G]
    span = maximum - minimum
    scale = torch.where(span > 0, span / INT4_LEVELS, torch.ones_like(span))
    q = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS)
    return q.to(torch.uint8).reshape(n, k), scale, minimum


def quantize_int4_float16_scales(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    """quantize_int4 with its scale and minimum rounded to float16 values (still float32 tensors)
    BEFORE the codes are chosen, so the codes fit the grid that is stored (int4.py: 2 bytes each,
    not 4). Apart from quantize_int4 so that lesson 09's exercise stays the plain scheme."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"in_features={k} is not a multiple of group_size={group_size}")
    groups = weight.detach().float().reshape(n, k // group_size, group_size)
    if not groups.abs().amax() <= FLOAT16_MAX:                              # NaN fails too
        raise ValueError(f"float16 scales: a weight beyond float16's range (|w| > {FLOAT16_MAX}) or not finite")
    minimum, maximum = groups.amin(dim=-1), groups.amax(dim=-1)             # quantize_int4's grid, not its codes
    span = maximum - minimum
    scale = torch.where(span > 0, span / INT4_LEVELS, torch.ones_like(span))
    scale, minimum = scale.half().float(), minimum.half().float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))     # a span too small for float16
    q = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS)
    return q.to(torch.uint8).reshape(n, k), scale, minimum


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, group_size: int) -> torch.Tensor:
    """(q [N, K], scale [N, K/G], minimum [N, K/G]) -> float32 [N, K]."""
    n, k = q.shape
    groups = q.float().reshape(n, k // group_size, group_size)
    return (minimum.float()[..., None] + groups * scale.float()[..., None]).reshape(n, k)


ACTIVATION_BLOCK = 32     # inputs per int8 activation scale (w4a8)


def quantize_activations_int8(x: torch.Tensor, block: int = ACTIVATION_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """float [M, K] -> (qx int8 [M, K], d float32 [M, K/block]): one symmetric scale per `block`
    inputs of a row. K must be a multiple of block (w4a8's K is a multiple of its group size).
    A block with NaN or inf keeps a NaN/inf scale, so qx * d is NaN there, as float math would be."""
    m, k = x.shape
    blocks = x.detach().float().reshape(m, k // block, block)
    largest = blocks.abs().amax(dim=-1)
    d = torch.where(largest == 0, torch.ones_like(largest), largest / INT8_MAX)   # NaN/inf: d NaN/inf
    qx = torch.round(blocks / d[..., None]).clamp(-INT8_MAX, INT8_MAX).nan_to_num(0).to(torch.int8)
    return qx.reshape(m, k), d


def fake_quantize_activations(x: torch.Tensor, block: int = ACTIVATION_BLOCK) -> torch.Tensor:
    """x rounded as w4a8 rounds it, back in float32: qx * d."""
    qx, d = quantize_activations_int8(x, block)
    m, k = x.shape
    return (qx.float().reshape(m, k // block, block) * d[..., None]).reshape(m, k)


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What every quantized linear must compute: F.linear with the dequantized weight,
    in x's dtype. (The kernels below must match this within float rounding.)"""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
